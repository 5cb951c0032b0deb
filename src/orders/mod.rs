//! Orders: the rows of a placed order ([`Order`], its [`OrderLine`]s) and what happens to
//! one afterwards ([`cancel`]). Orders are made by [`crate::checkout`] (and by confirming a
//! hold, [`crate::holds::confirm`]); this module stores and reads them and knows nothing of
//! how they were decided.

pub use crate::address;
pub mod db;
pub mod limits;
pub mod reports;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::catalog::{Sku, format_cents};

/// A new order's or hold's id: a UUIDv7, time-ordered with 74 random bits (no counter:
/// order and hold ids are what a shopper's confirmation and checkout pages are found by,
/// so an id must not tell its neighbours). Ids made one
/// after another sort one after another, so each insert lands on its primary key's last
/// page; random (v4) ids touch a random page of an index that grows with the shop's
/// history, and after every checkpoint each touched page is written whole to the WAL
/// (measured at 10 M rows: 3.1 kB of WAL per insert against 0.2 kB, ARCHITECTURE.md).
pub fn new_id() -> Uuid {
    Uuid::new_v7(uuid::Timestamp::now(uuid::NoContext))
}

/// Stores a fieldless enum in a `text` column as the names its `as_str` gives (the
/// column's `check` constraint lists the same names), and reads it back.
macro_rules! text_column {
    ($ty:ty) => {
        impl sqlx::Type<sqlx::Postgres> for $ty {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <str as sqlx::Type<sqlx::Postgres>>::type_info()
            }

            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl sqlx::Encode<'_, sqlx::Postgres> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<sqlx::Postgres>>::encode(self.as_str(), buf)
            }
        }

        impl sqlx::Decode<'_, sqlx::Postgres> for $ty {
            fn decode(
                value: sqlx::postgres::PgValueRef<'_>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                let raw = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
                Self::ALL
                    .into_iter()
                    .find(|v| v.as_str() == raw)
                    .ok_or_else(|| format!("{raw:?} is not a {}", stringify!($ty)).into())
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use text_column;

/// Where an order stands (`orders.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OrderStatus {
    /// Placed: its units are sold.
    Placed,
    /// Cancelled by an admin: its units went back to stock.
    Cancelled,
}

impl OrderStatus {
    pub const ALL: [Self; 2] = [Self::Placed, Self::Cancelled];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Placed => "placed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn is_placed(self) -> bool {
        self == Self::Placed
    }

    /// The status whose name is exactly `raw` (`placed`, `cancelled`), if any.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

text_column!(OrderStatus);

/// A placed order, as pages and the API show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Order {
    pub id: Uuid,
    /// The order's number for people (#1001, #1002 …): one per order, never repeated.
    /// (Absent only from answers recorded before orders had numbers.)
    #[serde(default)]
    pub number: i64,
    pub status: OrderStatus,
    pub lines: Vec<OrderLine>,
    pub total_cents: i64,
    pub email: Option<String>,
    pub customer_name: Option<String>,
    /// Where it is shipped, when the shopper gave an address (boxed: most orders in
    /// flight are answered and dropped, and an order without one stays small).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shipping_address: Option<Box<address::ShippingAddress>>,
    pub created_at: DateTime<Utc>,
    /// Its payment, when the shop takes payments and the order came from a paid hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment: Option<Box<PaymentSummary>>,
}

/// Who an order is for, as the shopper gave it: an email, a name, and where to ship.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Contact {
    pub email: Option<String>,
    pub name: Option<String>,
    /// Left out when absent, so a request without one keeps the fingerprint it always had.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shipping_address: Option<address::ShippingAddress>,
}

/// An order's payment, as its JSON carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PaymentSummary {
    /// The intent's status (`requires_capture`: authorized, `succeeded`: charged,
    /// `canceled`: released, nothing charged), or `refunded`.
    pub status: String,
    pub amount_cents: i64,
    /// ISO 4217, lower case.
    pub currency: String,
    /// The PaymentIntent (`pi_…`).
    pub payment_intent: Option<String>,
    /// What was refunded (an order cancelled after it was charged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refunded_cents: Option<i64>,
}

/// Order `number` as people read it (`#1001`); for an answer recorded before orders had
/// numbers, the first 8 characters of `id`.
pub fn reference(number: i64, id: Uuid) -> String {
    match number {
        0 => id.simple().to_string()[..8].to_uppercase(),
        n => format!("#{n}"),
    }
}

