//! Every page fits a phone and a desktop; the README's screenshots.

use fantoccini::Locator;

use super::{log_in, save_screenshot};
use crate::helpers::{browser, spawn_app};

#[tokio::test]
async fn every_page_fits_a_phone_and_a_desktop() {
    let app = spawn_app().await;
    app.seed_demo().await;
    stockade::admin::create_admin(
        &app.db,
        crate::helpers::ADMIN_USER,
        crate::helpers::ADMIN_PASSWORD,
    )
    .await
    .unwrap();
    let order: serde_json::Value = app
        .post_order("fit-order", &[("CB-BRAID-2M", 1), ("MS-DRIFT-WL", 2)])
        .await
        .json()
        .await
        .unwrap();
    let order = order["id"].as_str().unwrap().to_string();
    let hold: serde_json::Value = app
        .client
        .post(app.url("/api/v1/holds"))
        .header("Idempotency-Key", "fit-hold")
        .json(
            &serde_json::json!({"lines": [{"sku": "LT-ARC-LAMP", "quantity": 1},
                                            {"sku": "CF-BEANS-ETH", "quantity": 3}]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let hold = hold["id"].as_str().unwrap().to_string();

    let b = browser().await;
    // A cart with lines, and an admin session.
    for sku in ["CB-BRAID-2M", "DM-WALNUT-90"] {
        b.goto(&app.url(&format!("/products/{sku}"))).await.unwrap();
        b.find(Locator::Id("add-to-cart"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        b.wait()
            .for_element(Locator::Css("table.lines"))
            .await
            .unwrap();
    }
    b.goto(&app.url("/admin")).await.unwrap();
    log_in(&b).await;
    b.wait().for_element(Locator::Css(".stats")).await.unwrap();

    let pages = [
        "/".to_string(),
        "/?q=coffee&category=Coffee&sort=price-high".into(),
        "/products/CB-BRAID-2M".into(),
        "/cart".into(),
        format!("/checkout/{hold}"),
        format!("/orders/{order}"),
        "/admin".into(),
        "/admin/products".into(),
        "/admin/products/new".into(),
        "/admin/products/KB-ALPINE-75".into(),
        "/admin/products/KB-ALPINE-75/ledger".into(),
        "/admin/orders".into(),
        format!("/admin/orders/{order}"),
        "/admin/holds".into(),
        "/admin/api-clients".into(),
        "/admin/webhooks".into(),
        "/admin/deliveries".into(),
    ];
    let mut wider = Vec::new();
    for (width, height) in [(390, 844), (1280, 900)] {
        b.set_window_size(width, height).await.unwrap();
        for page in &pages {
            b.goto(&app.url(page)).await.unwrap();
            let sizes = b
                .execute(
                    "return [document.documentElement.scrollWidth, window.innerWidth];",
                    vec![],
                )
                .await
                .unwrap();
            let (scroll, inner) = (sizes[0].as_f64().unwrap(), sizes[1].as_f64().unwrap());
            assert!(
                inner <= f64::from(width),
                "{page}: the window is {inner} px wide"
            );
            if scroll > inner {
                wider.push(format!("{page} at {width} px: {scroll} px wide"));
            }
            // The README's screenshots: each page on a phone and on a desktop.
            let shown = match page.as_str() {
                "/" => Some("catalogue"),
                "/products/CB-BRAID-2M" => Some("product"),
                "/cart" => Some("cart"),
                "/admin" => Some("dashboard"),
                checkout if checkout.starts_with("/checkout/") => Some("checkout"),
                _ => None,
            };
            if let Some(name) = shown {
                let device = if width == 390 { "phone" } else { "desktop" };
                save_screenshot(&b, &format!("{name}-{device}.png")).await;
            }
        }
    }
    b.set_window_size(1280, 900).await.unwrap();
    b.close().await.unwrap();
    assert!(wider.is_empty(), "wider than the screen: {wider:#?}");
}
