//! What the bench reads of the database server around a run: commits, WAL, statements,
//! sessions, settings; and the databases it drops.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::rows::PostgresInfo;

/// Transactions committed in database `name` so far.
pub(super) async fn commit_count(admin: &PgPool, name: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar!(
        r#"select coalesce(xact_commit, 0)::bigint as "commits!"
             from pg_stat_database where datname = $1"#,
        name,
    )
    .fetch_optional(admin)
    .await?
    .unwrap_or(0))
}

/// The cluster's WAL insert position in bytes (`None` if it cannot be read). WAL is the
/// cluster's, not one database's: on the bench's own cluster only the phase being measured
/// writes; on a shared server, whatever else runs there counts too.
pub(super) async fn wal_position(admin: &PgPool) -> Option<i64> {
    sqlx::query_scalar!(
        r#"select (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint as "bytes!""#
    )
    .fetch_one(admin)
    .await
    .ok()
}

/// Bytes of WAL written since `before`.
pub(super) async fn wal_since(admin: &PgPool, before: Option<i64>) -> Option<i64> {
    Some(wal_position(admin).await? - before?)
}

/// `total` over `requests`, when there were any.
pub(super) fn per_request(total: Option<i64>, requests: u64) -> Option<f64> {
    total
        .filter(|_| requests > 0)
        .map(|t| t as f64 / requests as f64)
}

/// Statements executed in database `name` so far, when `pg_stat_statements` is there.
pub(super) async fn statement_count(admin: &PgPool, name: &str) -> Option<i64> {
    // Runtime, not `query_scalar!`: the view exists only where the extension is installed,
    // which the database the macros are checked against need not have.
    sqlx::query_scalar(
        r#"select coalesce(sum(s.calls), 0)::bigint
             from pg_stat_statements s join pg_database d on d.oid = s.dbid
            where d.datname = $1"#,
    )
    .bind(name)
    .fetch_one(admin)
    .await
    .ok()
}

/// Waits (up to 10 s) until no session is connected to database `name`.
pub(super) async fn wait_for_no_sessions(admin: &PgPool, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let sessions = sqlx::query_scalar!(
            r#"select count(*) as "sessions!" from pg_stat_activity where datname = $1"#,
            name,
        )
        .fetch_one(admin)
        .await;
        if sessions.is_ok_and(|n| n == 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Drops a bench database; a failure only leaves it behind.
pub(super) async fn drop_database(admin: &PgPool, name: &str) {
    // Identifiers cannot be bound; `name` is generated above.
    let sql = format!(r#"drop database if exists "{name}" with (force)"#);
    if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(admin).await {
        eprintln!("could not drop database {name}: {e}");
    }
}

pub(super) async fn postgres_info(admin: &PgPool) -> anyhow::Result<PostgresInfo> {
    let show = |setting: &'static str| async move {
        sqlx::query_scalar!(r#"select current_setting($1) as "setting!""#, setting)
            .fetch_one(admin)
            .await
    };
    Ok(PostgresInfo {
        version: show("server_version").await?,
        fsync: show("fsync").await?,
        synchronous_commit: show("synchronous_commit").await?,
    })
}
