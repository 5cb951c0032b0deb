//! Paying at checkout in Chromium, with the Stripe.js that localstripe serves: a
//! declined card then a good one (pay pressed twice), and a card whose bank asks for
//! 3-D Secure. One order and one charge each.

use fantoccini::{Client, Locator};

use super::save_screenshot;
use crate::helpers::browser;
use crate::payments::{PayingShop, SKU, paying_shop};

/// From the product page to the checkout's card form, with name and email filled in.
async fn to_checkout(shop: &PayingShop, b: &Client) {
    b.goto(&shop.app.url(&format!("/products/{SKU}")))
        .await
        .unwrap();
    b.find(Locator::Id("add-to-cart"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait().for_element(Locator::Id("checkout")).await.unwrap();
    b.find(Locator::Id("checkout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait()
        .for_element(Locator::Css("#card-element input"))
        .await
        .unwrap();
    super::fill_details(b, "grace@example.com").await;
}

/// Types a card into the card form (localstripe's stand-in draws plain fields).
async fn type_card(b: &Client, number: &str) {
    for (field, value) in [
        ("number", number),
        ("exp_month", "12"),
        ("exp_year", "34"),
        ("cvc", "123"),
    ] {
        let input = b
            .find(Locator::Css(&format!(
                "#card-element input[placeholder={field}]"
            )))
            .await
            .unwrap();
        input.clear().await.unwrap();
        input.send_keys(value).await.unwrap();
    }
}

#[tokio::test]
async fn a_shopper_pays_after_a_declined_card_and_a_double_click_is_charged_once() {
    let shop = paying_shop().await;
    let b = browser().await;
    to_checkout(&shop, &b).await;
    // The shop's own markup around the card form passes axe-core (the fields inside
    // #card-element are the provider's: Stripe draws them in a labelled frame of its own).
    let found = super::axe::violations_except(&b, Some("#card-element")).await;
    let blocking: Vec<String> = found
        .iter()
        .filter(|v| v.blocks())
        .map(|v| v.to_string())
        .collect();
    assert!(blocking.is_empty(), "{blocking:#?}");
    type_card(&b, "4000000000000341").await;
    b.find(Locator::Id("place-order"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let errors = b.find(Locator::Id("card-errors")).await.unwrap();
    let mut said = String::new();
    for _ in 0..200 {
        said = errors.text().await.unwrap();
        if !said.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(said.contains("declined"), "{said}");
    b.set_window_size(1280, 900).await.unwrap();
    save_screenshot(&b, "checkout-declined.png").await;
    b.set_window_size(390, 844).await.unwrap();
    save_screenshot(&b, "checkout-declined-phone.png").await;
    b.set_window_size(1280, 900).await.unwrap();

    type_card(&b, "4242424242424242").await;
    b.execute(
        "const b = document.getElementById('place-order'); b.click(); b.click();",
        vec![],
    )
    .await
    .unwrap();
    b.wait().for_element(Locator::Id("order-id")).await.unwrap();
    save_screenshot(&b, "order-paid.png").await;
    b.set_window_size(390, 844).await.unwrap();
    save_screenshot(&b, "order-paid-phone.png").await;
    assert_eq!(shop.app.count("select count(*) from orders").await, 1);
    assert_eq!(shop.captured().await.len(), 1);
    b.close().await.unwrap();
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_shopper_whose_bank_asks_for_3d_secure_confirms_it_and_orders() {
    let shop = paying_shop().await;
    let b = browser().await;
    to_checkout(&shop, &b).await;
    type_card(&b, "4000000000003220").await;
    b.find(Locator::Id("place-order"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The bank's question, as localstripe's Stripe.js asks it.
    let confirm = b
        .wait()
        .for_element(Locator::XPath("//button[text()='Complete authentication']"))
        .await
        .unwrap();
    save_screenshot(&b, "checkout-3ds.png").await;
    confirm.click().await.unwrap();
    b.wait().for_element(Locator::Id("order-id")).await.unwrap();
    assert_eq!(shop.captured().await.len(), 1);
    b.close().await.unwrap();
    shop.assert_invariants().await;
}
