//! `idempotency::run`, beneath every admin form: twins apply once, a refused run changes
//! nothing, a mismatch runs nothing, and a run whose key was taken over rolls back.

use std::time::Duration;

use futures_util::future::join_all;

use stockade::catalog::Sku;
use stockade::idempotency::{
    Fingerprint, IdempotencyKey, Once, Request, RunError, Scope, StoredResponse, run,
};
use stockade::inventory::db::restock;

use crate::helpers::{TestApp, spawn_app};

/// Runs a restock of one unit of `sku` under `key` by [`stockade::idempotency::run`],
/// holding its transaction open for `hold` before answering.
async fn restock_once(
    app: &TestApp,
    key: &str,
    fingerprint: &str,
    stale_after: Duration,
    hold: Duration,
) -> Result<Result<Once, String>, RunError> {
    let request = Request {
        scope: Scope::Admin,
        key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: Fingerprint::of(&fingerprint),
        stale_after,
        wait: Duration::from_secs(10),
    };
    run(
        &app.db,
        request,
        async |tx: &mut sqlx::PgConnection| -> Result<StoredResponse, String> {
            let sku = Sku::parse("RUN-1").unwrap();
            let on_hand = restock(tx, &sku, 1, "run", "test")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("too many")?;
            tokio::time::sleep(hold).await;
            Ok(StoredResponse {
                status: 200,
                body: serde_json::json!({ "on_hand": on_hand }),
            })
        },
    )
    .await
}

#[tokio::test]
async fn twin_runs_under_one_key_apply_the_change_once_and_replay_its_answer() {
    let app = spawn_app().await;
    app.add_product("RUN-1", "Run", 100, 10).await;
    let results = join_all((0..8).map(|_| {
        restock_once(
            &app,
            "twins",
            "restock 1",
            Duration::from_secs(60),
            Duration::from_millis(300),
        )
    }))
    .await;
    let outcomes: Vec<Once> = results.into_iter().map(|r| r.unwrap().unwrap()).collect();
    let expected = StoredResponse {
        status: 200,
        body: serde_json::json!({ "on_hand": 11 }),
    };
    let applied = outcomes
        .iter()
        .filter(|o| **o == Once::Applied(expected.clone()))
        .count();
    let replayed = outcomes
        .iter()
        .filter(|o| **o == Once::Replayed(expected.clone()))
        .count();
    assert_eq!((applied, replayed), (1, 7), "{outcomes:?}");
    assert_eq!(app.stock("RUN-1").await, (11, 0));
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_refused_run_changes_nothing_and_leaves_its_key_to_a_retry() {
    let app = spawn_app().await;
    app.add_product("RUN-1", "Run", 100, 10).await;
    let key = IdempotencyKey::parse("refused").unwrap();
    let request = Request {
        scope: Scope::Admin,
        key: key.clone(),
        fingerprint: Fingerprint::of(&"restock 1"),
        stale_after: Duration::from_secs(60),
        wait: Duration::ZERO,
    };
    let refused = run(&app.db, request, async |tx: &mut sqlx::PgConnection| {
        // Written, then refused: the write must not survive.
        restock(tx, &Sku::parse("RUN-1").unwrap(), 1, "run", "test")
            .await
            .unwrap();
        Err::<StoredResponse, _>("refused")
    })
    .await
    .unwrap();
    assert_eq!(refused, Err("refused"));
    assert_eq!(app.stock("RUN-1").await, (10, 0));
    let stored = stockade::idempotency::stored(&app.db, Scope::Admin, &key)
        .await
        .unwrap();
    assert_eq!(stored, None);
    let retried = restock_once(
        &app,
        "refused",
        "restock 1",
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(matches!(retried, Once::Applied(_)), "{retried:?}");
    assert_eq!(app.stock("RUN-1").await, (11, 0));
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_run_with_other_values_under_a_used_key_is_a_mismatch_and_runs_nothing() {
    let app = spawn_app().await;
    app.add_product("RUN-1", "Run", 100, 10).await;
    let first = restock_once(
        &app,
        "k",
        "restock 1",
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(matches!(first, Once::Applied(_)), "{first:?}");
    let other = restock_once(
        &app,
        "k",
        "restock 2",
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(other, Once::Mismatch);
    assert_eq!(app.stock("RUN-1").await, (11, 0));
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_run_whose_key_was_taken_over_rolls_back_and_the_retry_applies_once() {
    let app = spawn_app().await;
    app.add_product("RUN-1", "Run", 100, 10).await;
    // Every claim counts as stale at once, so the second run takes over the first's key
    // while the first is still inside its transaction.
    let slow = restock_once(
        &app,
        "taken",
        "restock 1",
        Duration::ZERO,
        Duration::from_millis(1500),
    );
    let retry = async {
        // Once the first has claimed the key (its change is running then):
        app.wait_for_a_row("select count(*) from idempotency_keys where key = 'taken'")
            .await;
        restock_once(&app, "taken", "restock 1", Duration::ZERO, Duration::ZERO).await
    };
    let (slow, retry) = tokio::join!(slow, retry);
    assert!(matches!(slow, Err(RunError::TakenOver)), "{slow:?}");
    assert!(matches!(retry, Ok(Ok(Once::Applied(_)))), "{retry:?}");
    assert_eq!(app.stock("RUN-1").await, (11, 0));
    app.assert_invariants().await;
}
