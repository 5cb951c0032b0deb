//! Paying under pressure and faults: presses that race, a provider that does not answer
//! (in front of it, the fault proxy), Redis gone. However it goes, one charge per hold.

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::Value;

use super::{SKU, assert_problem, paying_shop, paying_shop_with};
use crate::faults::proxy::{FaultProxy, Mode};

#[tokio::test]
async fn pay_pressed_many_times_at_once_makes_one_intent_and_one_charge() {
    let shop = paying_shop().await;
    let hold = shop.hold(1).await;
    // Eight presses of "Pay" (two tabs, double clicks) at once.
    let pays = join_all((0..8).map(|_| shop.pay(hold, Some("pm_card_visa")))).await;
    let mut statuses: Vec<u16> = pays.iter().map(|r| r.status().as_u16()).collect();
    statuses.sort();
    assert!(statuses.contains(&200), "{statuses:?}");
    for res in pays {
        let status = res.status().as_u16();
        if status == 409 {
            assert!(res.headers().contains_key("retry-after"));
            let problem: Value = res.json().await.unwrap();
            assert!(
                problem["detail"]
                    .as_str()
                    .unwrap()
                    .contains("being processed"),
                "{problem}"
            );
        } else {
            assert_eq!(status, 200, "only 200 or 409: {statuses:?}");
        }
    }
    let intents = shop.intents().await;
    let confirmed: Vec<&Value> = intents
        .iter()
        .filter(|i| i["status"] != "requires_payment_method")
        .collect();
    assert_eq!(
        intents.len(),
        1,
        "one intent made for the hold: {intents:#?}"
    );
    assert_eq!(confirmed.len(), 1, "one intent paid: {intents:#?}");

    // And the confirmation pressed as often: one order, one capture.
    let confirms = join_all((0..8).map(|_| shop.confirm(hold))).await;
    let mut orders = Vec::new();
    for res in confirms {
        match res.status().as_u16() {
            201 => orders.push(res.json::<Value>().await.unwrap()["id"].clone()),
            409 => {}
            other => panic!("confirm answered {other}: {}", res.text().await.unwrap()),
        }
    }
    assert!(!orders.is_empty());
    assert!(
        orders.iter().all(|o| *o == orders[0]),
        "one order: {orders:?}"
    );
    assert_eq!(shop.app.count("select count(*) from orders").await, 1);
    assert_eq!(shop.captured().await.len(), 1);
    shop.assert_invariants().await;
}

/// A shop whose provider is behind a fault proxy, with calls that time out after `timeout`.
async fn shop_behind_proxy(timeout: Duration) -> (super::PayingShop, FaultProxy) {
    let proxy = std::sync::Arc::new(std::sync::Mutex::new(None::<FaultProxy>));
    let slot = proxy.clone();
    let shop = paying_shop_with(move |settings| {
        let front = FaultProxy::in_front_of(&settings.stripe_api_base);
        settings.stripe_api_base = front.url(&settings.stripe_api_base);
        settings.stripe_timeout = timeout;
        *slot.lock().unwrap() = Some(front);
    })
    .await;
    let proxy = proxy.lock().unwrap().take().unwrap();
    (shop, proxy)
}

