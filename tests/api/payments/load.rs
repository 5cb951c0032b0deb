//! `stockade loadtest --payments` against a paying shop: every order is charged once,
//! nothing else is charged, and I9 holds.

use super::{PayingShop, paying_shop};

/// The load test's arguments against `shop`, paying through its localstripe, then `more`.
fn paying(shop: &PayingShop, more: &[&str]) -> stockade::loadtest::LoadtestArgs {
    let url = shop.stripe.url();
    let mut all = vec![
        "--payments",
        "--stripe-api-base",
        &url,
        "--stripe-secret-key",
        "sk_test_stockade",
        "--publishable-key",
        "pk_test_stockade",
    ];
    all.extend(more);
    crate::loadtest::args(&shop.app, std::slice::from_ref(&shop.app.address), &all)
}

#[tokio::test]
async fn a_paying_flash_sale_charges_each_order_once_and_nothing_else() {
    let shop: PayingShop = paying_shop().await;
    let args = paying(
        &shop,
        &[
            "--declined-share",
            "0.2",
            "--3ds-share",
            "0.2",
            "--stock",
            "15",
            "--buyers",
            "50",
            "--concurrency",
            "10",
        ],
    );
    let report = stockade::loadtest::run_report(&args).await.unwrap();
    let run = &report.runs[0];
    assert!(run.passed(), "{:#?}", run.verdicts);
    assert!(run.verdicts.iter().any(|v| v.id == "I9" && v.pass));
    let tally = run.payments.as_ref().expect("the payments' figures");
    assert_eq!(tally.paid_orders, 15, "{tally:?} {:?}", run.result.outcomes);
    assert_eq!(tally.captured, 15, "{tally:?}");
    assert_eq!(run.result.orders_acknowledged, 15);
    assert!(tally.declined > 0, "{tally:?}");
    assert!(
        run.result.outcomes.contains_key("3ds-asked"),
        "{:?}",
        run.result.outcomes
    );
    assert_eq!(shop.captured().await.len(), 15);
    shop.assert_invariants().await;
}

#[tokio::test]
async fn a_paying_drop_charges_each_admitted_shopper_once_and_refuses_every_misuse() {
    // Every shopper comes from 127.0.0.1: no cap on places per address.
    let shop: PayingShop = super::paying_shop_with(|s| s.drop_places_per_address = 0).await;
    let args = paying(
        &shop,
        &[
            "--scenario",
            "drop",
            "--queueing",
            "fifo",
            "--stock",
            "20",
            "--prequeue-seconds",
            "2",
            "--prequeue-shoppers",
            "30",
            "--later-shoppers",
            "10",
            "--join-rate",
            "20",
            "--admit-per-minute",
            "2400",
            "--misbehave-share",
            "0.2",
            "--duration",
            "30",
        ],
    );
    let report = stockade::loadtest::run_report(&args).await.unwrap();
    let run = &report.runs[0];
    assert!(run.passed(), "{:#?}", run.verdicts);
    assert!(run.verdicts.iter().any(|v| v.id == "I9" && v.pass));
    assert!(
        run.verdicts
            .iter()
            .any(|v| v.id == "I8" && v.pass && v.not_applicable.is_none())
    );
    let drop = run.drop.as_ref().expect("a drop section");
    let summary = stockade::loadtest::drop::summary(&run.strategy, drop);
    // Every unit sold to an admitted shopper who paid; every misuse refused at the hold.
    assert_eq!(drop.orders, 20, "{summary}");
    assert!(drop.misuse_tried >= 2, "{summary}");
    assert_eq!(drop.misuse_accepted, 0, "{summary}");
    let tally = run.payments.as_ref().expect("the payments' figures");
    assert_eq!((tally.paid_orders, tally.captured), (20, 20), "{tally:?}");
    assert_eq!(shop.captured().await.len(), 20);
    shop.assert_invariants().await;
}
