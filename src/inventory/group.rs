//! The stock of many SKUs changed by one statement: the first part of the group-commit
//! writes (a batch of orders and holds, a lot of confirmations), which go on to insert
//! what the change is for only if every SKU's row took it.
//!
//! It states the same guard as [`super::db::take_stock`] and its kin, for many rows at once:
//! no row goes below zero free units, or below zero reserved, or under a newer fence. Those
//! are compile-time-checked statements of one row each; this one is a fragment the writes
//! are assembled from, so it is text ([`stock_sql`]) and checked by the tests that run it.

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryScalar;

/// The statement's opening parts, on parameters `$1`–`$5` ([`Moves`]): `sold`, the rows
/// updated, and `go`, true only if every SKU's row was; every later part runs
/// `where (select go from go)`.
macro_rules! stock_sql {
    () => {
        r#"with sold as (
               update stock s
                  set on_hand = s.on_hand - u.sold,
                      reserved = s.reserved + u.held - u.released,
                      last_fence = greatest(s.last_fence, $5),
                      updated_at = now()
                 from unnest($1::text[], $2::int[], $3::int[], $4::int[])
                      as u(sku, sold, held, released)
                where s.sku = u.sku
                  and s.on_hand - s.reserved >= u.sold + u.held - u.released
                  and s.reserved >= u.released
                  and ($5::bigint is null or s.last_fence < $5)
               returning s.sku
           ), go as (
               select count(*) = cardinality($1::text[]) as go from sold
           )"#
    };
}
pub(crate) use stock_sql;

/// What one statement does to each SKU's row (each SKU once, in SKU order, as every
/// writer of several stock rows locks them).
#[derive(Debug, Default)]
pub struct Moves<'a> {
    pub skus: Vec<&'a str>,
    /// Units sold from free stock or from what was reserved: `on_hand −= q`.
    pub sold: Vec<i32>,
    /// Units newly reserved: `reserved += q`.
    pub held: Vec<i32>,
    /// Units no longer reserved (a confirmed hold's, sold): `reserved −= q`.
    pub released: Vec<i32>,
    /// The fence of the writer's lease; `None` without one (its rows are then locked).
    pub fence: Option<i64>,
}

impl<'a> Moves<'a> {
    /// Binds `$1`–`$5`.
    pub fn bind<'q>(
        &'q self,
        query: QueryScalar<'q, Postgres, bool, PgArguments>,
    ) -> QueryScalar<'q, Postgres, bool, PgArguments> {
        query
            .bind(&self.skus)
            .bind(&self.sold)
            .bind(&self.held)
            .bind(&self.released)
            .bind(self.fence)
    }
}
