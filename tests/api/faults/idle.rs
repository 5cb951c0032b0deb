//! A session of the app left idle inside a transaction (its process stopped, say, while it
//! held a stock row) is ended by the server within `STOCKADE_IDLE_IN_TX_TIMEOUT_MS`, so
//! the row's lock goes back to the other buyers long before the transaction timeout.

use std::time::{Duration, Instant};

use sqlx::{ConnectOptions, Connection};

use crate::helpers::test_settings;

#[tokio::test]
async fn a_session_idle_in_a_transaction_is_ended_within_the_idle_timeout() {
    let settings = test_settings().await;
    let url = settings.database_url.as_deref().unwrap().to_string();
    let options = stockade::startup::connect_options(&settings, &url, "DATABASE_URL").unwrap();
    let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();

    // One of the app's sessions takes a row lock, then sends nothing more.
    let mut app_session = options.connect().await.unwrap();
    let mut tx = app_session.begin().await.unwrap();
    let pid: i32 = sqlx::query_scalar("select pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    // Timed from before the last statement is sent: the server's idle timer starts when it
    // has answered, before the answer reaches this process, so a clock started on receipt
    // would run behind it (seen: "ended after 499.76 ms" for a 500 ms timeout).
    let idle_since = Instant::now();
    sqlx::query("select 1 from pg_class limit 1 for share")
        .execute(&mut *tx)
        .await
        .unwrap();
    let ended = loop {
        // Runtime: a test's own look at the server.
        let alive: bool =
            sqlx::query_scalar("select exists (select 1 from pg_stat_activity where pid = $1)")
                .bind(pid)
                .fetch_one(&mut watcher)
                .await
                .unwrap();
        if !alive {
            break idle_since.elapsed();
        }
        assert!(
            idle_since.elapsed() < Duration::from_secs(5),
            "the idle session is still there"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let timeout = settings.idle_in_tx_timeout;
    // The server checks its timer to the millisecond; the margin is for a shared machine.
    let margin = Duration::from_millis(300);
    assert!(
        ended >= timeout && ended < timeout + margin,
        "the idle session ended after {ended:?}, for a timeout of {timeout:?}"
    );
    eprintln!("idle in transaction: ended after {ended:?} (timeout {timeout:?})");
    // What the app sees next: the session is gone, nothing it did committed.
    assert!(sqlx::query("select 1").execute(&mut *tx).await.is_err());
}