/// `order.placed`, built here so that [`crate::events`] needs nothing of this module.
impl crate::events::Event {
    /// `order.placed`: the order as the API shows it, with `order_id`.
    pub fn order_placed(order: &Order) -> Self {
        let mut payload = serde_json::to_value(order).expect("orders serialise");
        payload["order_id"] = serde_json::json!(order.id);
        Self {
            kind: crate::events::EventType::OrderPlaced,
            payload,
        }
    }
}

/// One line of a placed order, with the unit price captured when it was placed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct OrderLine {
    pub sku: Sku,
    pub name: String,
    pub quantity: i32,
    pub unit_price_cents: i64,
}

impl Order {
    pub fn total(&self) -> String {
        format_cents(self.total_cents)
    }

    /// The order's number as people read it: `#1001`.
    pub fn reference(&self) -> String {
        reference(self.number, self.id)
    }
}

impl OrderLine {
    /// The name as shown: numbers and their units never split across lines, as in the
    /// catalogue.
    pub fn display_name(&self) -> String {
        crate::text::keep_units_together(&self.name)
    }

    pub fn unit_price(&self) -> String {
        format_cents(self.unit_price_cents)
    }

    pub fn line_total(&self) -> String {
        format_cents(self.unit_price_cents * i64::from(self.quantity))
    }
}

/// A SKU an order wanted more of than was available.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Shortage {
    pub sku: String,
    pub requested: i32,
    pub available: i32,
}

/// What cancelling did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// Cancelled now; its units are back in stock.
    Now,
    /// It was cancelled before; nothing changed.
    Already,
}

/// Cancels order `id`, returning its units to stock through `cancel` ledger rows — once,
/// however many cancel at the same time (the order row is locked and its status checked).
pub async fn cancel(
    db: &sqlx::PgPool,
    id: Uuid,
    actor: &str,
    note: &str,
) -> sqlx::Result<Option<Cancelled>> {
    let mut tx = db.begin().await?;
    match db::lock_status(&mut tx, id).await? {
        None => return Ok(None),
        Some(OrderStatus::Cancelled) => return Ok(Some(Cancelled::Already)),
        Some(OrderStatus::Placed) => {}
    }
    let reference = id.to_string();
    for (sku, quantity) in db::lines_to_restock(&mut tx, id).await? {
        let entry = crate::inventory::db::Entry::of(quantity, 0, "cancel", actor)
            .for_ref(&reference)
            .noting(note);
        crate::inventory::db::add_on_hand(&mut tx, &sku, entry).await?;
    }
    db::set_cancelled(&mut tx, id).await?;
    let event = crate::events::Event::order_cancelled(id, actor, note);
    crate::events::db::record(&mut tx, event).await?;
    tx.commit().await?;
    Ok(Some(Cancelled::Now))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The names a `check (column in (…))` constraint of `migration` allows.
    pub(crate) fn allowed(migration: &str, column: &str) -> Vec<String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(migration);
        let sql = std::fs::read_to_string(path).unwrap();
        let from = sql
            .find(&format!("check ({column} in ("))
            .expect("a check constraint");
        let list = &sql[from..];
        let list = &list[list.find("in (").unwrap() + 4..list.find(')').unwrap()];
        list.split(',')
            .map(|s| s.trim().trim_matches('\'').to_string())
            .collect()
    }

    #[test]
    fn an_order_status_is_stored_and_shown_by_a_name_its_column_allows() {
        let names: Vec<String> = OrderStatus::ALL.iter().map(|s| s.as_str().into()).collect();
        assert_eq!(names, allowed("20261130000002_orders.sql", "status"));
        for s in OrderStatus::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
            assert_eq!(s.to_string(), s.as_str());
        }
    }

    #[test]
    fn an_order_status_is_read_back_from_its_name_and_nothing_else() {
        for s in OrderStatus::ALL {
            assert_eq!(OrderStatus::parse(s.as_str()), Some(s));
        }
        for raw in ["", "lost", "Placed", " placed", "cancelled "] {
            assert_eq!(OrderStatus::parse(raw), None, "{raw:?}");
        }
    }

    #[test]
    fn a_sku_from_json_is_checked_like_any_other_input() {
        let line: OrderLine = serde_json::from_value(
            serde_json::json!({"sku": "kb-1", "name": "K", "quantity": 1, "unit_price_cents": 5}),
        )
        .unwrap();
        assert_eq!(line.sku.as_str(), "KB-1");
        let bad = serde_json::json!({"sku": "no such", "name": "K", "quantity": 1, "unit_price_cents": 5});
        assert!(serde_json::from_value::<OrderLine>(bad).is_err());
    }
}
