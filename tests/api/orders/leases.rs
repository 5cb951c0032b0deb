//! Leases: a late holder fenced off, a stalled one retried, and orders going on under
//! the database guard while Redis is down.

use std::time::Duration;

use futures_util::future::join_all;

use crate::helpers::{TestApp, spawn_app, spawn_app_with, spawn_app_with_own_redis, test_settings};

#[tokio::test]
async fn a_late_lease_holder_can_neither_release_nor_outwrite_its_successor() {
    let app = spawn_app().await;
    app.add_product("FENCE-1", "Fenced", 1_000, 5).await;
    let redis = stockade::locking::Redis::connect_lazy(
        app.settings.redis_url.as_deref().unwrap(),
        &app.settings.redis_prefix,
    )
    .unwrap();
    let sku = stockade::catalog::Sku::parse("FENCE-1").unwrap();
    let grant = |r: stockade::locking::Acquire| match r {
        stockade::locking::Acquire::Granted(lease) => lease,
        other => panic!("expected a lease, got {other:?}"),
    };
    let skus = [sku.clone()];
    let late = grant(
        redis
            .acquire(&skus, Duration::from_millis(100), Duration::ZERO)
            .await,
    );
    // While held, nobody else gets it.
    assert!(matches!(
        redis
            .acquire(&skus, Duration::from_secs(5), Duration::from_millis(20))
            .await,
        stockade::locking::Acquire::Busy
    ));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let next = grant(
        redis
            .acquire(&skus, Duration::from_secs(5), Duration::ZERO)
            .await,
    );
    assert!(next.fence > late.fence, "fencing tokens increase");

    // The successor writes; the late holder's write is refused by the stock row.
    let take = |fence: i64| {
        let (db, sku) = (app.db.clone(), sku.clone());
        async move {
            let mut tx = db.begin().await.unwrap();
            let r = stockade::inventory::db::take_stock(&mut tx, &sku, 1, Some(fence), "t", "test")
                .await
                .unwrap();
            tx.commit().await.unwrap();
            r
        }
    };
    assert_eq!(
        take(next.fence).await,
        stockade::inventory::db::Take::Taken { left: 4 }
    );
    assert_eq!(
        take(late.fence).await,
        stockade::inventory::db::Take::StaleFence {
            last_fence: next.fence
        }
    );
    assert_eq!(app.stock("FENCE-1").await.0, 4);

    // The late release leaves the successor's lease in place; the successor's own works.
    assert_eq!(redis.release(&late).await, 0);
    assert_eq!(app.leftover_leases().await.len(), 1);
    assert_eq!(redis.release(&next).await, 1);
    assert!(app.leftover_leases().await.is_empty());
}

#[tokio::test]
async fn a_stalled_holder_whose_lease_expired_is_fenced_off_and_retries() {
    // Process A stalls after taking its lease, longer than the lease lives.
    let mut slow = test_settings().await;
    slow.lease_ttl = Duration::from_millis(300);
    slow.tx_timeout = Duration::from_millis(250);
    slow.statement_timeout = Duration::from_millis(250);
    slow.fault_pause_after_lease = Duration::from_millis(1_500);
    let app_a = spawn_app_with(slow.clone()).await;
    app_a.add_product("STALL-1", "Stalled", 1_000, 2).await;
    // Process B shares the database and Redis, and does not stall.
    let mut fast = slow.clone();
    fast.fault_pause_after_lease = Duration::ZERO;
    fast.listen = "127.0.0.1:0".parse().unwrap();
    let app_b = spawn_app_with(fast).await;

    let a = app_a.post_order("stalled", &[("STALL-1", 1)]);
    let b = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        app_b.post_order("prompt", &[("STALL-1", 1)]).await
    };
    let (a, b) = tokio::join!(a, b);
    assert_eq!(b.status().as_u16(), 201, "B bought while A stalled");
    assert_eq!(a.status().as_u16(), 201, "A retried under a fresh lease");
    assert_eq!(app_a.stock("STALL-1").await.0, 0);
    assert_eq!(app_a.count("select count(*) from orders").await, 2);
    app_a.assert_invariants().await;
    let metrics = app_a.metrics().await;
    assert!(
        metrics.contains("stockade_stale_fence_refusals_total 1"),
        "A's first write was refused: {metrics}"
    );
}

/// One concurrent buyer of one `DOWN-1` per key in `range`; their statuses.
async fn buy(app: &TestApp, range: std::ops::Range<usize>) -> Vec<u16> {
    join_all(range.map(|i| async move {
        app.post_order(&format!("down-{i}"), &[("DOWN-1", 1)])
            .await
            .status()
            .as_u16()
    }))
    .await
}

#[tokio::test]
async fn orders_continue_on_the_database_guard_while_redis_is_down() {
    let mut app = spawn_app_with_own_redis().await;
    app.add_product("DOWN-1", "Downtime", 1_000, 30).await;
    let before = buy(&app, 0..20).await;
    assert!(before.iter().all(|s| *s == 201), "{before:?}");

    app.stop_redis();
    let during = buy(&app, 20..60).await;
    assert_eq!(
        during.iter().filter(|s| **s == 201).count(),
        10,
        "{during:?}"
    );
    assert_eq!(
        during.iter().filter(|s| **s == 409).count(),
        30,
        "{during:?}"
    );
    assert_eq!(app.stock("DOWN-1").await.0, 0);
    let ready: serde_json::Value = app.get("/readyz").await.json().await.unwrap();
    assert_eq!(ready["order_guard"], "degraded");
    assert!(app.lease_layer_degraded().await);

    // Redis returns (empty): the breaker closes within a second, and leases are used
    // again, without a restart.
    app.restart_redis().await;
    app.assert_leases_back_within_a_second().await;
    sqlx::query!("update stock set on_hand = 5 where sku = 'DOWN-1'")
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query!("insert into stock_movements (sku, delta, reason, actor) values ('DOWN-1', 5, 'restock', 'test')")
    .execute(&app.db)
    .await
    .unwrap();
    let after = buy(&app, 60..70).await;
    assert_eq!(after.iter().filter(|s| **s == 201).count(), 5, "{after:?}");
    let mut conn = app.redis().await;
    let fence: Option<i64> = redis::cmd("GET")
        .arg(format!("{}fence", app.settings.redis_prefix))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        fence.is_some_and(|f| f >= 5),
        "the restarted Redis issued leases: {fence:?}"
    );
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("stockade_lease_layer_degraded 0"),
        "{metrics}"
    );
    app.assert_invariants().await;
    assert_eq!(app.count("select count(*) from orders").await, 35);
}
