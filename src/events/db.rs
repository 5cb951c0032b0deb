//! Outbox SQL: recording events on the caller's transaction, routing them to deliveries,
//! claiming and settling deliveries, and the webhook endpoints.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{Event, EventType};

/// Writes `event` on `conn`, which must be the transaction of the change it reports.
#[tracing::instrument(skip_all, fields(kind = event.kind.as_str()))]
pub async fn record(conn: &mut PgConnection, event: Event) -> sqlx::Result<()> {
    // Written routed when nothing can want it (see the migration `events_nobody_waits_for`).
    sqlx::query!(
        r#"insert into events (type, payload, routed_at)
           values ($1, $2, event_routed_at(event_subscribed($1), $1, $2))"#,
        event.kind.as_str(),
        event.payload,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// The part of a group-commit write that records `$event` events, one per payload in
/// parameter `$param` (a `jsonb[]`), as the part named `$part`; written only if the
/// statement's `go` is true. Whether an endpoint subscribes is looked up once per statement
/// (a scalar subquery), not once per event, as [`record_many`] does.
#[rustfmt::skip]
macro_rules! events_sql {
    ($part:literal, $event:literal, $param:literal) => {
        concat!(
            ", ", $part, " as (
               insert into events (type, payload, routed_at)
               select '", $event, "', p,
                      event_routed_at((select event_subscribed('", $event, "')), '", $event, "', p)
                 from unnest(", $param, "::jsonb[]) as p
                where (select go from go)
           )"
        )
    };
}
pub(crate) use events_sql;

/// Writes events of one type by one statement (a batch's orders, a sweep's holds), on the
/// transaction of the changes they report. Whether an endpoint subscribes is a scalar
/// subquery, so PostgreSQL looks it up once per statement; written as a subquery in
/// `from`, it is pulled up into the select list and looked up again for every row.
#[tracing::instrument(skip_all, fields(kind = kind.as_str(), events = payloads.len()))]
pub async fn record_many(
    conn: &mut PgConnection,
    kind: EventType,
    payloads: Vec<Value>,
) -> sqlx::Result<()> {
    if payloads.is_empty() {
        return Ok(());
    }
    sqlx::query!(
        r#"insert into events (type, payload, routed_at)
           select $1, p, event_routed_at((select event_subscribed($1)), $1, p)
             from unnest($2::jsonb[]) as p"#,
        kind.as_str(),
        &payloads,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Turns up to `limit` new events into deliveries, oldest first, by one statement: one
/// per endpoint that subscribes to the type, and with `mail` a receipt for each placed
/// order that has an email. Events another process is routing are skipped, not waited
/// for. Returns how many events were routed.
#[tracing::instrument(skip_all, fields(limit = limit, mail = mail))]
pub async fn route(pool: &PgPool, limit: i64, mail: bool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"with picked as (
                select id from events where routed_at is null
                 order by seq limit $1
                   for update skip locked -- another dispatcher routes these
           ), routed as (
                update events e set routed_at = now() from picked
                 where e.id = picked.id
             returning e.id, e.type, e.payload
           ), hooks as (
                insert into deliveries (event_id, channel, endpoint_id)
                select r.id, 'webhook', w.id
                  from routed r join webhook_endpoints w on r.type = any(w.event_types)
           ), mails as (
                insert into deliveries (event_id, channel)
                select r.id, 'mail' from routed r
                 where $2 and event_may_mail(r.type, r.payload)
           )
           select count(*) as "routed!" from routed"#,
        limit,
        mail,
    )
    .fetch_one(pool)
    .await
}

/// A delivery a dispatcher has claimed, with what it needs to send it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    pub id: i64,
    pub channel: String,
    /// Counting this one.
    pub attempts: i32,
    pub event_id: Uuid,
    pub event_type: String,
    pub version: i16,
    pub payload: Value,
    pub event_created_at: DateTime<Utc>,
    pub url: Option<String>,
    pub secret: Option<String>,
}

/// Deletes up to `limit` of the oldest events older than `retention` that are done with:
/// routed, with no delivery still pending (every delivery sent or given up), and their
/// deliveries. Rows another process is purging are skipped (`skip locked`), so every
/// process may run this at once. Returns how many events went.
///
/// Two statements in one transaction: the first locks the candidates, the second (with a
/// snapshot taken after those locks) checks again that none has a pending delivery and
/// deletes; one statement would judge "pending" by a snapshot older than its locks. An admin's [`resend`] takes the event's lock first, so it either made its
/// delivery pending before the second statement looked (the event stays), or waits for
/// this transaction and then finds the delivery gone.
pub async fn purge(pool: &PgPool, retention: Duration, limit: i64) -> sqlx::Result<u64> {
    let days = i32::try_from(retention.as_secs() / 86_400).unwrap_or(i32::MAX);
    let mut tx = pool.begin().await?;
    let locked = sqlx::query_scalar!(
        r#"select e.id from events e
            where e.created_at < now() - make_interval(days => $1)
              and e.routed_at is not null
              and not exists (select 1 from deliveries d
                               where d.event_id = e.id and d.status = 'pending')
            order by e.created_at
            limit $2
              for update skip locked"#,
        days,
        limit,
    )
    .fetch_all(&mut *tx)
    .await?;
    let purged = sqlx::query!(
        r#"with done as (
               select e.id from events e
                where e.id = any($1)
                  and not exists (select 1 from deliveries d
                                   where d.event_id = e.id and d.status = 'pending')
           ), deliveries_gone as (
               delete from deliveries d using done where d.event_id = done.id
           )
           delete from events e using done where e.id = done.id"#,
        &locked,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(purged)
}