#[tokio::test]
async fn a_provider_that_does_not_answer_gives_503_keeps_the_hold_and_a_retry_charges_once() {
    let (shop, proxy) = shop_behind_proxy(Duration::from_millis(800)).await;
    let hold = shop.hold(1).await;

    // Down while the intent is made: 503 with Retry-After, the hold kept.
    proxy.set(Mode::Refuse);
    let res = shop.pay(hold, Some("pm_card_visa")).await;
    assert_eq!(res.status().as_u16(), 503);
    assert!(res.headers().contains_key("retry-after"));
    let problem: Value = res.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("did not answer"),
        "{problem}"
    );
    assert_eq!(shop.app.stock(SKU).await, (10, 1), "the hold is kept");

    // Swallowed while paying: the answer is lost (ambiguous), so the retry asks first.
    proxy.set(Mode::Pass);
    assert_eq!(shop.pay(hold, None).await.status().as_u16(), 200);
    proxy.set(Mode::Blackhole);
    let res = shop.pay(hold, Some("pm_card_visa")).await;
    assert_eq!(res.status().as_u16(), 503, "{}", res.text().await.unwrap());
    proxy.set(Mode::Pass);
    let paid = shop.pay_ok(hold, "pm_card_visa").await;
    assert_eq!(paid["status"], "requires_capture");

    // Swallowed while capturing: the order stands, the capture is finished later.
    proxy.set(Mode::Blackhole);
    let res = shop.confirm(hold).await;
    let status = res.status().as_u16();
    let body = res.text().await.unwrap();
    assert!(status == 201 || status == 503, "{status} {body}");
    proxy.set(Mode::Pass);
    let res = shop.confirm(hold).await;
    assert_eq!(res.status().as_u16(), 201);
    let order: Value = res.json().await.unwrap();
    assert_eq!(order["payment"]["status"], "succeeded", "{order}");
    let paid: Vec<Value> = shop
        .intents()
        .await
        .into_iter()
        .filter(|i| i["status"] != "requires_payment_method")
        .collect();
    assert_eq!(paid.len(), 1, "one intent charged: {paid:#?}");
    assert_eq!(shop.app.count("select count(*) from orders").await, 1);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_second_finisher_meeting_the_lease_is_told_409_and_nothing_is_charged() {
    let shop = paying_shop().await;
    let hold = shop.hold(1).await;
    assert_eq!(shop.pay(hold, None).await.status().as_u16(), 200);
    // Another finisher holds the lease: the second meets it.
    let intent = stockade::payments::all_payments(&shop.app.db)
        .await
        .unwrap()[0]
        .intent()
        .to_string();
    let mut redis = shop.app.redis().await;
    let key = format!("{}payment:{intent}", shop.app.settings.redis_prefix);
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    let res = shop.pay(hold, Some("pm_card_visa")).await;
    assert_eq!(res.status().as_u16(), 409);
    assert_eq!(
        shop.intent(&intent).await["status"],
        "requires_payment_method"
    );
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        shop.pay_ok(hold, "pm_card_visa").await["status"],
        "requires_capture"
    );
    shop.assert_invariants().await;
}

#[tokio::test]
async fn without_redis_no_payment_is_finished_and_nothing_is_charged() {
    let mut shop = super::paying_shop_with_own_redis().await;
    let hold = shop.hold(1).await;
    assert_eq!(shop.pay(hold, None).await.status().as_u16(), 200);
    let intent = stockade::payments::all_payments(&shop.app.db)
        .await
        .unwrap()[0]
        .intent()
        .to_string();
    shop.app.stop_redis();
    let res = shop.pay(hold, Some("pm_card_visa")).await;
    assert!(res.headers().contains_key("retry-after"));
    assert_problem(res, 503, "nothing was charged by this request").await;
    assert_eq!(
        shop.intent(&intent).await["status"],
        "requires_payment_method"
    );
    assert_problem(shop.confirm(hold).await, 503, "nothing was charged").await;
    assert_eq!(shop.app.count("select count(*) from orders").await, 0);

    shop.app.restart_redis().await;
    shop.app.assert_leases_back_within_a_second().await;
    // Paid once Redis answers again (a client retries a 503 after its Retry-After).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let res = shop.pay(hold, Some("pm_card_visa")).await;
        if res.status().as_u16() != 503 || std::time::Instant::now() > deadline {
            assert_eq!(res.status().as_u16(), 200, "{}", res.text().await.unwrap());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(
        shop.app
            .count("select count(*) from payments where status = 'requires_capture'")
            .await,
        1
    );
    assert_eq!(shop.confirm(hold).await.status().as_u16(), 201);
    assert_eq!(shop.captured().await.len(), 1);
    shop.assert_invariants().await;
}
