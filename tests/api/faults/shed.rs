//! A pool with no free connection sheds an order within its acquire timeout, under each
//! strategy that queues orders: a request that never got a connection sent nothing, so it
//! answers 503 at once instead of queueing a second time to read its key. And a request
//! never holds one connection while it waits for another: twins of a decided key on a
//! pool smaller than their number are answered, not left waiting for each other.

use std::time::{Duration, Instant};

use stockade::config::{OrderStrategy, Settings};

use crate::helpers::{post_order_to, spawn_app_with, test_settings};

/// Connections of the app's pool (by the application name it sets) waiting on a lock.
async fn app_backends_waiting(db: &sqlx::PgPool) -> i64 {
    // Runtime: a test's own look at the server.
    sqlx::query_scalar(
        "select count(*) from pg_stat_activity
          where datname = current_database() and application_name = 'stockade'
            and wait_event_type = 'Lock'",
    )
    .fetch_one(db)
    .await
    .unwrap()
}

/// Waits (at most 5 s) until `n` of the app's connections wait on a lock.
async fn until_backends_wait(db: &sqlx::PgPool, n: i64, what: &str) {
    let since = Instant::now();
    while app_backends_waiting(db).await < n {
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "{what} not waiting"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn an_order_on_an_exhausted_pool_is_shed_within_its_acquire_timeout(strategy: OrderStrategy) {
    let acquire = Duration::from_millis(500);
    let app = spawn_app_with(Settings {
        order_strategy: strategy,
        db_pool_size: 2,
        db_acquire_timeout: acquire,
        // The listings below keep their connections while they wait on the lock.
        statement_timeout: Duration::from_secs(4),
        tx_timeout: Duration::from_secs(4),
        ..test_settings().await
    })
    .await;
    app.add_product("SHED-1", "Shed", 100, 10).await;

    // Every connection of the pool waits on a table only the catalogue reads.
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("lock table product_images in access exclusive mode")
        .execute(&mut *lock)
        .await
        .unwrap();
    let listings: Vec<_> = (0..2)
        .map(|_| {
            let (client, url) = (app.client.clone(), app.url("/api/v1/products"));
            tokio::spawn(async move { client.get(url).send().await.map(|r| r.status()) })
        })
        .collect();
    until_backends_wait(&app.db, 2, "listings").await;

    let started = Instant::now();
    let res = app.post_order("shed-1", &[("SHED-1", 1)]).await;
    let took = started.elapsed();
    let status = res.status().as_u16();
    eprintln!("{strategy:?}: shed after {took:?}");
    lock.rollback().await.unwrap();
    for listing in listings {
        let _ = listing.await;
    }

    assert_eq!(status, 503, "{strategy:?}: {}", res.text().await.unwrap());
    // The acquire timeout, and half as much again for the rest of the request on two
    // shared cores: not a second wait for the pool.
    let within = acquire * 3 / 2;
    assert!(
        took < within,
        "{strategy:?}: shed after {took:?}, more than {within:?} for an acquire timeout of {acquire:?}"
    );
    assert_eq!(app.stock("SHED-1").await, (10, 0), "{strategy:?}");
    assert_eq!(app.count("select count(*) from orders").await, 0);
}

#[tokio::test]
async fn an_order_on_an_exhausted_pool_is_shed_within_its_acquire_timeout_under_redis_lock() {
    an_order_on_an_exhausted_pool_is_shed_within_its_acquire_timeout(OrderStrategy::RedisLock)
        .await;
}

#[tokio::test]
async fn an_order_on_an_exhausted_pool_is_shed_within_its_acquire_timeout_under_batched() {
    an_order_on_an_exhausted_pool_is_shed_within_its_acquire_timeout(OrderStrategy::Batched).await;
}

#[tokio::test]
async fn twins_that_find_their_key_decided_let_go_of_their_connection_before_reading_its_order() {
    // Under pg-atomic a request's transaction runs on the connection its reads used. A
    // twin whose claim waited on another request's record, and finds the key decided,
    // reads that request's order with a connection of its own: holding the first while it
    // waited for a second, two twins on a two-connection pool waited for each other until
    // the pool's timeout answered both 503.
    let app = spawn_app_with(Settings {
        order_strategy: OrderStrategy::PgAtomic,
        db_pool_size: 2,
        db_acquire_timeout: Duration::from_millis(500),
        ..test_settings().await
    })
    .await;
    app.add_product("TWIN-1", "Twin", 100, 10).await;
    app.add_product("TWIN-2", "Other", 100, 10).await;
    let cart = [("TWIN-1", 1), ("TWIN-2", 1)];
    let first: serde_json::Value = app.post_order("first", &cart).await.json().await.unwrap();
    assert!(first["id"].is_string(), "{first}");

    // The key's record, the first order's answer, written by a transaction that has not
    // committed yet: the twins' claims wait on it.
    let mut winner = app.db.begin().await.unwrap();
    // Runtime: a test's copy of a row under another key (keys are stored under their
    // client's name: `…first` becomes `…twin`).
    let copied = sqlx::query(
        "insert into idempotency_keys
              (scope, key, fingerprint, state, owner, response_status, response_body, completed_at)
         select scope, left(key, -length('first')) || 'twin', fingerprint, state, owner,
                response_status, response_body, completed_at
           from idempotency_keys where key like '%first'",
    )
    .execute(&mut *winner)
    .await
    .unwrap();
    assert_eq!(copied.rows_affected(), 1);
    let twins: Vec<_> = (0..2)
        .map(|_| {
            let (client, address) = (app.client.clone(), app.address.clone());
            tokio::spawn(async move {
                let res = post_order_to(&client, &address, "twin", &cart).await;
                let status = res.status().as_u16();
                (status, res.text().await.unwrap())
            })
        })
        .collect();
    until_backends_wait(&app.db, 2, "the twins' claims").await;
    winner.commit().await.unwrap();

    for twin in twins {
        let (status, body) = twin.await.unwrap();
        assert_eq!(status, 201, "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["id"], first["id"], "the key's one order");
    }
    assert_eq!(app.stock("TWIN-1").await, (9, 0));
    assert_eq!(app.count("select count(*) from orders").await, 1);
    app.assert_invariants().await;
}

/// A refusal names its real cause. With the stock table locked by someone else, an order
/// under each strategy waits for its lock until the statement's time runs out and is
/// answered 503: saying the database was held up, not that the products are in high
/// demand (the audit's finding under `batched`, where a batch's failure was copied to its
/// orders as "high demand"). Nothing is sold.
async fn a_blocked_table_is_named_as_the_cause_not_demand(strategy: OrderStrategy) {
    let app = spawn_app_with(Settings {
        order_strategy: strategy,
        statement_timeout: Duration::from_millis(800),
        tx_timeout: Duration::from_secs(2),
        ..test_settings().await
    })
    .await;
    app.add_product("HELD-1", "Held", 100, 10).await;
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("lock table stock in access exclusive mode")
        .execute(&mut *lock)
        .await
        .unwrap();
    let res = app.post_order("held-1", &[("HELD-1", 1)]).await;
    let status = res.status().as_u16();
    let retry = res.headers().contains_key("retry-after");
    let body: serde_json::Value = res.json().await.unwrap();
    lock.rollback().await.unwrap();
    assert_eq!(status, 503, "{strategy:?}: {body}");
    assert!(retry, "{strategy:?}: no Retry-After");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(!detail.contains("high demand"), "{strategy:?}: {detail}");
    assert!(detail.contains("held up"), "{strategy:?}: {detail}");
    assert_eq!(app.count("select count(*) from orders").await, 0);
}

#[tokio::test]
async fn a_blocked_table_is_named_as_the_cause_under_batched() {
    a_blocked_table_is_named_as_the_cause_not_demand(OrderStrategy::Batched).await;
}

#[tokio::test]
async fn a_blocked_table_is_named_as_the_cause_under_redis_lock() {
    a_blocked_table_is_named_as_the_cause_not_demand(OrderStrategy::RedisLock).await;
}