/// Claims up to `limit` due deliveries for `lease`: each counts an attempt and is not due
/// again until the lease runs out, so a dispatcher that dies mid-send leaves it to be
/// claimed and sent again. Rows another dispatcher is claiming are skipped.
#[tracing::instrument(skip_all, fields(limit = limit))]
pub async fn claim(pool: &PgPool, limit: i64, lease: Duration) -> sqlx::Result<Vec<Claimed>> {
    sqlx::query_as!(
        Claimed,
        r#"with due as (
                select id from deliveries
                 where status = 'pending' and next_attempt_at <= now()
                 order by next_attempt_at limit $1
                   for update skip locked -- another dispatcher is claiming these
           ), claimed as (
                update deliveries d
                   set attempts = d.attempts + 1,
                       next_attempt_at = now() + make_interval(secs => $2)
                  from due where d.id = due.id
             returning d.id, d.channel, d.attempts, d.event_id, d.endpoint_id
           )
           select c.id as "id!", c.channel as "channel!", c.attempts as "attempts!",
                  c.event_id as "event_id!", e.type as event_type, e.version, e.payload,
                  e.created_at as event_created_at, w.url as "url?", w.secret
             from claimed c
             join events e on e.id = c.event_id
             left join webhook_endpoints w on w.id = c.endpoint_id"#,
        limit,
        lease.as_secs_f64(),
    )
    .fetch_all(pool)
    .await
}

/// What one attempt came to.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The receiver's HTTP status, when it answered.
    pub status: Option<u16>,
    /// The start of its answer, or what went wrong.
    pub response: Option<String>,
    pub error: Option<String>,
}

impl Attempt {
    /// An attempt that got no answer, for `error`, and whether it is worth another.
    pub fn failed(error: String, retry: bool) -> (Self, bool) {
        let attempt = Self {
            status: None,
            response: None,
            error: Some(error),
        };
        (attempt, retry)
    }
}

/// Marks a claimed delivery sent. False when the claim was lost (its lease ran out and
/// another dispatcher claimed it again): that one settles it.
#[tracing::instrument(skip_all)]
pub async fn mark_sent(pool: &PgPool, claimed: &Claimed, attempt: &Attempt) -> sqlx::Result<bool> {
    settle(pool, claimed, attempt, "sent", Duration::ZERO).await
}

/// Marks a claimed delivery failed for now: due again after `retry_in`, or failed for
/// good with `None`.
#[tracing::instrument(skip_all)]
pub async fn mark_unsent(
    pool: &PgPool,
    claimed: &Claimed,
    attempt: &Attempt,
    retry_in: Option<Duration>,
) -> sqlx::Result<bool> {
    match retry_in {
        Some(wait) => settle(pool, claimed, attempt, "pending", wait).await,
        None => settle(pool, claimed, attempt, "failed", Duration::ZERO).await,
    }
}

#[tracing::instrument(skip_all, fields(status = status))]
async fn settle(
    pool: &PgPool,
    claimed: &Claimed,
    attempt: &Attempt,
    status: &str,
    wait: Duration,
) -> sqlx::Result<bool> {
    let changed = sqlx::query!(
        r#"update deliveries
              set status = $3,
                  next_attempt_at = now() + make_interval(secs => $4),
                  sent_at = case when $3 = 'sent' then now() end,
                  last_status = $5, last_response = $6, last_error = $7
            where id = $1 and attempts = $2 and status = 'pending'"#,
        claimed.id,
        claimed.attempts,
        status,
        wait.as_secs_f64(),
        attempt.status.map(|s| s as i16),
        attempt.response.as_deref(),
        attempt.error.as_deref(),
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(changed == 1)
}

/// Sends delivery `id` again from the start (the admin's "resend"). False when there is
/// no such delivery. It first takes its event's row lock (shared), as the retention purge
/// takes it (exclusive, skipping locked rows) before deleting the event with its
/// deliveries: so either the purge skips the event and the delivery is pending when it
/// looks again, or the purge came first and this finds nothing — never "resent" for a
/// delivery the purge then deletes.
#[tracing::instrument(skip_all)]
pub async fn resend(pool: &PgPool, id: i64) -> sqlx::Result<bool> {
    let changed = sqlx::query!(
        r#"with kept as (
               select e.id from events e join deliveries d on d.event_id = e.id
                where d.id = $1
                  for share of e
           )
           update deliveries
              set status = 'pending', attempts = 0, next_attempt_at = now(), sent_at = null
            where id = $1 and event_id in (select id from kept)"#,
        id,
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(changed == 1)
}

/// How the outbox stands.
#[derive(Debug, Clone, Default, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Stats {
    /// Deliveries waiting to be sent, plus events not yet routed.
    pub pending: i64,
    /// Deliveries made in the last 24 hours that were sent, and that failed for good.
    pub sent: i64,
    pub failed: i64,
    /// Age of the oldest event or delivery still waiting, in seconds.
    pub oldest_pending_seconds: f64,
}

