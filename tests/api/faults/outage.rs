//! The database out of reach (every connection refused, as while a failover finds a new
//! primary): requests are refused at once with 503 and `Retry-After`, having done nothing,
//! instead of each opening a connection of its own, and the shop resumes on its own once
//! the database is back. A process's probe finds the outage and its end
//! (`pg::outage`); the proxy in front of PostgreSQL counts the connections tried.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use sqlx::PgPool;

use super::proxy::{FaultProxy, Mode};
use crate::helpers::{spawn_app_with, test_settings};

const SKU: &str = "OUT-1";

#[tokio::test]
async fn while_the_database_is_out_of_reach_requests_are_refused_at_once_without_opening_connections_and_resume_after()
 {
    let mut settings = test_settings().await;
    let direct = settings.database_url.as_deref().unwrap().to_string();
    let proxy = FaultProxy::in_front_of(&direct);
    settings.database_url = Some(proxy.url(&direct).into());
    let mut app = spawn_app_with(settings).await;
    app.db = PgPool::connect(&direct).await.unwrap();
    app.add_product(SKU, "Out of reach", 100, 10_000).await;
    assert_eq!(app.post_order("before", &[(SKU, 1)]).await.status(), 201);

    proxy.set(Mode::Reset);
    // The probe finds the outage within a few of its rounds.
    let cut = Instant::now();
    loop {
        let res = app.get("/api/v1/products").await;
        let body = res.text().await.unwrap();
        if body.contains("cannot be reached") {
            break;
        }
        assert!(
            cut.elapsed() < Duration::from_secs(5),
            "not noticed: {body}"
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
                let asked = Instant::now();
                let res = app.post_order(&format!("out-{c}-{i}"), &[(SKU, 1)]).await;
                let retry = res.headers().contains_key("retry-after");
                answers.push((res.status().as_u16(), retry, asked.elapsed()));
            }
            answers
        }
    }))
    .await;
    let tried = proxy.accepted() - tried_before;
    let answers: Vec<_> = answers.into_iter().flatten().collect();
    assert!(
        answers.iter().all(|&(s, retry, _)| s == 503 && retry),
        "{answers:?}"
    );
    let slowest = answers.iter().map(|a| a.2).max().unwrap();
    // Answered without waiting on the database (a connection attempt, a pool's wait).
    assert!(slowest < Duration::from_millis(500), "slowest {slowest:?}");
    // Connections: the probe's (four a second) and the background tasks', not one a
    // request.
    assert!(
        (tried as usize) < answers.len() / 10,
        "{tried} connections tried for {} requests",
        answers.len()
    );
    eprintln!(
        "outage: {} requests refused in 2 s (slowest {slowest:?}), {tried} connections tried",
        answers.len()
    );

    proxy.set(Mode::Pass);
    let back = Instant::now();
    for i in 0.. {
        let res = app.post_order(&format!("after-{i}"), &[(SKU, 1)]).await;
        match res.status().as_u16() {
            201 => break,
            503 => assert!(back.elapsed() < Duration::from_secs(5), "not back in 5 s"),
            other => panic!("{other}: {}", res.text().await.unwrap()),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "orders again {:?} after the database came back",
        back.elapsed()
    );
    // Nothing refused was placed.
    let placed: i64 = sqlx::query_scalar("select count(*) from orders")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(placed, 2, "the order before and the first after");
}
