//! The database out of reach, as while a failover finds a new primary: every connection
//! reset as soon as it is made, or refused outright (a stopped server). Requests are
//! refused at once with 503 and `Retry-After`, having done nothing, instead of each
//! opening a connection of its own, and the shop resumes on its own once the database is
//! back. A process's probe finds the outage and its end (`pg::outage`); the proxy in front
//! of PostgreSQL counts the connections tried.

use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::proxy::Mode;
use crate::helpers::test_settings;

/// Connections tried in the two seconds of asking, when each is accepted and reset: the
/// probe's (four a second) and the background tasks' (the hold sweeper, the purges, the
/// dispatcher, the drop ticker: a few a second each), with room to spare. One per request
/// would be thousands.
const AT_MOST_TRIED: u64 = 100;
/// Answers in the two seconds, at least. A refused connection is retried by the pool
/// until its wait (`db_acquire_timeout`, 5 s in the tests) runs out, so without the probe
/// each of the sixteen clients would get one answer at most (16 in all); answered at once,
/// thousands on an idle machine and well over this on one loaded several times over (168
/// seen): four answers per client, each within half a second.
const AT_LEAST_ANSWERED: usize = 64;

async fn refused_at_once_while_the_database(mode: Mode) {
    let sku = "OUT-1";
    let (app, proxy) = super::behind_database_proxy(test_settings().await).await;
    app.add_product(sku, "Out of reach", 100, 10_000).await;
    assert_eq!(app.post_order("before", &[(sku, 1)]).await.status(), 201);

    proxy.set(mode);
    // The probe finds the outage within a few of its rounds. (A request sent before it
    // does may wait out the pool's acquire timeout, 5 s, for a refused connection.)
    let cut = Instant::now();
    loop {
        let res = app.get("/api/v1/products").await;
        let body = res.text().await.unwrap();
        // The probe's answer (the middleware's, at once), not a request's own failure,
        // which also says the database cannot be reached.
        if body.contains("was not carried out") {
            break;
        }
        assert!(
            cut.elapsed() < Duration::from_secs(15),
            "{mode:?}: not noticed: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Sixteen clients asking as fast as they are answered, for two seconds.
    let tried_before = proxy.accepted();
    let answers = join_all((0..16).map(|c| {
        let app = &app;
        async move {
            let mut answers = Vec::new();
            let started = Instant::now();
            for i in 0.. {
                if started.elapsed() > Duration::from_secs(2) {
                    break;
                }
                let res = app.post_order(&format!("out-{c}-{i}"), &[(sku, 1)]).await;
                let retry = res.headers().contains_key("retry-after");
                answers.push((res.status().as_u16(), retry));
            }
            answers
        }
    }))
    .await;
    let tried = proxy.accepted() - tried_before;
    let answers: Vec<_> = answers.into_iter().flatten().collect();
    assert!(
        answers.iter().all(|&answer| answer == (503, true)),
        "{mode:?}: {answers:?}"
    );
    // (A refused connection is never accepted, so only resets are counted.)
    assert!(
        tried <= AT_MOST_TRIED,
        "{mode:?}: {tried} connections tried for {} requests",
        answers.len()
    );
    assert!(
        answers.len() >= AT_LEAST_ANSWERED,
        "{mode:?}: {} answers in 2 s",
        answers.len()
    );
    eprintln!(
        "{mode:?}: {} requests refused in 2 s, {tried} connections tried",
        answers.len()
    );

    proxy.set(Mode::Pass);
    let back = Instant::now();
    for i in 0.. {
        let res = app.post_order(&format!("after-{i}"), &[(sku, 1)]).await;
        match res.status().as_u16() {
            201 => break,
            503 => assert!(back.elapsed() < Duration::from_secs(5), "not back in 5 s"),
            other => panic!("{other}: {}", res.text().await.unwrap()),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "{mode:?}: orders again {:?} after the database came back",
        back.elapsed()
    );
    // Nothing refused was placed.
    let placed: i64 = sqlx::query_scalar("select count(*) from orders")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(placed, 2, "the order before and the first after");
}

#[tokio::test]
async fn while_every_connection_is_reset_requests_are_refused_at_once_and_resume_after() {
    refused_at_once_while_the_database(Mode::Reset).await;
}

#[tokio::test]
async fn while_the_database_refuses_connections_requests_are_refused_at_once_and_resume_after() {
    refused_at_once_while_the_database(Mode::Refuse).await;
}
