//! The verdicts of `stockade check`, quick or full: recorded for the admin dashboard, which
//! shows the last one, and kept for [`RUNS_KEPT`].

use serde::Serialize;
use sqlx::PgPool;

/// The last check recorded, as the dashboard shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct LastCheck {
    /// `quick` or `full`.
    pub kind: String,
    pub passed: bool,
    /// When it finished (UTC, RFC 3339).
    pub finished_at: String,
    pub seconds_ago: i64,
    pub covered: String,
    /// The invariants that failed, `I1: …`.
    pub failed: Vec<String>,
}

/// Records a check's verdict for the dashboard.
pub async fn record(
    db: &PgPool,
    kind: &str,
    started: chrono::DateTime<chrono::Utc>,
    passed: bool,
    verdicts: &impl Serialize,
    covered: &str,
) -> anyhow::Result<()> {
    sqlx::query!(
        "insert into check_runs (kind, started_at, passed, verdicts, covered)
         values ($1, $2, $3, $4, $5)",
        kind,
        started,
        passed,
        serde_json::to_value(verdicts)?,
        covered,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// How long check verdicts are kept: a month of one a minute is 43,200 rows.
pub const RUNS_KEPT: &str = "30 days";

/// Deletes up to `limit` verdicts older than [`RUNS_KEPT`], skipping rows another process
/// is purging (retention). Returns how many went.
pub async fn purge_runs(db: &PgPool, limit: i64) -> sqlx::Result<u64> {
    Ok(sqlx::query!(
        r#"with old as (
               select id from check_runs where finished_at < now() - interval '30 days'
                order by finished_at limit $1 for update skip locked
           )
           delete from check_runs r using old where r.id = old.id"#,
        limit,
    )
    .execute(db)
    .await?
    .rows_affected())
}

/// The last check recorded, if any.
pub async fn last(db: impl sqlx::PgExecutor<'_>) -> sqlx::Result<Option<LastCheck>> {
    let row = sqlx::query!(
        r#"select kind, passed, finished_at, covered, verdicts,
                  extract(epoch from now() - finished_at)::bigint as "seconds_ago!"
             from check_runs order by finished_at desc limit 1"#
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| LastCheck {
        kind: r.kind,
        passed: r.passed,
        finished_at: r
            .finished_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        seconds_ago: r.seconds_ago,
        covered: r.covered,
        failed: r
            .verdicts
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["pass"] == false)
            .map(|v| {
                format!(
                    "{}: {}",
                    v["id"].as_str().unwrap_or("?"),
                    v["name"].as_str().unwrap_or("")
                )
            })
            .collect(),
    }))
}
