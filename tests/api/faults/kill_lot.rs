//! A server killed with SIGKILL while it group-commits holds and confirmations (the
//! default strategy's batches of holds, and its lots of confirmations). Buyers hold one
//! unit, retrying their key on the other server until they get a definite answer, then
//! confirm the hold the same way. Whatever the killed process had sent to PostgreSQL, one
//! hold is one reservation and becomes at most one order: every hold and order a buyer was
//! told about exists, no other does, and stock and ledger add up.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::sale::SKU;
use super::scenarios::{tight, tight_env};
use crate::helpers::{serve_app, spawn_app_with, test_settings};

const STOCK: i32 = 40;
const BUYERS: usize = 60;
/// Time between two buyers' arrivals: the kill comes while holds and confirmations flow.
const PACE: Duration = Duration::from_millis(25);
const GIVE_UP: Duration = Duration::from_secs(25);

/// One attempt's status and body (`None`: no answer, the connection failed).
async fn attempt(
    client: &reqwest::Client,
    url: String,
    key: &str,
    body: serde_json::Value,
) -> Option<(u16, serde_json::Value)> {
    let res = client
        .post(url)
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .ok()?;
    let status = res.status().as_u16();
    Some((status, res.json().await.unwrap_or_default()))
}

/// What one buyer was told: the hold's id (or "not enough stock"), and the order its
/// confirmation became. Panics on an answer that contradicts an earlier one.
#[derive(Debug, Default)]
struct Told {
    hold: Option<String>,
    short: bool,
    order: Option<String>,
}

/// Sends `body` to `path(target)` on alternating targets until a definite answer: 201
/// (its `id`) or 409 with shortages. Other answers (503, 409 in flight, no answer) are
/// retried after a pause. `None`: given up.
async fn until_definite(
    client: &reqwest::Client,
    targets: &[String],
    first: usize,
    path: &str,
    key: &str,
    body: serde_json::Value,
    started: Instant,
) -> Option<Result<String, ()>> {
    for attempt_no in 0.. {
        let target = &targets[(first + attempt_no) % targets.len()];
        match attempt(client, format!("{target}{path}"), key, body.clone()).await {
            Some((201, body)) => return Some(Ok(body["id"].as_str().unwrap().to_string())),
            Some((409, body)) if body.get("shortages").is_some() => return Some(Err(())),
            Some((status, body)) => assert!(
                [409, 503].contains(&status),
                "{path} {key}: answered {status}: {body}"
            ),
            None => {}
        }
        if started.elapsed() > GIVE_UP {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    unreachable!()
}

#[tokio::test]
async fn a_server_killed_mid_lot_of_holds_and_confirmations_loses_nothing_and_sells_nothing_twice()
{
    let app = spawn_app_with(tight(test_settings().await)).await;
    app.add_product(SKU, "Drop", 5_000, STOCK).await;
    let mut env = tight_env();
    env.push(("STOCKADE_ORDER_STRATEGY", "batched".to_string()));
    let (mut killed, other) = tokio::join!(serve_app(&app, &env, &[]), serve_app(&app, &env, &[]));
    let targets = [killed.address.clone(), other.address.clone()];
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();

    let buyers = join_all((0..BUYERS).map(|i| {
        let (client, targets) = (&client, &targets);
        async move {
            tokio::time::sleep(PACE * i as u32).await;
            let started = Instant::now();
            let key = format!("lot-{i}-{}", uuid::Uuid::new_v4().simple());
            let body = serde_json::json!({"lines": [{"sku": SKU, "quantity": 1}]});
            let mut told = Told::default();
            match until_definite(client, targets, i, "/api/v1/holds", &key, body, started).await {
                Some(Ok(hold)) => told.hold = Some(hold),
                Some(Err(())) => told.short = true,
                None => panic!("hold {key} was never decided"),
            }
            if let Some(hold) = &told.hold {
                let path = format!("/api/v1/holds/{hold}/confirm");
                let confirmed = until_definite(
                    client,
                    targets,
                    i + 1,
                    &path,
                    &format!("{key}-confirm"),
                    serde_json::json!({}),
                    Instant::now(),
                )
                .await;
                match confirmed {
                    Some(Ok(order)) => told.order = Some(order),
                    other => panic!("confirming hold {hold} ended {other:?}"),
                }
            }
            (key, told)
        }
    }));
    let fault = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        killed.kill9();
    };
    let (told, ()) = tokio::join!(buyers, fault);

    let held: BTreeMap<String, String> = told
        .iter()
        .filter_map(|(_, t)| Some((t.hold.clone()?, t.order.clone()?)))
        .collect();
    assert_eq!(
        held.len(),
        told.iter().filter(|(_, t)| t.hold.is_some()).count(),
        "every hold told 201 was confirmed into its own order"
    );
    assert_eq!(
        held.len(),
        STOCK as usize,
        "the stock sold out through holds: {told:?}"
    );
    // (Runtime: a test's own look at what the database holds.)
    let in_db: BTreeMap<String, String> = sqlx::query_as::<_, (String, String)>(
        "select id::text, order_id::text from holds where state = 'confirmed'",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(
        held, in_db,
        "each hold told 201 became the one order it was told"
    );
    assert_eq!(
        app.count("select count(*) from holds").await,
        STOCK as i64,
        "no hold beyond the ones told"
    );
    assert_eq!(app.count("select count(*) from orders").await, STOCK as i64);
    assert_eq!(
        app.stock(SKU).await,
        (0, 0),
        "all sold, nothing still reserved"
    );
    app.assert_invariants().await;
}
