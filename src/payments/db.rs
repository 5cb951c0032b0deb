//! The `payments` and `payment_events` rows. Every change is conditional on the state it
//! moves from, so two finishers that both got past the lease (one whose lease lapsed)
//! record each step once.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::{Payment, Status};

/// Every [`Payment`] column, for a `select` or a `returning`.
macro_rules! columns {
    () => {
        "hold_id, payment_intent, client_secret, amount_cents, currency, status, order_id,
         attempt, decline_code, decline_message, extended, captured_cents, refund_id,
         refunded_cents, settled"
    };
}

/// `select` of every [`Payment`] column, then `$rest` (a filter, an order).
macro_rules! payments {
    ($rest:literal) => {
        concat!("select ", columns!(), " from payments ", $rest)
    };
}

/// `update payments $set`, answering the row as it became.
macro_rules! update {
    ($set:literal) => {
        concat!("update payments ", $set, " returning ", columns!())
    };
}

/// Hold `hold`'s payment, if one was started.
pub async fn find(db: &PgPool, hold: Uuid) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as(payments!("where hold_id = $1"))
        .bind(hold)
        .fetch_optional(db)
        .await
}

/// The payment of intent `intent`, if it is one of this shop's.
pub async fn find_by_intent(db: &PgPool, intent: &str) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as(payments!("where payment_intent = $1"))
        .bind(intent)
        .fetch_optional(db)
        .await
}

/// The payment that paid for order `order`: linked to it, or made for the hold that
/// became it (a finisher stopped before linking them).
pub async fn for_order(db: &PgPool, order: Uuid) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as(payments!(
        "where order_id = $1
            or (order_id is null and hold_id = (select id from holds where order_id = $1))"
    ))
    .bind(order)
    .fetch_optional(db)
    .await
}

/// Claims the making of hold `hold`'s intent: a new row, or one whose maker stopped more
/// than `stale` ago. `false`: someone else is making it.
pub async fn claim_creation(
    db: &PgPool,
    hold: Uuid,
    amount_cents: i64,
    currency: &str,
    stale: Duration,
) -> sqlx::Result<bool> {
    let claimed = sqlx::query_scalar!(
        r#"insert into payments (hold_id, amount_cents, currency, status)
           values ($1, $2, $3, 'creating')
           on conflict (hold_id) do update set updated_at = now()
            where payments.status = 'creating'
              and payments.updated_at < now() - make_interval(secs => $4)
           returning hold_id"#,
        hold,
        amount_cents,
        currency,
        stale.as_secs_f64(),
    )
    .fetch_optional(db)
    .await?;
    Ok(claimed.is_some())
}

/// Gives up a creation claim whose call went unanswered: the next try makes the intent
/// again (with the same idempotency key, so Stripe answers the same intent).
pub async fn drop_creation(db: &PgPool, hold: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "delete from payments where hold_id = $1 and status = 'creating'",
        hold
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Records the intent made for hold `hold`, and answers the payment; the reconciler looks
/// once the hold has ended (until then it is the shopper's turn).
pub async fn created(
    db: &PgPool,
    hold: Uuid,
    intent: &str,
    client_secret: Option<&str>,
    status: Status,
    reconcile_after: Duration,
) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as(update!(
        "set payment_intent = $2, client_secret = $3, status = $4, updated_at = now(),
             reconcile_at = greatest(now(), (select expires_at from holds where id = $1))
                            + make_interval(secs => $5)
          where hold_id = $1 and status = 'creating'"
    ))
    .bind(hold)
    .bind(intent)
    .bind(client_secret)
    .bind(status)
    .bind(reconcile_after.as_secs_f64())
    .fetch_optional(db)
    .await
}

