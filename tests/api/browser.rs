//! Pages in a real headless Chromium.

use fantoccini::Locator;

use crate::helpers::{browser, docs_dir, spawn_app};

#[tokio::test]
async fn a_shopper_browses_from_the_catalogue_to_a_product() {
    let app = spawn_app().await;
    app.seed_demo().await;
    let b = browser().await;
    b.goto(&app.url("/")).await.unwrap();
    assert_eq!(b.title().await.unwrap(), "Catalogue · Stockade");
    save_screenshot(&b, "catalogue.png").await;

    b.find(Locator::Css("a.card-link[href=\"/products/KB-DROP-ORCA\"]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait()
        .for_element(Locator::Css("h1.product-name"))
        .await
        .unwrap();
    assert!(
        b.current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/products/KB-DROP-ORCA")
    );
    let name = b
        .find(Locator::Css("h1.product-name"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(name, "Orca Limited Edition Keyboard");
    let price = b
        .find(Locator::Css(".price-large"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(price, "$349.00");
    let badge = b
        .find(Locator::Id("stock-badge"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(badge, "Only 3 left");
    // The stylesheet loaded (served by the app, allowed by the CSP).
    let header_bg = b
        .execute(
            "return getComputedStyle(document.querySelector('.site-header')).backgroundColor",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(header_bg, "rgb(31, 58, 52)");
    b.close().await.unwrap();
}

/// Saves under `target/screenshots/`, and into `docs/` when `UPDATE_DOCS_SCREENSHOTS=1`.
pub async fn save_screenshot(b: &fantoccini::Client, name: &str) {
    let png = b.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG image");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), &png).unwrap();
    if std::env::var("UPDATE_DOCS_SCREENSHOTS").as_deref() == Ok("1") {
        std::fs::create_dir_all(docs_dir()).unwrap();
        std::fs::write(docs_dir().join(name), &png).unwrap();
    }
}

#[tokio::test]
async fn a_shopper_checks_out_double_clicks_goes_back_and_resubmits_yet_orders_once() {
    let app = spawn_app().await;
    app.seed_demo().await;
    let b = browser().await;
    for (sku, quantity) in [("MS-DRIFT-WL", "2"), ("NB-DOT-A5", "1")] {
        b.goto(&app.url(&format!("/products/{sku}"))).await.unwrap();
        let field = b.find(Locator::Id("quantity")).await.unwrap();
        field.clear().await.unwrap();
        field.send_keys(quantity).await.unwrap();
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
    let cart_link = b
        .find(Locator::Id("cart-link"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(cart_link, "Cart 3");
    b.find(Locator::Id("checkout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait()
        .for_element(Locator::Id("place-order"))
        .await
        .unwrap();
    b.find(Locator::Id("name"))
        .await
        .unwrap()
        .send_keys("Grace")
        .await
        .unwrap();
    b.find(Locator::Id("email"))
        .await
        .unwrap()
        .send_keys("grace@example.com")
        .await
        .unwrap();
    save_screenshot(&b, "checkout.png").await;

    // Double click: two clicks as fast as the page allows.
    b.execute(
        "const b = document.getElementById('place-order'); b.click(); b.click();",
        vec![],
    )
    .await
    .unwrap();
    b.wait().for_element(Locator::Id("order-id")).await.unwrap();
    let first_id = b
        .find(Locator::Id("order-id"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let total = b
        .find(Locator::Id("order-total"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(total, "$180.00");
    save_screenshot(&b, "order.png").await;

    // Back to the filled-in form, and submit it again.
    b.back().await.unwrap();
    b.wait()
        .for_element(Locator::Id("place-order"))
        .await
        .unwrap();
    b.find(Locator::Id("place-order"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait().for_element(Locator::Id("order-id")).await.unwrap();
    let second_id = b
        .find(Locator::Id("order-id"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(first_id, second_id, "the same order is shown");

    assert_eq!(app.count("select count(*) from orders").await, 1);
    assert_eq!(app.stock("MS-DRIFT-WL").await.0, 118);
    app.assert_invariants().await;
    b.close().await.unwrap();
}
