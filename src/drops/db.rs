//! Drops' SQL: creating one, changing its state with its event on the same transaction,
//! and the admissions the checker counts orders against.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use super::{Drop, NewDrop, Queueing, Status};
use crate::events::{Event, EventType, db::record};

/// Why a drop could not be made or changed, in words.
#[derive(Debug, thiserror::Error)]
pub enum DropError {
    #[error("{0}")]
    Invalid(String),
    #[error("There is no product {0:?}.")]
    NoProduct(String),
    #[error("Product {0} already has a drop that has not ended; end it first.")]
    AlreadyLive(String),
    #[error("There is no drop {0}.")]
    NotFound(Uuid),
    #[error("This drop has ended; it cannot be {0}.")]
    Over(&'static str),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

struct Row {
    id: Uuid,
    sku: String,
    opens_at: DateTime<Utc>,
    prequeue_seconds: i32,
    queueing: String,
    admit_per_minute: i32,
    max_active: Option<i32>,
    session_seconds: i32,
    status: String,
    binds_at: DateTime<Utc>,
    opened_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    secret: Vec<u8>,
}

impl From<Row> for Drop {
    fn from(r: Row) -> Self {
        Drop {
            id: r.id,
            sku: r.sku,
            opens_at: r.opens_at,
            prequeue_seconds: r.prequeue_seconds,
            queueing: Queueing::parse(&r.queueing).unwrap_or(Queueing::Fifo),
            admit_per_minute: r.admit_per_minute,
            max_active: r.max_active,
            session_seconds: r.session_seconds,
            status: Status::parse(&r.status),
            binds_at: r.binds_at,
            opened_at: r.opened_at,
            ended_at: r.ended_at,
            created_at: r.created_at,
            secret: r.secret,
        }
    }
}

/// Creates a drop; it binds its product [`super::BIND_AFTER`] from now.
pub async fn create(db: &PgPool, new: &NewDrop) -> Result<Drop, DropError> {
    new.check(Utc::now()).map_err(DropError::Invalid)?;
    let secret: Vec<u8> = {
        use rand::RngCore as _;
        let mut key = vec![0u8; 32];
        rand::rng().fill_bytes(&mut key);
        key
    };
    let bind_after = super::BIND_AFTER.as_millis() as f64 / 1000.0;
    let inserted = sqlx::query_as!(
        Row,
        r#"insert into drops (id, sku, opens_at, prequeue_seconds, queueing, admit_per_minute,
                              max_active, session_seconds, binds_at, secret)
           select $1, p.sku, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9), $10
             from products p where p.sku = $2
           returning id, sku, opens_at, prequeue_seconds, queueing, admit_per_minute,
                     max_active, session_seconds, status, binds_at, opened_at, ended_at,
                     created_at, secret"#,
        Uuid::now_v7(),
        new.sku,
        new.opens_at,
        new.prequeue_seconds,
        new.queueing.as_str(),
        new.admit_per_minute,
        new.max_active,
        new.session_seconds,
        bind_after,
        secret,
    )
    .fetch_optional(db)
    .await;
    match inserted {
        Ok(Some(row)) => Ok(row.into()),
        Ok(None) => Err(DropError::NoProduct(new.sku.clone())),
        Err(sqlx::Error::Database(e)) if e.constraint() == Some("drops_one_live_per_sku") => {
            Err(DropError::AlreadyLive(new.sku.clone()))
        }
        Err(e) => Err(e.into()),
    }
}

/// Drops that have not ended, oldest first.
pub async fn live(db: &PgPool) -> sqlx::Result<Vec<Drop>> {
    let rows = sqlx::query_as!(
        Row,
        r#"select id, sku, opens_at, prequeue_seconds, queueing, admit_per_minute, max_active,
                  session_seconds, status, binds_at, opened_at, ended_at, created_at, secret
             from drops where ended_at is null order by created_at"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Drop::from).collect())
}

/// The latest `limit` drops, newest first.
pub async fn recent(db: &PgPool, limit: i64) -> sqlx::Result<Vec<Drop>> {
    let rows = sqlx::query_as!(
        Row,
        r#"select id, sku, opens_at, prequeue_seconds, queueing, admit_per_minute, max_active,
                  session_seconds, status, binds_at, opened_at, ended_at, created_at, secret
             from drops order by created_at desc limit $1"#,
        limit
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Drop::from).collect())
}

pub async fn get(db: &PgPool, id: Uuid) -> sqlx::Result<Option<Drop>> {
    let row = sqlx::query_as!(
        Row,
        r#"select id, sku, opens_at, prequeue_seconds, queueing, admit_per_minute, max_active,
                  session_seconds, status, binds_at, opened_at, ended_at, created_at, secret
             from drops where id = $1"#,
        id
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(Drop::from))
}

/// What an admin can do to a drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Pause,
    Resume,
    End,
}

impl std::str::FromStr for Change {
    type Err = ();

    /// `pause`, `resume` or `end`, as the addresses spell them.
    fn from_str(raw: &str) -> Result<Self, ()> {
        [Self::Pause, Self::Resume, Self::End]
            .into_iter()
            .find(|c| c.as_str() == raw)
            .ok_or(())
    }
}

impl Change {
    /// As the addresses spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::End => "end",
        }
    }

    fn past(self) -> &'static str {
        match self {
            Self::Pause => "paused",
            Self::Resume => "resumed",
            Self::End => "ended",
        }
    }
}