/// Replaces hold `hold`'s declined intent `old` with `new` (made for the next card);
/// `false` when another finisher moved it on meanwhile.
pub async fn replace_intent(
    db: &PgPool,
    hold: Uuid,
    old: &str,
    new: &str,
    client_secret: Option<&str>,
) -> sqlx::Result<bool> {
    let replaced = sqlx::query!(
        "update payments
            set payment_intent = $3, client_secret = $4, status = 'requires_payment_method',
                decline_code = null, decline_message = null, updated_at = now()
          where hold_id = $1 and payment_intent = $2 and status = 'requires_payment_method'",
        hold,
        old,
        new,
        client_secret,
    )
    .execute(db)
    .await?;
    Ok(replaced.rows_affected() == 1)
}

/// Records the intent's status after the shopper's step (a card authorized, 3-D Secure
/// asked), and answers the payment: the reconciler looks once the hold has ended, as until
/// then it is the shopper's turn (and its look would only make their next step wait for
/// the lease).
pub async fn shoppers_turn(
    db: &PgPool,
    hold: Uuid,
    status: Status,
    window: Duration,
) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as(update!(
        "set status = $2, updated_at = now(),
             reconcile_at = greatest(now(), (select expires_at from holds where id = $1))
                            + make_interval(secs => $3)
          where hold_id = $1 and status <> 'canceled'"
    ))
    .bind(hold)
    .bind(status)
    .bind(window.as_secs_f64())
    .fetch_optional(db)
    .await
}

/// Records the intent's status as the provider last gave it, and when to look again.
pub async fn record(
    db: &PgPool,
    hold: Uuid,
    status: Status,
    look_again_in: Duration,
) -> sqlx::Result<()> {
    sqlx::query!(
        "update payments
            set status = $2, updated_at = now(),
                reconcile_at = now() + make_interval(secs => $3),
                settled = settled or $2 = 'canceled'
          where hold_id = $1 and status <> 'canceled'",
        hold,
        status as Status,
        look_again_in.as_secs_f64(),
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Records a decline: the intent wants another payment method, and the next attempt
/// gets a key of its own.
pub async fn declined(
    db: &PgPool,
    hold: Uuid,
    code: &str,
    message: &str,
    reconcile_after: Duration,
) -> sqlx::Result<()> {
    let code: String = code.chars().take(100).collect();
    let message: String = message.chars().take(500).collect();
    sqlx::query!(
        "update payments
            set status = 'requires_payment_method', attempt = attempt + 1,
                decline_code = $2, decline_message = $3, updated_at = now(),
                reconcile_at = now() + make_interval(secs => $4)
          where hold_id = $1 and status <> 'canceled'",
        hold,
        code,
        message,
        reconcile_after.as_secs_f64(),
    )
    .execute(db)
    .await?;
    Ok(())
}

/// The card is about to be confirmed for hold `hold`'s payment, in one statement: the
/// hold, if live, is extended once (to at least `by` from now), and the payment written
/// ahead as `processing`, looked at again within `window` (stopped between the
/// authorization and its record, whoever comes next asks the provider first). `false`:
/// the hold is not live, so nothing is confirmed.
pub async fn begin_charge(
    db: &PgPool,
    hold: Uuid,
    by: Duration,
    window: Duration,
) -> sqlx::Result<bool> {
    let live = sqlx::query_scalar!(
        "with live as (
             select h.id, p.extended
               from holds h join payments p on p.hold_id = h.id
              where h.id = $1 and h.state = 'active' and h.expires_at > now()
                for update of h, p
         ), extend as (
             update holds
                set expires_at = greatest(expires_at, now() + make_interval(secs => $2)),
                    updated_at = now()
              where id = (select id from live where not extended)
         )
         update payments
            set extended = true, status = 'processing', updated_at = now(),
                reconcile_at = now() + make_interval(secs => $3)
          where hold_id = (select id from live) and status <> 'canceled'
         returning hold_id",
        hold,
        by.as_secs_f64(),
        window.as_secs_f64(),
    )
    .fetch_optional(db)
    .await?;
    Ok(live.is_some())
}

/// Puts hold `hold`'s payment up for the reconciler's look `within` from now (sooner than
/// it was, never later), and answers it: a finisher about to place its order, so that if
/// it stops the reconciler finishes after it within the window.
pub async fn due_within(
    db: &PgPool,
    hold: Uuid,
    within: Duration,
) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as(update!(
        "set reconcile_at = case when settled then reconcile_at
                                 else least(reconcile_at, now() + make_interval(secs => $2)) end
          where hold_id = $1"
    ))
    .bind(hold)
    .bind(within.as_secs_f64())
    .fetch_optional(db)
    .await
}

