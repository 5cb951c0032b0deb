//! Invariant I9, checked against the provider's own records: money moved exactly as
//! orders say.
//!
//! - every captured intent belongs to exactly one order and equals its total, or was
//!   refunded in full (its order cancelled, or it never had one);
//! - every placed order paid through a hold has its intent captured;
//! - no authorization is left neither captured nor cancelled past the reconcile window
//!   once its hold is over or its order placed;
//! - every refund belongs to a cancelled order, or to a capture without an order.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::PgPool;

use super::Status;
use super::stripe::Stripe;

/// A payment as the check reads it: with its order, and whether it is past looking at.
#[derive(Debug, sqlx::FromRow)]
struct Row {
    hold_id: uuid::Uuid,
    payment_intent: Option<String>,
    order_id: Option<uuid::Uuid>,
    order_status: Option<String>,
    order_total: Option<i64>,
    /// Untouched for longer than the reconcile window.
    stale: bool,
    /// The hold ended (released, expired, purged, or past its time) without an order.
    hold_over: bool,
}

/// The rows that break I9 (empty when it holds), reading every intent and refund of the
/// provider's account and every payment of `db`. `window`: how long a finisher may take.
pub async fn i9_rows(
    db: &PgPool,
    stripe: &Stripe,
    window: Duration,
) -> anyhow::Result<Vec<String>> {
    let intents = stripe.all_intents().await?;
    let refunds = stripe.all_refunds().await?;
    let rows: Vec<Row> = sqlx::query_as(
        "select p.hold_id, p.payment_intent,
                o.id as order_id, o.status as order_status, o.total_cents as order_total,
                p.updated_at < now() - make_interval(secs => $1) as stale,
                (h.id is null or h.state in ('released', 'expired') or h.expires_at < now())
                  and o.id is null as hold_over
           from payments p
           left join holds h on h.id = p.hold_id
           left join orders o on o.id = coalesce(p.order_id, h.order_id)
          where p.payment_intent is not null",
    )
    .bind(window.as_secs_f64())
    .fetch_all(db)
    .await?;
    let by_intent: HashMap<&str, &Row> = rows
        .iter()
        .filter_map(|r| r.payment_intent.as_deref().map(|i| (i, r)))
        .collect();
    let mut refunded: HashMap<&str, i64> = HashMap::new();
    for refund in &refunds {
        if let Some(intent) = refund.payment_intent.as_deref() {
            *refunded.entry(intent).or_default() += refund.amount;
        }
    }
    let mut broken = Vec::new();
    let mut orders_paid: HashMap<uuid::Uuid, usize> = HashMap::new();
    for intent in &intents {
        let row = by_intent.get(intent.id.as_str());
        let back = refunded.get(intent.id.as_str()).copied().unwrap_or(0);
        match (intent.status, row) {
            (Status::Succeeded | Status::RequiresCapture, None) => broken.push(format!(
                "intent {} is {} at the provider but is no payment of this shop's",
                intent.id,
                intent.status.as_str()
            )),
            (Status::Succeeded, Some(row)) => {
                let placed = row.order_status.as_deref() == Some("placed");
                if placed {
                    *orders_paid
                        .entry(row.order_id.expect("placed"))
                        .or_default() += 1;
                    if row.order_total != Some(intent.amount) {
                        broken.push(format!(
                            "intent {} captured {} for order {} whose total is {}",
                            intent.id,
                            intent.amount,
                            row.order_id.expect("placed"),
                            row.order_total.unwrap_or_default()
                        ));
                    }
                    if back > 0 {
                        broken.push(format!(
                            "intent {} was refunded {back} though its order {} stands",
                            intent.id,
                            row.order_id.expect("placed")
                        ));
                    }
                } else if back != intent.amount && row.stale {
                    broken.push(format!(
                        "intent {} captured {} with no order standing (hold {}), refunded {back}",
                        intent.id, intent.amount, row.hold_id
                    ));
                }
            }
            (Status::RequiresCapture, Some(row))
                if row.stale && (row.hold_over || row.order_id.is_some()) =>
            {
                broken.push(format!(
                    "intent {} is authorized, neither captured nor cancelled, past the \
                     reconcile window (hold {}, order {})",
                    intent.id,
                    row.hold_id,
                    row.order_id.map_or("none".into(), |o| o.to_string())
                ))
            }
            _ => {}
        }
    }
    for (order, n) in &orders_paid {
        if *n > 1 {
            broken.push(format!("order {order} was paid by {n} captured intents"));
        }
    }
    let captured: HashSet<&str> = intents
        .iter()
        .filter(|i| i.status == Status::Succeeded)
        .map(|i| i.id.as_str())
        .collect();
    for row in &rows {
        let intent = row.payment_intent.as_deref().unwrap_or_default();
        if row.order_status.as_deref() == Some("placed") && row.stale && !captured.contains(intent)
        {
            broken.push(format!(
                "order {} stands but its payment {intent} is not captured at the provider",
                row.order_id.expect("placed")
            ));
        }
    }
    for refund in &refunds {
        let intent = refund.payment_intent.as_deref().unwrap_or_default();
        match by_intent.get(intent) {
            Some(row) if row.order_status.as_deref() != Some("placed") => {}
            Some(row) => broken.push(format!(
                "refund {} of intent {intent} belongs to order {}, which stands",
                refund.id,
                row.order_id.expect("placed")
            )),
            None => broken.push(format!(
                "refund {} of intent {intent} is for no payment of this shop's",
                refund.id
            )),
        }
    }
    Ok(broken)
}