/// Applies `change` (with `drop.ended` on the same transaction when it ends the drop);
/// true when it changed something, false when the drop was in that state already (a
/// second press of the same button).
pub async fn change(db: &PgPool, id: Uuid, change: Change, actor: &str) -> Result<bool, DropError> {
    let mut tx = db.begin().await?;
    let current = sqlx::query!("select status, sku from drops where id = $1 for update", id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(DropError::NotFound(id))?;
    let status = Status::parse(&current.status);
    let target = match change {
        Change::Pause => Status::Paused,
        Change::Resume => Status::Scheduled,
        Change::End => Status::Ended,
    };
    if status == target || (change == Change::End && status.is_over()) {
        return Ok(false);
    }
    if status.is_over() {
        return Err(DropError::Over(change.past()));
    }
    sqlx::query!(
        r#"update drops set status = $2,
                  ended_at = case when $2 = 'ended' then now() else ended_at end
            where id = $1"#,
        id,
        target.as_str()
    )
    .execute(&mut *tx)
    .await?;
    if change == Change::End {
        let payload = json!({ "drop_id": id, "sku": current.sku, "actor": actor });
        record(&mut tx, event(EventType::DropEnded, payload)).await?;
    }
    tx.commit().await?;
    Ok(true)
}

fn event(kind: EventType, payload: serde_json::Value) -> Event {
    Event { kind, payload }
}

/// Records `drop.opened` once, by whichever process gets here first after the opening.
pub async fn mark_opened(db: &PgPool, drop: &Drop) -> sqlx::Result<bool> {
    let mut tx = db.begin().await?;
    let updated = sqlx::query!(
        "update drops set opened_at = now()
          where id = $1 and opened_at is null and ended_at is null and opens_at <= now()",
        drop.id
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if updated == 1 {
        let payload = json!({ "drop_id": drop.id, "sku": drop.sku, "opens_at": drop.opens_at });
        record(&mut tx, event(EventType::DropOpened, payload)).await?;
    }
    tx.commit().await?;
    Ok(updated == 1)
}

/// Ends the drop as sold out (with `drop.sold_out`) when every unit of its product is sold:
/// none on hand (units in carts may come back, and go to the queue); once, by whichever
/// process sees it first.
pub async fn mark_sold_out_if_gone(db: &PgPool, drop: &Drop) -> sqlx::Result<bool> {
    let mut tx = db.begin().await?;
    let updated = sqlx::query!(
        "update drops d set status = 'sold_out', ended_at = now()
           from stock s
          where d.id = $1 and d.ended_at is null and d.opens_at <= now()
            and s.sku = d.sku and s.on_hand <= 0",
        drop.id
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if updated == 1 {
        let payload = json!({ "drop_id": drop.id, "sku": drop.sku });
        record(&mut tx, event(EventType::DropSoldOut, payload)).await?;
    }
    tx.commit().await?;
    Ok(updated == 1)
}

/// Writes an admission before its pass is shown, and returns the one recorded for its
/// identity: this one, or (again, or after Redis lost part of its queue and let the
/// identity in under another ticket) the first, whose ticket and expiry the pass then
/// carries: one identity, one admission.
pub async fn record_admission(
    db: &PgPool,
    drop_id: Uuid,
    admission: &super::queue::Admission,
) -> sqlx::Result<(Uuid, DateTime<Utc>)> {
    let recorded = sqlx::query!(
        r#"with new as (
               insert into drop_admissions (drop_id, ticket, identity, key_owner, admitted_at, expires_at)
               values ($1, $2, $3, $4, $5, $6) on conflict do nothing
               returning ticket, expires_at)
           select ticket as "ticket!", expires_at as "expires_at!" from new
           union all
           select ticket, expires_at from drop_admissions where drop_id = $1 and identity = $3"#,
        drop_id,
        admission.ticket,
        admission.identity,
        admission.key_owner,
        admission.admitted_at,
        admission.expires_at,
    )
    .fetch_all(db)
    .await?;
    Ok(recorded
        .first()
        .map_or((admission.ticket, admission.expires_at), |r| {
            (r.ticket, r.expires_at)
        }))
}

/// What the admin's live view counts from PostgreSQL: units sold since the opening and
/// units left to sell.
pub struct Sales {
    pub sold: i64,
    pub left: i64,
}

pub async fn sales(db: &PgPool, drop: &Drop) -> sqlx::Result<Sales> {
    let row = sqlx::query!(
        r#"select coalesce((select sum(l.quantity) from order_lines l join orders o on o.id = l.order_id
                             where l.sku = $1 and o.created_at >= $2 and o.status = 'placed'), 0)::bigint as "sold!",
                  coalesce((select on_hand - reserved from stock where sku = $1), 0)::bigint as "left!""#,
        drop.sku,
        drop.binds_at,
    )
    .fetch_one(db)
    .await?;
    Ok(Sales {
        sold: row.sold,
        left: row.left,
    })
}

/// An admission as recorded.
#[derive(Debug, Clone)]
pub struct AdmissionRow {
    pub ticket: Uuid,
    pub identity: String,
    pub admitted_at: DateTime<Utc>,
}

/// Drop `id`'s admissions, in the order they were let in.
pub async fn admissions(db: &PgPool, id: Uuid) -> sqlx::Result<Vec<AdmissionRow>> {
    sqlx::query_as!(
        AdmissionRow,
        "select ticket, identity, admitted_at from drop_admissions
          where drop_id = $1 order by admitted_at, ticket",
        id
    )
    .fetch_all(db)
    .await
}
