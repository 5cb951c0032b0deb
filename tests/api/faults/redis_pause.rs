//! Redis that stops answering for a while (`CLIENT PAUSE`, as a stopped process or a
//! stalled host would) and then comes back. The lease calls sent while it was paused were
//! given up by their callers, but Redis runs them when it wakes: a lease granted to a
//! caller that is no longer waiting must not block its SKU for a lease TTL, so orders
//! keep being answered through the pause and after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use stockade::config::{OrderStrategy, Settings};

use crate::helpers::{spawn_app_with_own_redis_and, test_settings};

const SKU: &str = "PAUSE-1";
/// How long Redis is paused: long enough for every caller to give up on it.
const PAUSE: Duration = Duration::from_millis(1_500);
/// The lease TTL: a lease granted to nobody would block the SKU this long.
const LEASE_TTL: Duration = Duration::from_secs(4);
/// Buyers ordering in a loop.
const BUYERS: usize = 8;

async fn orders_are_answered_soon_after_redis_comes_back(strategy: OrderStrategy) {
    let app = spawn_app_with_own_redis_and(Settings {
        order_strategy: strategy,
        lease_ttl: LEASE_TTL,
        lease_wait: Duration::from_millis(700),
        redis_timeout: Duration::from_millis(250),
        request_budget: Duration::from_secs(3),
        ..test_settings().await
    })
    .await;
    app.add_product(SKU, "Paused drop", 100, 100_000).await;
    assert_eq!(app.post_order("warm", &[(SKU, 1)]).await.status(), 201);

    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let buyers = join_all((0..BUYERS).map(|b| {
        let (app, stop) = (&app, &stop);
        async move {
            // When each order was answered 201, since `started`.
            let mut placed = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let res = app.post_order(&format!("b{b}-{n}"), &[(SKU, 1)]).await;
                if res.status() == 201 {
                    placed.push(started.elapsed());
                }
            }
            placed
        }
    }));
    let fault = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let mut conn = app.redis().await;
        let paused = started.elapsed();
        redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(PAUSE.as_millis() as u64)
            .arg("ALL")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        // Past the pause, long enough for a lease granted to nobody to show.
        tokio::time::sleep(PAUSE + LEASE_TTL).await;
        stop.store(true, Ordering::Relaxed);
        paused + PAUSE
    };
    let (placed, resumed) = tokio::join!(buyers, fault);
    let mut placed: Vec<Duration> = placed.into_iter().flatten().collect();
    placed.sort();

    // The longest stretch without a placed order from just before Redis came back to the
    // end; and how long after it came back the first order was placed.
    let window: Vec<Duration> = placed
        .iter()
        .copied()
        .filter(|&at| at + Duration::from_millis(300) >= resumed)
        .collect();
    let longest_gap = window
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let first_after = window
        .iter()
        .find(|&&at| at >= resumed)
        .map(|&at| at - resumed);
    eprintln!(
        "{strategy:?}: {} placed, {} in the window; longest gap {longest_gap:?}, first after \
         the resume {first_after:?}",
        placed.len(),
        window.len()
    );
    // A lease granted to nobody would stop orders of the SKU for up to LEASE_TTL (4 s);
    // a second is the time the breaker and the buyers' backoff may take on two shared
    // cores.
    let within = Duration::from_secs(1);
    let first_after = first_after.expect("orders were placed after Redis came back");
    assert!(
        first_after < within && longest_gap < within,
        "{strategy:?}: first order {first_after:?} after Redis came back, longest gap \
         {longest_gap:?} (a lease TTL is {LEASE_TTL:?})"
    );
    // Whatever the lease calls that Redis ran late did, nothing was left held.
    app.wait_for_no_leases(Duration::from_secs(2)).await;
    app.assert_invariants().await;
}

#[tokio::test]
async fn orders_are_answered_soon_after_a_paused_redis_comes_back_under_redis_lock() {
    orders_are_answered_soon_after_redis_comes_back(OrderStrategy::RedisLock).await;
}

#[tokio::test]
async fn orders_are_answered_soon_after_a_paused_redis_comes_back_under_batched() {
    orders_are_answered_soon_after_redis_comes_back(OrderStrategy::Batched).await;
}
