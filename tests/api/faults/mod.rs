//! Building blocks for fault-injection tests: [`proxy::FaultProxy`], a TCP proxy that
//! delays, swallows or resets the traffic between the application and PostgreSQL or
//! Redis; [`terminate_backends`], which cuts a database's connections as a PostgreSQL
//! restart or failover would; and, on `ServerProcess`, `pause`, `resume` and `kill9` for
//! a server that stalls or crashes.

pub mod proxy;
pub mod sale;

mod demoted;
mod idle;
mod kill_lot;
mod late;
mod latency;
mod outage;
mod process;
mod redis_pause;
mod scenarios;
mod shed;

use sqlx::{PgExecutor, PgPool};
use stockade::config::Settings;

use crate::helpers::{TestApp, spawn_app_with};
use proxy::FaultProxy;

/// An app whose database connections go through a fault proxy; the test's own pool
/// (`app.db`) goes straight to the database.
pub async fn behind_database_proxy(mut settings: Settings) -> (TestApp, FaultProxy) {
    let direct = settings.database_url.as_deref().unwrap().to_string();
    let proxy = FaultProxy::in_front_of(&direct);
    settings.database_url = Some(proxy.url(&direct).into());
    let mut app = spawn_app_with(settings).await;
    app.db = PgPool::connect(&direct).await.unwrap();
    (app, proxy)
}

/// Terminates every client connection to `database` except the one this runs on, and
/// waits (up to 5 s each) until they are gone; returns how many there were. Pools notice
/// at their next use of each connection. `db` (a connection, or a pool: then its other
/// connections to `database` go too) may be connected to any database of the server.
pub async fn terminate_backends(db: impl PgExecutor<'_>, database: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select count(*) filter (where pg_terminate_backend(pid, 5000)) as "terminated!"
             from pg_stat_activity
            where datname = $1 and backend_type = 'client backend'
              and pid <> pg_backend_pid()"#,
        database,
    )
    .fetch_one(db)
    .await
}
