//! A request cut off by its budget has been answered: whatever still works for it may
//! finish a commit it already sent, but must not start a transaction. Here the SKU's
//! lease is held elsewhere past the request's budget, so the order gets its lease only
//! after its client was told 503.

use std::time::{Duration, Instant};

use stockade::config::{OrderStrategy, Settings};

use crate::helpers::{TestApp, spawn_app_with, test_settings};

/// Waits until the app's metrics count one order request that ended `busy` (the 503's
/// work has finished, one way or the other).
async fn until_the_request_ends(app: &TestApp) {
    let started = Instant::now();
    while !app
        .metrics()
        .await
        .contains(r#"stockade_orders_total{outcome="busy"} 1"#)
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the cut-off request never ended: {}",
            app.metrics().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn no_transaction_starts_after_the_answer(strategy: OrderStrategy) {
    let app = spawn_app_with(Settings {
        order_strategy: strategy,
        request_budget: Duration::from_millis(1_000),
        // Longer than the budget, so the request is still waiting when it is answered.
        lease_wait: Duration::from_secs(5),
        ..test_settings().await
    })
    .await;
    app.add_product("LATE-1", "Late", 1_000, 3).await;
    // Another process's lease on the SKU, for longer than the budget.
    let redis = stockade::locking::Redis::connect_lazy(
        app.settings.redis_url.as_deref().unwrap(),
        &app.settings.redis_prefix,
    )
    .unwrap();
    let sku = stockade::catalog::Sku::parse("LATE-1").unwrap();
    let elsewhere = redis
        .acquire(
            std::slice::from_ref(&sku),
            Duration::from_millis(2_000),
            Duration::from_secs(1),
        )
        .await;
    assert!(
        matches!(elsewhere, stockade::locking::Acquire::Granted(_)),
        "the outside lease"
    );

    let res = app.post_order("cut-off", &[("LATE-1", 1)]).await;
    assert_eq!(res.status().as_u16(), 503);
    let problem: serde_json::Value = res.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap();
    assert!(!detail.contains("nothing was"), "{detail}");
    // The outside lease runs out; the request's work gets the lease, and stops there.
    until_the_request_ends(&app).await;
    assert_eq!(app.count("select count(*) from orders").await, 0);
    assert_eq!(
        app.count("select count(*) from idempotency_keys where state = 'completed'")
            .await,
        0
    );
    assert_eq!(app.stock("LATE-1").await, (3, 0));

    // The retry with the same key is decided as the first attempt.
    let res = app.post_order("cut-off", &[("LATE-1", 1)]).await;
    assert_eq!(res.status().as_u16(), 201);
    assert_eq!(app.count("select count(*) from orders").await, 1);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_request_answered_503_starts_no_transaction_afterwards_under_redis_lock() {
    no_transaction_starts_after_the_answer(OrderStrategy::RedisLock).await;
}

#[tokio::test]
async fn a_request_answered_503_starts_no_transaction_afterwards_under_batched() {
    no_transaction_starts_after_the_answer(OrderStrategy::Batched).await;
}
