//! `POST /webhooks/stripe`: signed as Stripe signs, deduplicated by event id, read as a
//! prompt only (the intent is asked for), never a 500.

use serde_json::{Value, json};
use stockade::payments::webhook::sign;

use super::{WEBHOOK_SECRET, paying_shop};

async fn deliver(shop: &super::PayingShop, body: &str, signature: &str) -> (u16, String) {
    let res = shop
        .app
        .client
        .post(shop.app.url("/webhooks/stripe"))
        .header("Content-Type", "application/json")
        .header("Stripe-Signature", signature)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

fn event(id: &str, intent: &str) -> String {
    json!({
        "id": id,
        "object": "event",
        "type": "payment_intent.succeeded",
        "data": {"object": {"id": intent, "object": "payment_intent", "status": "succeeded"}}
    })
    .to_string()
}

#[tokio::test]
async fn forged_stale_and_replayed_events_are_refused_and_duplicates_change_nothing() {
    let shop = paying_shop().await;
    let hold = shop.hold(1).await;
    let paid = shop.pay_ok(hold, "pm_card_visa").await;
    let intent = paid["payment_intent"].as_str().unwrap().to_string();
    let now = chrono::Utc::now().timestamp();
    let body = event("evt_test_1", &intent);

    // Forged: another secret, no signature, or a body changed after signing.
    let forged = sign("whsec_someone_else", body.as_bytes(), now);
    assert_eq!(deliver(&shop, &body, &forged).await.0, 400);
    assert_eq!(deliver(&shop, &body, "").await.0, 400);
    let signed = sign(WEBHOOK_SECRET, body.as_bytes(), now);
    let changed = event("evt_test_1", "pi_someone_elses");
    assert_eq!(deliver(&shop, &changed, &signed).await.0, 400);
    // Replayed ten minutes later: its signature's time is stale.
    let old = sign(WEBHOOK_SECRET, body.as_bytes(), now - 600);
    let (status, text) = deliver(&shop, &body, &old).await;
    assert_eq!(status, 400);
    assert!(text.contains("five minutes"), "{text}");
    // Not JSON, though signed.
    let junk = "not an event";
    assert_eq!(
        deliver(&shop, junk, &sign(WEBHOOK_SECRET, junk.as_bytes(), now))
            .await
            .0,
        400
    );

    // A true event that says "succeeded" while the intent is only authorized: the
    // intent is read, so nothing is recorded as captured.
    let (status, _) = deliver(&shop, &body, &signed).await;
    assert_eq!(status, 200);
    assert_eq!(
        shop.app
            .count("select count(*) from payments where status = 'succeeded'")
            .await,
        0,
        "the event's word is not taken"
    );
    // The same event again: seen.
    let (status, text) = deliver(&shop, &body, &signed).await;
    assert_eq!(status, 200);
    assert!(text.contains("duplicate"), "{text}");
    // An intent that is not this shop's: 200, nothing to do.
    let other = event("evt_test_2", "pi_not_ours");
    let (status, _) = deliver(&shop, &other, &sign(WEBHOOK_SECRET, other.as_bytes(), now)).await;
    assert_eq!(status, 200);

    assert_eq!(shop.confirm(hold).await.status().as_u16(), 201);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn the_providers_own_events_arrive_signed_and_settle_the_payment() {
    let shop = paying_shop().await;
    let hold = shop.hold(1).await;
    // A declined card, then a good one, then the order: localstripe sends
    // payment_intent.payment_failed and payment_intent.succeeded, signed.
    let res = shop.pay(hold, Some("pm_card_chargeCustomerFail")).await;
    assert_eq!(res.status().as_u16(), 402);
    shop.pay_ok(hold, "pm_card_visa").await;
    let order: Value = shop.confirm(hold).await.json().await.unwrap();
    assert_eq!(order["payment"]["status"], "succeeded");
    shop.app
        .wait_for_a_row(
            "select count(*) from payment_events where type = 'payment_intent.payment_failed'",
        )
        .await;
    shop.app
        .wait_for_a_row(
            "select count(*) from payment_events where type = 'payment_intent.succeeded'",
        )
        .await;
    assert_eq!(
        shop.app
            .count("select count(*) from payments where settled")
            .await,
        1
    );
    shop.assert_invariants().await;
}
