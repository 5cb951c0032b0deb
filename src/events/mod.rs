//! Events out: what happened in the shop, told to the outside world without losing or
//! inventing any.
//!
//! - [`db::record`] / [`db::record_many`] write an event into the outbox (`events`) on the
//!   transaction of the change it reports, so a committed change always has its event and
//!   a rolled-back one never does. `stock.low` and `stock.sold_out` are written by the
//!   stock row's trigger (see the `events` migration), since every path changes that row.
//! - [`dispatch`] runs in every process: it routes new events to deliveries (one per
//!   matching webhook endpoint, one receipt per placed order with an email when mail is
//!   on), and sends due deliveries, claiming rows with `for update skip locked` and a
//!   lease, so two processes never send one delivery at once and a process that dies
//!   mid-send leaves it to be sent again: at least once, never "at most once".
//! - [`sign`] signs webhook bodies (Standard Webhooks); [`target`] refuses URLs that point
//!   into private networks; [`mail`] renders and sends receipts.
//! - [`db::purge`] (run by [`crate::retention`]) deletes events older than
//!   `STOCKADE_EVENT_RETENTION_DAYS` once every delivery of theirs is sent or given up,
//!   with those deliveries: the outbox stays as big
//!   as the window, not as the shop's history (orders and the stock ledger keep that).

pub mod db;
pub mod dispatch;
pub mod mail;
pub mod sign;
pub mod target;

use serde_json::{Value, json};
use uuid::Uuid;

/// The kinds of event, as receivers see them in `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    OrderPlaced,
    OrderCancelled,
    HoldPlaced,
    HoldConfirmed,
    HoldReleased,
    HoldExpired,
    StockLow,
    StockSoldOut,
    StockAdjusted,
    DropOpened,
    DropSoldOut,
    DropEnded,
}

impl EventType {
    pub const ALL: [EventType; 12] = [
        Self::OrderPlaced,
        Self::OrderCancelled,
        Self::HoldPlaced,
        Self::HoldConfirmed,
        Self::HoldReleased,
        Self::HoldExpired,
        Self::StockLow,
        Self::StockSoldOut,
        Self::StockAdjusted,
        Self::DropOpened,
        Self::DropSoldOut,
        Self::DropEnded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::OrderPlaced => "order.placed",
            Self::OrderCancelled => "order.cancelled",
            Self::HoldPlaced => "hold.placed",
            Self::HoldConfirmed => "hold.confirmed",
            Self::HoldReleased => "hold.released",
            Self::HoldExpired => "hold.expired",
            Self::StockLow => "stock.low",
            Self::StockSoldOut => "stock.sold_out",
            Self::StockAdjusted => "stock.adjusted",
            Self::DropOpened => "drop.opened",
            Self::DropSoldOut => "drop.sold_out",
            Self::DropEnded => "drop.ended",
        }
    }

    /// Parses a type name as receivers see it.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == raw.trim())
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An event to record: its type and its payload (`data` in what receivers get). The
/// events whose payload is a whole order or hold are built beside those types
/// (`order_placed` in [`crate::orders`], `hold_placed` in [`crate::holds`]), so this
/// module, which delivers events, needs nothing of the modules that record them.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventType,
    pub payload: Value,
}

impl Event {
    pub fn order_cancelled(order_id: Uuid, actor: &str, note: &str) -> Self {
        Self {
            kind: EventType::OrderCancelled,
            payload: json!({ "order_id": order_id, "actor": actor, "note": note }),
        }
    }

    pub fn hold_confirmed(hold_id: Uuid, order_id: Uuid) -> Self {
        Self {
            kind: EventType::HoldConfirmed,
            payload: json!({ "hold_id": hold_id, "order_id": order_id }),
        }
    }

    pub fn hold_released(hold_id: Uuid, actor: &str) -> Self {
        Self {
            kind: EventType::HoldReleased,
            payload: json!({ "hold_id": hold_id, "actor": actor }),
        }
    }

    pub fn hold_expired(hold_id: Uuid) -> Self {
        Self {
            kind: EventType::HoldExpired,
            payload: json!({ "hold_id": hold_id }),
        }
    }

    /// `stock.adjusted`: an admin's restock (`delta` > 0) or count (`reason` `adjust`).
    pub fn stock_adjusted(sku: &str, reason: &str, delta: i32, on_hand: i32, actor: &str) -> Self {
        Self {
            kind: EventType::StockAdjusted,
            payload: json!({
                "sku": sku, "reason": reason, "delta": delta, "on_hand": on_hand, "actor": actor
            }),
        }
    }
}

/// The body a receiver gets for an event (Standard Webhooks' shape: `type`, `timestamp`,
/// `data`; plus `id` and `version`).
pub fn body(
    id: Uuid,
    kind: &str,
    version: i16,
    created_at: chrono::DateTime<chrono::Utc>,
    payload: &Value,
) -> String {
    json!({
        "id": id,
        "type": kind,
        "version": version,
        "timestamp": created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "data": payload,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_parses_back_from_its_name() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
        }
        assert_eq!(EventType::parse("order.shipped"), None);
    }
}
