//! `stockade loadtest --payments` against a paying shop: every order is charged once,
//! nothing else is charged, and I9 holds.

use super::{PayingShop, paying_shop};

#[tokio::test]
async fn a_paying_flash_sale_charges_each_order_once_and_nothing_else() {
    let shop: PayingShop = paying_shop().await;
    let url = shop.stripe.url();
    let args = crate::loadtest::args(
        &shop.app,
        std::slice::from_ref(&shop.app.address),
        &[
            "--payments",
            "--stripe-api-base",
            &url,
            "--stripe-secret-key",
            "sk_test_stockade",
            "--publishable-key",
            "pk_test_stockade",
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
