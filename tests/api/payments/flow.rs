//! The shopper's way through: a hold, its one intent, a card (good, declined, 3-D
//! Secure), the order, and the capture after it.

use serde_json::Value;

use super::{PRICE, SKU, assert_problem, paying_shop};

#[tokio::test]
async fn a_paid_hold_becomes_one_order_and_is_captured_once() {
    let shop = paying_shop().await;
    let hold = shop.hold(2).await;

    // The intent first, with no card: the hold's total, from the shop's prices.
    let res = shop.pay(hold, None).await;
    assert_eq!(res.status().as_u16(), 200);
    let started: Value = res.json().await.unwrap();
    assert_eq!(started["amount_cents"], 2 * PRICE);
    assert_eq!(started["currency"], "usd");
    assert_eq!(started["status"], "requires_payment_method");
    assert!(
        started["client_secret"]
            .as_str()
            .is_some_and(|s| s.contains("_secret_"))
    );
    let intent = started["payment_intent"].as_str().unwrap().to_string();
    assert_eq!(shop.intent(&intent).await["amount"], 2 * PRICE);

    let paid = shop.pay_ok(hold, "pm_card_visa").await;
    assert_eq!(
        paid["status"], "requires_capture",
        "authorized, not captured"
    );
    assert_eq!(paid["payment_intent"], intent.as_str(), "the same intent");
    assert_eq!(shop.intent(&intent).await["status"], "requires_capture");

    let res = shop.confirm(hold).await;
    assert_eq!(res.status().as_u16(), 201);
    let order: Value = res.json().await.unwrap();
    assert_eq!(order["payment"]["status"], "succeeded", "{order}");
    assert_eq!(order["payment"]["amount_cents"], 2 * PRICE);
    assert_eq!(order["payment"]["payment_intent"], intent.as_str());
    assert_eq!(shop.intent(&intent).await["status"], "succeeded");

    // Again: the same order, and nothing more is charged.
    let res = shop.confirm(hold).await;
    assert_eq!(res.status().as_u16(), 201);
    let again: Value = res.json().await.unwrap();
    assert_eq!(again["id"], order["id"]);
    let res = shop.pay(hold, Some("pm_card_visa")).await;
    assert_eq!(
        res.status().as_u16(),
        200,
        "paying a paid hold answers its payment"
    );
    let answered: Value = res.json().await.unwrap();
    assert_eq!(answered["status"], "succeeded");

    // The order's JSON carries its payment.
    let read = shop.order(order["id"].as_str().unwrap()).await;
    assert_eq!(read["payment"]["status"], "succeeded");
    assert_eq!(shop.intents().await.len(), 1, "one intent for the hold");
    assert_eq!(shop.captured().await.len(), 1);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_hold_is_not_confirmed_until_it_is_paid() {
    let shop = paying_shop().await;
    let hold = shop.hold(1).await;
    assert_problem(shop.confirm(hold).await, 402, "no payment was started").await;
    // Started, no card yet: still 402, saying so.
    assert_eq!(shop.pay(hold, None).await.status().as_u16(), 200);
    assert_problem(shop.confirm(hold).await, 402, "no card has been accepted").await;
    assert_eq!(shop.app.count("select count(*) from orders").await, 0);
    assert_eq!(
        shop.app.stock(SKU).await,
        (10, 1),
        "the hold still holds its unit"
    );

    // A plain order is refused: orders come from paid holds here.
    assert_problem(
        shop.app.post_order("plain", &[(SKU, 1)]).await,
        402,
        "paid holds",
    )
    .await;
    assert_eq!(shop.app.count("select count(*) from orders").await, 0);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_client_marked_to_order_unpaid_places_orders_without_a_payment() {
    let shop = paying_shop().await;
    let client = async |name| {
        stockade::clients::create(&shop.app.db, name, stockade::clients::Limit::Default)
            .await
            .unwrap()
    };
    let (_, plain) = client("plain").await;
    let (marked, key) = client("invoiced-elsewhere").await;
    stockade::clients::allow_unpaid_orders(&shop.app.db, marked.id)
        .await
        .unwrap();
    let order = |key: String| {
        let shop = &shop;
        async move {
            shop.app
                .client
                .post(shop.app.url("/api/v1/orders"))
                .bearer_auth(key)
                .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
                .json(&serde_json::json!({"lines": [{"sku": SKU, "quantity": 1}]}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(order(plain).await, 402, "a client not marked");
    assert_eq!(order(key).await, 201);
    assert!(
        shop.intents().await.is_empty(),
        "nothing went to the provider"
    );
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_declined_card_is_402_and_keeps_the_hold_for_another_card() {
    let shop = paying_shop().await;
    let hold = shop.hold(1).await;
    let res = shop.pay(hold, Some("pm_card_chargeCustomerFail")).await;
    let problem = assert_problem(res, 402, "declined. Nothing was charged").await;
    assert_eq!(problem["decline_code"], "card_declined", "{problem}");
    assert_eq!(shop.app.stock(SKU).await, (10, 1), "the hold is kept");

    // Confirming now says the last card was declined.
    assert_problem(shop.confirm(hold).await, 402, "declined").await;

    // Another card pays, on an intent of its own (the declined one is cancelled).
    let paid = shop.pay_ok(hold, "pm_card_visa").await;
    assert_eq!(paid["status"], "requires_capture");
    let intents = shop.intents().await;
    assert_eq!(intents.len(), 2, "{intents:#?}");
    assert!(
        intents.iter().any(|i| i["status"] == "canceled"),
        "{intents:#?}"
    );
    assert_eq!(shop.confirm(hold).await.status().as_u16(), 201);
    assert_eq!(shop.captured().await.len(), 1);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_three_d_secure_card_is_confirmed_once_the_bank_agrees() {
    let shop = paying_shop().await;
    let hold = shop.hold(1).await;
    let card = shop.card("4000000000003220").await;
    let asked = shop.pay_ok(hold, &card).await;
    assert_eq!(asked["status"], "requires_action", "{asked}");
    let secret = asked["client_secret"].as_str().unwrap().to_string();
    let intent = asked["payment_intent"].as_str().unwrap().to_string();

    assert_problem(shop.confirm(hold).await, 402, "3-D Secure").await;

    // The shopper completes 3-D Secure in the browser (Stripe.js does this call).
    let res = shop
        .provider
        .post(format!(
            "{}/v1/payment_intents/{intent}/_authenticate",
            shop.stripe.url()
        ))
        .form(&[
            ("key", "pk_test_stockade"),
            ("client_secret", secret.as_str()),
            ("success", "true"),
        ])
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.text().await.unwrap());

    // The server asks the provider rather than trusting what it recorded.
    let res = shop.confirm(hold).await;
    assert_eq!(res.status().as_u16(), 201);
    let order: Value = res.json().await.unwrap();
    assert_eq!(order["payment"]["status"], "succeeded");
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_bad_payment_method_is_422_and_an_unknown_one_is_refused_by_the_provider() {
    let shop = paying_shop().await;
    let hold = shop.hold(1).await;
    for bad in ["tok_visa", "pm_", "pm_a b", ""] {
        let res = shop.pay(hold, Some(bad)).await;
        assert_eq!(res.status().as_u16(), 422, "{bad:?}");
    }
    let res = shop
        .app
        .client
        .post(shop.app.url(&format!("/api/v1/holds/{hold}/payment")))
        .json(&serde_json::json!({"payment_method": "pm_card_visa", "amount": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 422, "no amount from the client");
    let res = shop.pay(hold, Some("pm_no_such_method")).await;
    let status = res.status().as_u16();
    let body = res.text().await.unwrap();
    assert!(status == 422 || status == 402, "{status} {body}");
    assert!(!body.contains("Error {"), "no debug text: {body}");
    // Another caller's hold is not found.
    let other = crate::helpers::client();
    let res = other
        .post(
            shop.app
                .url(&format!("/api/v1/holds/{}/payment", uuid::Uuid::new_v4())),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 404);
    assert_eq!(shop.captured().await.len(), 0);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn the_shops_currency_is_shown_on_every_price_and_charged() {
    let shop = paying_shop().await;
    let mut env = shop.process_env(&shop.stripe.url());
    env.push(("STOCKADE_CURRENCY", "eur".into()));
    let euros = crate::helpers::serve_app(&shop.app, &env, &[]).await;
    let page = reqwest::get(format!("{}/products/{SKU}", euros.address))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("€12.50"), "{page}");
    assert!(!page.contains("$12.50"), "{page}");
    let hold = shop.hold(1).await;
    let res = shop
        .app
        .client
        .post(format!("{}/api/v1/holds/{hold}/payment", euros.address))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let started: Value = res.json().await.unwrap();
    assert_eq!(started["currency"], "eur");
    let intent = shop
        .intent(started["payment_intent"].as_str().unwrap())
        .await;
    assert_eq!(intent["currency"], "eur");
    assert_eq!(intent["amount"], PRICE);
}
