//! Stock levels and the ledger. Every change of `on_hand` or `reserved` goes through this
//! module and writes a `stock_movements` row in the same transaction, so the ledger always
//! sums to the stock row (invariant I1).

pub mod change;
pub mod db;
pub mod group;
pub mod ledger;
pub mod reports;

/// Stock of one SKU as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StockLevel {
    pub sku: String,
    pub on_hand: i32,
    pub reserved: i32,
}

/// A SKU whose stock row disagrees with its ledger.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct LedgerMismatch {
    pub sku: String,
    pub on_hand: i32,
    pub ledger_on_hand: i64,
    pub reserved: i32,
    pub ledger_reserved: i64,
}