/// Links the payment to order `order`, the order its hold became, while it is authorized
/// or captured, and records its capture (`captured`) once: settled unless the order was
/// cancelled meanwhile. `None`: the payment was cancelled meanwhile (the order must not
/// stand unpaid).
pub async fn paid_for(
    db: &PgPool,
    hold: Uuid,
    order: Uuid,
    captured: bool,
) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as(update!(
        "p set order_id = $2, updated_at = now(),
               status = case when $3 then 'succeeded' else p.status end,
               captured_cents = case when $3 then coalesce(p.captured_cents, p.amount_cents)
                                     else p.captured_cents end,
               settled = case when $3 and p.captured_cents is null
                              then p.refund_id is null
                                   and exists (select 1 from orders o
                                                where o.id = $2 and o.status = 'placed')
                              else p.settled end
          where hold_id = $1 and (order_id = $2 or order_id is null)
            and status in ('requires_capture', 'succeeded', 'processing')"
    ))
    .bind(hold)
    .bind(order)
    .bind(captured)
    .fetch_optional(db)
    .await
}

/// Records the capture, once; settled unless its order was cancelled meanwhile.
pub async fn captured(db: &PgPool, hold: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "update payments p
            set status = 'succeeded', captured_cents = amount_cents, updated_at = now(),
                settled = p.refund_id is null
                          and exists (select 1 from orders o
                                       where o.id = p.order_id and o.status = 'placed')
          where hold_id = $1 and captured_cents is null",
        hold,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Records the refund, once.
pub async fn refunded(db: &PgPool, hold: Uuid, refund: &str, cents: i64) -> sqlx::Result<()> {
    sqlx::query!(
        "update payments
            set refund_id = $2, refunded_cents = $3, settled = true, updated_at = now()
          where hold_id = $1 and refund_id is null and captured_cents is not null",
        hold,
        refund,
        cents,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Marks the payment settled: nothing is left to do for it.
pub async fn settle(db: &PgPool, hold: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "update payments set settled = true, updated_at = now() where hold_id = $1",
        hold
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Claims up to `limit` unsettled payments due a look (skipping those another process
/// claimed), and puts their next look `again` from now.
pub async fn claim_due(db: &PgPool, limit: i64, again: Duration) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!(
        "update payments set reconcile_at = now() + make_interval(secs => $2)
          where hold_id in (select hold_id from payments
                             where not settled and reconcile_at <= now()
                             order by reconcile_at
                             limit $1
                             for update skip locked)
          returning hold_id",
        limit,
        again.as_secs_f64(),
    )
    .fetch_all(db)
    .await
}

/// Notes provider event `id` as handled; `false` when it was already.
pub async fn note_event(db: &PgPool, id: &str, kind: &str) -> sqlx::Result<bool> {
    let kind: String = kind.chars().take(100).collect();
    let fresh = sqlx::query_scalar!(
        "insert into payment_events (id, type) values ($1, $2)
         on conflict (id) do nothing returning id",
        id,
        kind,
    )
    .fetch_optional(db)
    .await?;
    Ok(fresh.is_some())
}

/// Whether event `id` was handled before.
pub async fn seen_event(db: &PgPool, id: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select exists (select 1 from payment_events where id = $1) as "seen!""#,
        id
    )
    .fetch_one(db)
    .await
}

/// Every payment, for `stockade check`.
pub async fn all(db: &PgPool) -> sqlx::Result<Vec<Payment>> {
    sqlx::query_as(payments!("order by created_at"))
        .fetch_all(db)
        .await
}