/// What is pending now and how old the oldest is (cheap: partial indexes).
#[tracing::instrument(skip_all)]
pub async fn pending(pool: &PgPool) -> sqlx::Result<(i64, f64)> {
    let row = sqlx::query!(
        r#"select (select count(*) from deliveries where status = 'pending')
                + (select count(*) from events where routed_at is null) as "pending!",
                  coalesce(extract(epoch from now() - least(
                      (select min(created_at) from deliveries where status = 'pending'),
                      (select min(created_at) from events where routed_at is null)))::float8, 0)
                  as "oldest_seconds!""#,
    )
    .fetch_one(pool)
    .await?;
    Ok((row.pending, row.oldest_seconds))
}

/// The counts the dashboard shows (a day's worth, so polling them stays cheap).
#[tracing::instrument(skip_all)]
pub async fn stats(pool: &PgPool) -> sqlx::Result<Stats> {
    let (pending, oldest_pending_seconds) = pending(pool).await?;
    let day = sqlx::query!(
        r#"select count(*) filter (where status = 'sent') as "sent!",
                  count(*) filter (where status = 'failed') as "failed!"
             from deliveries where created_at > now() - interval '24 hours'"#,
    )
    .fetch_one(pool)
    .await?;
    Ok(Stats {
        pending,
        sent: day.sent,
        failed: day.failed,
        oldest_pending_seconds,
    })
}

// ---------------------------------------------------------------- endpoints

/// A webhook endpoint as the admin sees it (never its secret, after creation).
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Endpoint {
    pub id: Uuid,
    pub url: String,
    pub event_types: Vec<String>,
    pub description: String,
    pub created_at: DateTime<Utc>,
}

#[tracing::instrument(skip_all)]
pub async fn insert_endpoint(
    conn: impl sqlx::PgExecutor<'_>,
    url: &str,
    types: &[EventType],
    description: &str,
    secret: &str,
) -> sqlx::Result<Endpoint> {
    let types: Vec<&str> = types.iter().map(|t| t.as_str()).collect();
    sqlx::query_as!(
        Endpoint,
        r#"insert into webhook_endpoints (id, url, event_types, description, secret)
           values ($1, $2, $3, $4, $5)
           returning id, url, event_types, description, created_at"#,
        Uuid::new_v4(),
        url,
        &types as &[&str],
        description,
        secret,
    )
    .fetch_one(conn)
    .await
}

#[tracing::instrument(skip_all)]
pub async fn endpoints(pool: &PgPool) -> sqlx::Result<Vec<Endpoint>> {
    sqlx::query_as!(
        Endpoint,
        "select id, url, event_types, description, created_at from webhook_endpoints order by created_at",
    )
    .fetch_all(pool)
    .await
}

/// Deletes an endpoint and its deliveries. False when there was none.
#[tracing::instrument(skip_all)]
pub async fn delete_endpoint(pool: &PgPool, id: Uuid) -> sqlx::Result<bool> {
    Ok(
        sqlx::query!("delete from webhook_endpoints where id = $1", id)
            .execute(pool)
            .await?
            .rows_affected()
            == 1,
    )
}

/// A delivery as the admin lists it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Delivery {
    pub id: i64,
    pub event_id: Uuid,
    pub event_type: String,
    pub channel: String,
    /// The endpoint's URL, or the receipt's address.
    pub destination: String,
    pub status: String,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_status: Option<i16>,
    pub last_response: Option<String>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
}

impl Delivery {
    /// The last answer in a few words, for the list.
    pub fn last(&self) -> String {
        let mut out = match self.last_status {
            Some(s) => format!("HTTP {s}"),
            None => String::new(),
        };
        if let Some(e) = &self.last_error {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(e);
        } else if let Some(r) = self.last_response.as_deref().filter(|r| !r.is_empty()) {
            out.push_str(": ");
            out.push_str(r);
        }
        out
    }
}

/// The latest deliveries, newest first; `status` narrows them.
#[tracing::instrument(skip_all)]
pub async fn deliveries(
    pool: &PgPool,
    status: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<Delivery>> {
    sqlx::query_as!(
        Delivery,
        r#"select d.id, d.event_id, e.type as event_type, d.channel,
                  coalesce(w.url, e.payload->>'email', '') as "destination!",
                  d.status, d.attempts, d.next_attempt_at, d.last_status, d.last_response,
                  d.last_error, d.created_at, d.sent_at
             from deliveries d
             join events e on e.id = d.event_id
             left join webhook_endpoints w on w.id = d.endpoint_id
            where ($1::text is null or d.status = $1)
            order by d.id desc limit $2"#,
        status,
        limit,
    )
    .fetch_all(pool)
    .await
}
