//! What nobody finished is finished by the reconciler: an authorization whose hold is
//! over is cancelled (the shopper is not charged), an order whose capture was lost is
//! captured, and an order an admin cancels is refunded once.

use std::time::Duration;

use serde_json::Value;

use super::{PRICE, SKU, assert_problem, paying_shop_with};
use crate::faults::proxy::{FaultProxy, Mode};

/// Reconciler passes every few hundred milliseconds.
fn quick(settings: &mut stockade::config::Settings) {
    settings.payment_reconcile_after = Duration::from_millis(400);
}

#[tokio::test]
async fn an_authorization_whose_hold_ended_without_an_order_is_cancelled() {
    let shop = paying_shop_with(quick).await;
    let hold = shop.hold(1).await;
    let paid = shop.pay_ok(hold, "pm_card_visa").await;
    let intent = paid["payment_intent"].as_str().unwrap().to_string();
    // The shopper walks away: the hold (extended once by paying) runs out.
    shop.end_hold(hold).await;
    shop.wait_for_intent(&intent, "canceled", Duration::from_secs(20))
        .await;
    // Only now is the shopper told nothing was charged.
    assert_problem(shop.confirm(hold).await, 409, "nothing was charged").await;
    assert_eq!(shop.app.count("select count(*) from orders").await, 0);
    assert_eq!(shop.app.stock(SKU).await, (10, 0));
    shop.assert_invariants().await;
}

#[tokio::test]
async fn an_order_whose_capture_was_lost_is_captured_by_the_reconciler() {
    let slot = std::sync::Arc::new(std::sync::Mutex::new(None::<FaultProxy>));
    let put = slot.clone();
    let shop = paying_shop_with(move |settings| {
        quick(settings);
        let front = FaultProxy::in_front_of(&settings.stripe_api_base);
        settings.stripe_api_base = front.url(&settings.stripe_api_base);
        settings.stripe_timeout = Duration::from_millis(600);
        *put.lock().unwrap() = Some(front);
    })
    .await;
    let proxy = slot.lock().unwrap().take().unwrap();
    let hold = shop.hold(1).await;
    let paid = shop.pay_ok(hold, "pm_card_visa").await;
    let intent = paid["payment_intent"].as_str().unwrap().to_string();
    // The provider stops answering between the order and its capture.
    proxy.set(Mode::Blackhole);
    let res = shop.confirm(hold).await;
    assert_eq!(res.status().as_u16(), 201, "the order stands");
    let order: Value = res.json().await.unwrap();
    assert_eq!(order["payment"]["status"], "requires_capture", "{order}");
    proxy.set(Mode::Pass);
    shop.wait_for_intent(&intent, "succeeded", Duration::from_secs(20))
        .await;
    // The reconciler records it as well as doing it.
    shop.wait_for_one(
        "the capture recorded",
        "select count(*) from payments where status = 'succeeded' and settled",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(shop.captured().await.len(), 1);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn an_admin_cancelling_a_paid_order_refunds_it_once() {
    let shop = paying_shop_with(quick).await;
    let hold = shop.hold(2).await;
    shop.pay_ok(hold, "pm_card_visa").await;
    let order: Value = shop.confirm(hold).await.json().await.unwrap();
    let id = order["id"].as_str().unwrap().to_string();
    assert_eq!(shop.app.stock(SKU).await, (8, 0));

    let csrf = shop.app.login_admin().await;
    let page = format!("/admin/orders/{id}");
    let path = format!("{page}/cancel");
    let key = crate::admin::forms::form_key(&shop.app, &page, &path).await;
    let res = shop
        .app
        .admin_post(&path, &[("csrf", &csrf), ("key", &key)])
        .await;
    assert_eq!(res.status().as_u16(), 303);
    let (_, html) = shop
        .app
        .get_text(&crate::admin::forms::location(&res))
        .await;
    assert!(html.contains("Its payment was refunded."), "{html}");

    let refunds = shop.refunds().await;
    assert_eq!(refunds.len(), 1, "{refunds:#?}");
    assert_eq!(refunds[0]["amount"], 2 * PRICE);
    assert_eq!(
        shop.app.stock(SKU).await,
        (10, 0),
        "the stock came back once"
    );
    let read = shop.order(&id).await;
    assert_eq!(read["payment"]["status"], "refunded", "{read}");
    assert_eq!(read["payment"]["refunded_cents"], 2 * PRICE);
    // The reconciler passes over it again and again: still one refund.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(shop.refunds().await.len(), 1);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_payment_the_provider_forgot_is_settled_as_cancelled_once_its_hold_ends() {
    let shop = paying_shop_with(quick).await;
    let hold = shop.hold(1).await;
    shop.pay_ok(hold, "pm_card_visa").await;
    // The provider starts empty again (localstripe restarted, as local mode does).
    let res = shop
        .provider
        .delete(format!("{}/_config/data", shop.stripe.url()))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success());
    shop.end_hold(hold).await;
    shop.wait_for_one(
        "the forgotten payment settled",
        "select count(*) from payments where status = 'canceled' and settled",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(shop.app.count("select count(*) from orders").await, 0);
    assert_eq!(shop.app.stock(SKU).await, (10, 0));
}
