//! The process and connection faults of [`super`], each shown to do what it says.

use std::time::Duration;

use nix::errno::Errno;
use sqlx::{Connection, PgConnection, PgPool};

use super::terminate_backends;
use crate::helpers::{fresh_database, serve_app, spawn_app};

#[tokio::test]
async fn a_paused_server_answers_nothing_until_resumed_and_a_killed_one_is_gone() {
    let app = spawn_app().await;
    let mut server = serve_app(&app, &[], &[]).await;
    let health = format!("{}/healthz", server.address);
    let client = reqwest::Client::new();
    let get = |wait: Duration| client.get(&health).timeout(wait).send();
    assert!(
        get(Duration::from_secs(5))
            .await
            .unwrap()
            .status()
            .is_success()
    );

    server.pause().unwrap();
    let err = get(Duration::from_millis(500)).await.unwrap_err();
    assert!(err.is_timeout(), "{err}");

    server.resume().unwrap();
    assert!(
        get(Duration::from_secs(5))
            .await
            .unwrap()
            .status()
            .is_success()
    );

    let pid = server.pid().unwrap();
    server.kill9();
    assert_eq!(server.pid(), None);
    // Waited for: not even a zombie is left.
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    let err = reqwest::Client::new()
        .get(&health)
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err}");
    assert_eq!(server.pause(), Err(Errno::ESRCH));
}

#[tokio::test]
async fn terminating_backends_cuts_every_connection_of_the_database_but_the_callers() {
    let url = fresh_database().await;
    let mut victim = PgConnection::connect(&url).await.unwrap();
    sqlx::query("select 1").execute(&mut victim).await.unwrap();
    let mut caller = PgConnection::connect(&url).await.unwrap();
    let database = sqlx::query_scalar!(r#"select current_database() as "name!""#)
        .fetch_one(&mut caller)
        .await
        .unwrap();

    assert_eq!(terminate_backends(&mut caller, &database).await.unwrap(), 1);
    let err = sqlx::query("select 1")
        .execute(&mut victim)
        .await
        .unwrap_err();
    let terminated = err
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "57P01");
    assert!(terminated || matches!(err, sqlx::Error::Io(_)), "{err}");
    // The caller's own connection is spared.
    sqlx::query("select 1").execute(&mut caller).await.unwrap();
    assert_eq!(terminate_backends(&mut caller, &database).await.unwrap(), 0);
    // A pool on another database may be the caller too.
    let admin = PgPool::connect(&url.replace(&database, "postgres"))
        .await
        .unwrap();
    assert_eq!(terminate_backends(&admin, &database).await.unwrap(), 1);
    assert!(sqlx::query("select 1").execute(&mut caller).await.is_err());
}
