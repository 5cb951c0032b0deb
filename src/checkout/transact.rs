//! Step 4, the one transaction of an order or hold and its one commit: the key claimed,
//! conditional stock changes in SKU order, purchase limits (and a hold's cap across the
//! shopper's holds) counted under the stock rows' locks, the order or hold and its lines,
//! the ledger rows, the outbox event, and the key completed with the answer.

use chrono::Utc;
use sqlx::{Acquire as _, PgConnection};

use super::kind::Draft;
use super::placement::{Deps, Keyed, Made, OrderError, made_record};
use super::request::OrderRequest;
use crate::catalog::Sku;
use crate::events;
use crate::idempotency::{self, Begin, Found};
use crate::inventory::db::Take;
use crate::orders::db::{self as order_rows, OrderProduct};
use crate::orders::limits;
use crate::orders::{OrderLine, Shortage};

pub(super) enum Tx {
    Done {
        made: Made,
        sold_out: Vec<Sku>,
    },
    Short(Vec<Shortage>),
    StaleFence {
        last_fence: i64,
    },
    /// Another request decided the key first (what its record says now); nothing was
    /// written.
    Decided(Found),
}

/// The one transaction of an order or hold, and its one commit: the key's claim, the
/// stock changes, the order or hold, the ledger rows, and the completed key.
pub(super) async fn transact(
    deps: Deps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
    fence: Option<i64>,
    held: Option<&mut PgConnection>,
) -> Result<Tx, OrderError> {
    let id = crate::orders::new_id();
    let reference = id.to_string();
    let actor = keyed.scope.as_str();

    let mut tx = match held {
        Some(conn) => conn.begin().await?,
        None => deps.db.begin().await?,
    };
    // Claimed inside the transaction: a concurrent request with the same key waits here
    // for this one to end, and a request that dies leaves no record behind.
    let k = keyed;
    let claim = match idempotency::begin_in(&mut tx, k.scope, k.key, &k.fingerprint, k.stale_after)
        .await?
    {
        Begin::Started(claim) => claim,
        Begin::Replay(stored) => {
            tx.rollback().await?;
            return Ok(Tx::Decided(Found::Completed(stored)));
        }
        Begin::Mismatch => {
            tx.rollback().await?;
            return Ok(Tx::Decided(Found::Mismatch));
        }
        Begin::InFlight => {
            tx.rollback().await?;
            return Ok(Tx::Decided(Found::InFlight));
        }
    };
    let mut shortages = Vec::new();
    let mut sold_out = Vec::new();
    // Lines are sorted by SKU: every order locks stock rows in the same order.
    for line in request.lines() {
        let q = line.quantity.get();
        let take = keyed
            .want
            .take(
                &mut tx,
                deps.settings,
                (&line.sku, q),
                fence,
                &reference,
                actor,
            )
            .await?;
        match take {
            Take::Taken { left } => {
                if left == 0 {
                    sold_out.push(line.sku.clone());
                }
            }
            Take::Short { available } => shortages.push(Shortage {
                sku: line.sku.to_string(),
                requested: q,
                available: available.max(0),
            }),
            Take::StaleFence { last_fence } => {
                tx.rollback().await?;
                return Ok(Tx::StaleFence { last_fence });
            }
        }
    }
    if !shortages.is_empty() {
        tx.rollback().await?;
        return Ok(Tx::Short(shortages));
    }

    // Prices as of this transaction, captured on the lines.
    let products = order_rows::products_for(&mut *tx, &request.skus()).await?;
    // Purchase limits, counted under the stock rows' locks taken above.
    if let Some(refusal) = over_limit(&mut tx, request, &products).await? {
        tx.rollback().await?;
        return Err(OrderError::OverLimit(refusal));
    }
    // A hold: the shopper's live holds of each product counted together, likewise.
    let want = keyed.want;
    if let Some(refusal) = want
        .over_cap(&mut tx, deps.settings, request, &products)
        .await?
    {
        tx.rollback().await?;
        return Err(OrderError::OverLimit(refusal));
    }
    let lines: Vec<OrderLine> = request
        .lines()
        .iter()
        .map(|line| {
            // A product deactivated since the check at the start cannot be sold.
            let product = products
                .iter()
                .find(|p| p.sku == line.sku.as_str())
                .ok_or_else(|| OrderError::UnknownSkus(vec![line.sku.to_string()]))?;
            Ok(OrderLine {
                sku: line.sku.clone(),
                name: product.name.clone(),
                quantity: line.quantity.get(),
                unit_price_cents: product.price_cents,
            })
        })
        .collect::<Result<_, OrderError>>()?;
    let draft = Draft {
        id,
        total_cents: lines
            .iter()
            .map(|l| l.unit_price_cents * i64::from(l.quantity))
            .sum(),
        lines,
        request,
        now: chrono::DateTime::from_timestamp_micros(Utc::now().timestamp_micros())
            .expect("now is representable"),
    };
    let Some(made) = want.insert(&mut tx, deps.settings, draft, keyed).await? else {
        // The key already has its order or hold, from before its record was purged.
        tx.rollback().await?;
        return Ok(Tx::Decided(Found::Absent));
    };
    events::db::record(&mut tx, made.event()).await?;
    if !idempotency::complete(&mut tx, &claim, &made_record(&made)).await? {
        // Our claim was taken over as stale; the other request decides.
        tx.rollback().await?;
        return Ok(Tx::Decided(Found::InFlight));
    }
    tx.commit().await?;
    Ok(Tx::Done { made, sold_out })
}

/// Why `request` may not be placed by its shopper: a line that would take them past its
/// product's purchase limit, counting what they bought or hold already. `None`: it may.
async fn over_limit(
    conn: &mut PgConnection,
    request: &OrderRequest,
    products: &[OrderProduct],
) -> sqlx::Result<Option<String>> {
    let lines: Vec<(&str, i32)> = request
        .lines()
        .iter()
        .map(|l| (l.sku.as_str(), l.quantity.get()))
        .collect();
    let identities = request.shopper().identities();
    limits::over_limit(conn, &lines, identities, products, None).await
}
