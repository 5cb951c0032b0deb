//! A shopper's pages: browsing, checking out, holds counting down.

use fantoccini::Locator;

use super::{body_text, save_screenshot};
use crate::helpers::{browser, spawn_app};

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
    super::fill_details(&b, "grace@example.com").await;
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

    // Back to the checkout. Checkout pages are `no-store`, so the browser asks again and
    // is sent to the order; a form kept anyway would be submitted again.
    b.back().await.unwrap();
    b.wait()
        .for_element(Locator::Css("#place-order, #order-id"))
        .await
        .unwrap();
    let shown = b
        .find(Locator::Css("#place-order, #order-id"))
        .await
        .unwrap();
    if shown.attr("id").await.unwrap().as_deref() == Some("place-order") {
        shown.click().await.unwrap();
    }
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

#[tokio::test]
async fn a_hold_counts_down_reserves_the_last_unit_and_releases_it() {
    let app = spawn_app().await;
    app.add_product("LAST-DROP", "The last one", 9_900, 1).await;
    let first = browser().await;
    first.goto(&app.url("/products/LAST-DROP")).await.unwrap();
    first
        .find(Locator::Id("add-to-cart"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    first
        .wait()
        .for_element(Locator::Id("checkout"))
        .await
        .unwrap();
    first
        .find(Locator::Id("checkout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let timer = first
        .wait()
        .for_element(Locator::Id("time-left"))
        .await
        .unwrap();
    let t1 = timer.text().await.unwrap();
    // It ticks each second; a starved page may tick late, so wait for the change.
    let changed_by = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let t2 = loop {
        let t = timer.text().await.unwrap();
        if t != t1 || std::time::Instant::now() > changed_by {
            break t;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let secs = |t: &str| {
        let (m, s) = t.split_once(':').unwrap();
        m.parse::<i64>().unwrap() * 60 + s.parse::<i64>().unwrap()
    };
    assert!(
        secs(&t1) >= 590 && secs(&t2) < secs(&t1),
        "counting down: {t1} then {t2}"
    );

    // Meanwhile another shopper sees it sold out.
    let second = browser().await;
    second.goto(&app.url("/products/LAST-DROP")).await.unwrap();
    let badge = second
        .find(Locator::Id("stock-badge"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(badge, "Sold out");

    // The first shopper leaves; the unit is back for the second.
    first
        .find(Locator::Id("cancel-checkout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    first
        .wait()
        .for_url(&url::Url::parse(&app.url("/cart")).unwrap())
        .await
        .unwrap();
    second.refresh().await.unwrap();
    let badge = second
        .find(Locator::Id("stock-badge"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(badge, "Only 1 left");

    // The second checks out and places the order.
    second
        .find(Locator::Id("add-to-cart"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    second
        .wait()
        .for_element(Locator::Id("checkout"))
        .await
        .unwrap();
    second
        .find(Locator::Id("checkout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    second
        .wait()
        .for_element(Locator::Id("place-order"))
        .await
        .unwrap();
    second
        .find(Locator::Id("name"))
        .await
        .unwrap()
        .send_keys("Lin")
        .await
        .unwrap();
    second
        .find(Locator::Id("email"))
        .await
        .unwrap()
        .send_keys("lin@example.com")
        .await
        .unwrap();
    super::fill_address(&second).await;
    second
        .find(Locator::Id("place-order"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    second
        .wait()
        .for_element(Locator::Id("order-id"))
        .await
        .unwrap();
    assert!(body_text(&second).await.contains("Thank you, Lin!"));
    assert_eq!(app.stock("LAST-DROP").await, (0, 0));
    app.assert_invariants().await;
    first.close().await.unwrap();
    second.close().await.unwrap();
}
