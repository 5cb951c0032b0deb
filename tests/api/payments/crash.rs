//! A process killed (SIGKILL) halfway through a payment: between the authorization and
//! its order, and between the order and its capture. Another process finishes it, once;
//! and a hold that runs out while 3-D Secure is open is not charged.

use std::time::{Duration, Instant};

use crate::faults::proxy::{FaultProxy, Mode};
use crate::helpers::serve_app;

use super::{PayingShop, assert_problem, paying_shop_with, until};

/// The in-process app's reconciler looks every few hundred milliseconds.
fn quick(settings: &mut stockade::config::Settings) {
    settings.payment_reconcile_after = Duration::from_millis(400);
}

/// A second `stockade serve` process of `shop`, paying through `proxy`, patient with it.
async fn victim(
    shop: &PayingShop,
    proxy: &FaultProxy,
) -> stockade::loadtest::servers::ServerProcess {
    let mut env = shop.process_env(&proxy.url(&shop.stripe.url()));
    env.extend([
        ("STOCKADE_STRIPE_TIMEOUT_MS", "30000".to_string()),
        ("STOCKADE_REQUEST_BUDGET_MS", "30000".into()),
        // As the shop's other process (a payment's next look is set by whoever acts).
        ("STOCKADE_PAYMENT_RECONCILE_MS", "400".into()),
    ]);
    serve_app(&shop.app, &env, &[]).await
}

#[tokio::test]
async fn a_process_killed_between_the_order_and_its_capture_leaves_the_capture_to_another() {
    let shop = paying_shop_with(quick).await;
    let proxy = FaultProxy::in_front_of(&shop.stripe.url());
    let mut victim = victim(&shop, &proxy).await;
    let hold = shop.hold(1).await;
    let paid = shop.pay_ok(hold, "pm_card_visa").await;
    let intent = paid["payment_intent"].as_str().unwrap().to_string();

    // The victim commits the order, then waits on a provider that swallows the capture.
    proxy.set(Mode::Blackhole);
    let url = format!("{}/api/v1/holds/{hold}/confirm", victim.address);
    let pending = tokio::spawn(async move {
        let client = crate::helpers::client();
        super::patiently(|| client.post(&url).send()).await
    });
    until("the victim's order", Duration::from_secs(20), || async {
        shop.app.count("select count(*) from orders").await == 1
    })
    .await;
    victim.kill9();
    let _ = pending.await;
    assert_eq!(shop.intent(&intent).await["status"], "requires_capture");

    // The other process captures it once the victim's lease has lapsed.
    shop.wait_for_intent(&intent, "succeeded", Duration::from_secs(30))
        .await;
    shop.wait_for_one(
        "the capture's record",
        "select count(*) from payments where status = 'succeeded' and settled",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(shop.app.count("select count(*) from orders").await, 1);
    assert_eq!(shop.captured().await.len(), 1);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_process_killed_between_the_authorization_and_its_record_charges_once() {
    let shop = paying_shop_with(quick).await;
    let proxy = FaultProxy::in_front_of(&shop.stripe.url());
    let mut victim = victim(&shop, &proxy).await;
    let hold = shop.hold(1).await;
    assert_eq!(shop.pay(hold, None).await.status().as_u16(), 200);
    let intent = stockade::payments::all_payments(&shop.app.db)
        .await
        .unwrap()[0]
        .intent()
        .to_string();

    // Every chunk to and from the provider takes a second: the victim is killed after
    // the provider authorized the card and before its answer arrives.
    proxy.set(Mode::Delay(Duration::from_secs(1)));
    let url = format!("{}/api/v1/holds/{hold}/payment", victim.address);
    let pending = tokio::spawn(async move {
        let client = crate::helpers::client();
        let body = serde_json::json!({"payment_method": "pm_card_visa"});
        super::patiently(|| client.post(&url).json(&body).send()).await
    });
    shop.wait_for_intent(&intent, "requires_capture", Duration::from_secs(30))
        .await;
    victim.kill9();
    let _ = pending.await;
    proxy.set(Mode::Pass);
    assert_ne!(
        shop.app
            .count("select count(*) from payments where status = 'requires_capture'")
            .await,
        1,
        "the victim died before recording the authorization"
    );

    // The shopper comes back: once the victim's lease lapses, the payment is read from
    // the provider and the hold confirmed, charged once.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = shop.confirm(hold).await;
        match res.status().as_u16() {
            201 => break,
            409 => assert!(Instant::now() < deadline, "the lease never lapsed"),
            other => panic!("confirm answered {other}: {}", res.text().await.unwrap()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(shop.intent(&intent).await["status"], "succeeded");
    assert_eq!(shop.captured().await.len(), 1);
    assert_eq!(shop.app.count("select count(*) from orders").await, 1);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_hold_that_runs_out_while_3d_secure_is_open_is_not_charged() {
    let shop = paying_shop_with(quick).await;
    let hold = shop.hold(1).await;
    let card = shop.card("4000000000003220").await;
    let asked = shop.pay_ok(hold, &card).await;
    assert_eq!(asked["status"], "requires_action");
    let intent = asked["payment_intent"].as_str().unwrap().to_string();
    shop.end_hold(hold).await;
    shop.wait_for_intent(&intent, "canceled", Duration::from_secs(20))
        .await;
    // The bank's answer comes too late: the intent is cancelled, nothing is charged.
    let res = shop
        .provider
        .post(format!(
            "{}/v1/payment_intents/{intent}/_authenticate",
            shop.stripe.url()
        ))
        .form(&[
            ("key", "pk_test_stockade"),
            ("client_secret", asked["client_secret"].as_str().unwrap()),
            ("success", "true"),
        ])
        .send()
        .await
        .unwrap();
    assert!(
        !res.status().is_success(),
        "a cancelled intent cannot be authenticated"
    );
    assert_problem(shop.confirm(hold).await, 409, "nothing was charged").await;
    assert_eq!(shop.captured().await.len(), 0);
    assert_eq!(shop.app.count("select count(*) from orders").await, 0);
    shop.assert_invariants().await;
}
