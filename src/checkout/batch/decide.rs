//! Deciding a batch: its transaction, the allocation of each SKU's units to its jobs in
//! arrival order (purchase limits, and holds' caps across a shopper's holds, counted on
//! the way), and the columns of its one write.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::Utc;
use sqlx::PgPool;

use super::db;
use super::{BatchAnswer, Job};
use crate::catalog::Sku;
use crate::checkout::placement::{Made, OrderError, Want, made_record, short_record};
use crate::holds::cap::{self, Ask, Caps, Held, held_by};
use crate::holds::{Hold, HoldState};
use crate::orders::{Order, OrderLine, Shortage};

/// What the batch transaction did.
pub(super) enum Applied {
    Done(Answers),
    /// A newer lease wrote a row: nothing was written.
    StaleFence {
        last_fence: i64,
    },
    /// A key of the batch was recorded elsewhere while it ran: nothing was written.
    Raced,
}

/// One answer per job, in job order, and what the batch did to stock.
pub(super) struct Answers {
    pub(super) each: Vec<BatchAnswer>,
    /// SKUs the batch sold or held units of.
    pub(super) sold: Vec<Sku>,
    /// SKUs with nothing left after the batch.
    pub(super) sold_out: Vec<Sku>,
}

/// A SKU of the batch as its row and product say.
struct Stocked {
    left: i32,
    /// Units sold, and units held, by the batch.
    taken: i32,
    held: i32,
    name: String,
    price_cents: i64,
    limit: Option<i32>,
}

/// The batch's transaction (see the module documentation): under a lease, two statements
/// and no `BEGIN` when no SKU of the batch has a purchase limit; otherwise its stock rows
/// are locked first, in one transaction.
pub(super) async fn transact(
    db: &PgPool,
    jobs: &[&Job],
    fence: Option<i64>,
    hold_ttl: Duration,
    caps: Caps,
) -> sqlx::Result<Applied> {
    let mut skus: Vec<&str> = jobs
        .iter()
        .flat_map(|j| j.skus().map(Sku::as_str))
        .collect();
    skus.sort_unstable();
    skus.dedup();
    let asked = db::Asked {
        skus,
        scopes: jobs.iter().map(|j| j.scope.as_str()).collect(),
        keys: jobs.iter().map(|j| j.key.as_str()).collect(),
        orders: jobs.iter().filter(|j| j.want == Want::Order).count(),
    };
    let mut conn = db.acquire().await?;
    // A hold is counted with its shopper's other holds ([`crate::holds::cap`]), which
    // may be placed without a lease (the breaker open, another process's strategy): a
    // batch with a hold locks its rows, as one with a limited SKU does.
    let has_hold = jobs.iter().any(|j| j.want == Want::Hold);
    if fence.is_some() && !has_hold {
        // The lease keeps every other batch of these SKUs out, and the write re-checks
        // stock and fence. A purchase limit also counts holds and orders of several SKUs,
        // which take no lease: batches with a limited SKU lock their rows instead.
        let rows = asked.read(&mut conn).await?;
        if !rows.iter().any(|r| r.purchase_limit.is_some()) {
            return decide(&mut conn, jobs, rows, fence, hold_ttl, caps).await;
        }
    }
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let rows = asked.read_locking(&mut tx).await?;
    let applied = decide(&mut tx, jobs, rows, fence, hold_ttl, caps).await?;
    if matches!(applied, Applied::Done(_)) {
        tx.commit().await?;
    }
    Ok(applied)
}

/// Decides every job from `rows` and writes the decisions by one statement.
async fn decide(
    conn: &mut sqlx::PgConnection,
    jobs: &[&Job],
    rows: Vec<db::Row>,
    fence: Option<i64>,
    hold_ttl: Duration,
    caps: Caps,
) -> sqlx::Result<Applied> {
    // 1. A row a newer lease wrote refuses the batch. A SKU without an active product
    //    (gone, or no longer sold) refuses its own orders.
    if let Some(fence) = fence
        && let Some(last_fence) = rows.iter().map(|r| r.last_fence).max()
        && last_fence >= fence
    {
        return Ok(Applied::StaleFence { last_fence });
    }
    // Holds expire by the database's clock, the one the sweeper and confirmations read;
    // read before the write, so a hold lives its time or a moment less, never more.
    let expires_at = rows.first().map(|r| r.now).unwrap_or_else(Utc::now)
        + chrono::Duration::from_std(hold_ttl).expect("hold times fit");
    let expires_at = chrono::DateTime::from_timestamp_micros(expires_at.timestamp_micros())
        .expect("expiry is representable");
    let recorded: HashSet<usize> = rows
        .first()
        .map(|r| r.recorded.iter().map(|i| (*i - 1) as usize).collect())
        .unwrap_or_default();
    // One drawn number per order job, used in turn by the orders placed.
    let mut numbers = rows
        .first()
        .map(|r| r.numbers.clone())
        .unwrap_or_default()
        .into_iter();
    let mut stocked: HashMap<String, Stocked> = rows
        .into_iter()
        .filter(|r| r.active)
        .map(|r| {
            let entry = Stocked {
                left: r.available,
                taken: 0,
                held: 0,
                name: r.name,
                price_cents: r.price_cents,
                limit: r.purchase_limit,
            };
            (r.sku, entry)
        })
        .collect();

    // 2. Keys with a record already drop out (answered from it); the batch decides the
    //    others, the first of each key if one came twice. Their records are written with
    //    the orders; a request elsewhere that records one of them first makes the write
    //    fail, and the batch start again. Then allocate in arrival order, each job all
    //    or nothing over its SKUs (a cart's lines are taken together or not at all).
    let mut claims: HashSet<(&str, &str)> = jobs
        .iter()
        .enumerate()
        .filter(|(i, j)| {
            j.skus().all(|s| stocked.contains_key(s.as_str())) && !recorded.contains(i)
        })
        .map(|(_, j)| (j.scope.as_str(), j.key.as_str()))
        .collect();

    // Purchase limits: what each limited line's shopper bought or holds already (the
    //    rows are locked, so no other sale of these SKUs is in between), plus what the
    //    batch accepts for them on the way.
    let limited: Vec<(usize, &Sku, &Job)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, j)| j.skus().map(move |sku| (i, sku, *j)))
        .filter(|(_, sku, _)| stocked.get(sku.as_str()).is_some_and(|s| s.limit.is_some()))
        .collect();
    let asks: Vec<(&str, &[String])> = limited
        .iter()
        .map(|(_, sku, j)| (sku.as_str(), j.request.shopper().identities()))
        .collect();
    let counted = if asks.is_empty() {
        Vec::new()
    } else {
        crate::orders::db::bought_by(conn, &asks, None).await?
    };
    let mut bought: HashMap<(usize, &str), i64> = limited
        .iter()
        .map(|(i, sku, _)| (*i, sku.as_str()))
        .zip(counted)
        .collect();

    // Holds: what each hold's shopper keeps in live holds of its SKUs already (the rows
    //    are locked), plus what the batch holds for them on the way.
    let identities: Vec<(Vec<String>, Vec<String>)> = jobs
        .iter()
        .map(|j| match j.want {
            Want::Hold => j.request.shopper().hold_identities(),
            Want::Order => Default::default(),
        })
        .collect();
    let holding: Vec<(usize, &str)> = jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.want == Want::Hold)
        .flat_map(|(i, j)| j.skus().map(move |sku| (i, sku.as_str())))
        .collect();
    let asks: Vec<Ask> = holding
        .iter()
        .map(|(i, sku)| Ask {
            sku,
            persons: &identities[*i].0,
            addresses: &identities[*i].1,
        })
        .collect();
    let counted = held_by(conn, &asks).await?;
    drop(asks);
    let mut held: HashMap<(usize, &str), Held> = holding.into_iter().zip(counted).collect();

    let now = chrono::DateTime::from_timestamp_micros(Utc::now().timestamp_micros())
        .expect("now is representable");
    let mut each = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.iter().enumerate() {
        let unknown: Vec<String> = job
            .skus()
            .filter(|s| !stocked.contains_key(s.as_str()))
            .map(|s| s.to_string())
            .collect();
        if !unknown.is_empty() {
            each.push(BatchAnswer::Failed(OrderError::UnknownSkus(unknown)));
            continue;
        }
        // A key twice in the batch: the first holds the claim, the second replays it.
        if !claims.remove(&(job.scope.as_str(), job.key.as_str())) {
            each.push(BatchAnswer::DecidedElsewhere);
            continue;
        }
        let over = job.request.lines().iter().find_map(|line| {
            let (sku, q) = (line.sku.as_str(), line.quantity.get());
            let stock = &stocked[sku];
            let (limit, already) = (stock.limit?, *bought.get(&(i, sku))?);
            (already + i64::from(q) > i64::from(limit))
                .then(|| crate::orders::limits::refusal(&stock.name, limit, q, already))
        });
        if let Some(refusal) = over {
            each.push(BatchAnswer::Failed(OrderError::OverLimit(refusal)));
            continue;
        }
        let over_cap = job.request.lines().iter().find_map(|line| {
            let (sku, q) = (line.sku.as_str(), line.quantity.get());
            cap::refusal(&stocked[sku].name, q, *held.get(&(i, sku))?, caps)
        });
        if let Some(refusal) = over_cap {
            each.push(BatchAnswer::Failed(OrderError::OverLimit(refusal)));
            continue;
        }
        let shortages: Vec<Shortage> = job
            .request
            .lines()
            .iter()
            .filter(|line| line.quantity.get() > stocked[line.sku.as_str()].left)
            .map(|line| Shortage {
                sku: line.sku.to_string(),
                requested: line.quantity.get(),
                available: stocked[line.sku.as_str()].left.max(0),
            })
            .collect();
        if !shortages.is_empty() {
            each.push(BatchAnswer::Short(shortages));
            continue;
        }
        let mine = job.request.shopper().identities();
        let mut lines = Vec::with_capacity(job.request.lines().len());
        for line in job.request.lines() {
            let (sku, q) = (line.sku.as_str(), line.quantity.get());
            let stock = stocked
                .get_mut(sku)
                .expect("every SKU is stocked (checked above)");
            stock.left -= q;
            match job.want {
                Want::Order => stock.taken += q,
                Want::Hold => stock.held += q,
            }
            lines.push(OrderLine {
                sku: line.sku.clone(),
                name: stock.name.clone(),
                quantity: q,
                unit_price_cents: stock.price_cents,
            });
            // Later jobs in this batch by the same shopper count these units.
            for (j, later) in jobs.iter().enumerate().skip(i + 1) {
                if later.skus().any(|s| s.as_str() == sku)
                    && later
                        .request
                        .shopper()
                        .identities()
                        .iter()
                        .any(|id| mine.contains(id))
                    && let Some(count) = bought.get_mut(&(j, sku))
                {
                    *count += i64::from(q);
                }
                // And later holds of it by the same shopper, or from the same address.
                if let Some(count) = held.get_mut(&(j, sku)).filter(|_| job.want == Want::Hold) {
                    let shares = |a: &[String], b: &[String]| a.iter().any(|id| b.contains(id));
                    let (mine, theirs) = (&identities[i], &identities[j]);
                    if shares(&mine.0, &theirs.0) {
                        count.by_shopper += i64::from(q);
                    }
                    if shares(&mine.1, &theirs.1) {
                        count.by_address += i64::from(q);
                    }
                }
            }
        }
        let email = job.request.email().map(str::to_string);
        let customer_name = job.request.name().map(str::to_string);
        let total_cents = lines
            .iter()
            .map(|l| l.unit_price_cents * i64::from(l.quantity))
            .sum();
        each.push(BatchAnswer::Made(match job.want {
            Want::Order => Made::Order(Order {
                id: crate::orders::new_id(),
                number: numbers
                    .next()
                    .expect("a number was drawn for every order job"),
                status: crate::orders::OrderStatus::Placed,
                total_cents,
                lines,
                email,
                customer_name,
                shipping_address: job.request.shipping_address().cloned().map(Box::new),
                created_at: now,
                payment: None,
            }),
            Want::Hold => Made::Hold(Hold {
                id: crate::orders::new_id(),
                state: HoldState::Active,
                expires_at,
                lines,
                total_cents,
                email,
                customer_name,
                order_id: None,
            }),
        }));
    }

    // 3. One statement writes it all; it still refuses to take stock below zero or past a
    //    newer fence, and then writes nothing.
    let decided = columns(jobs, &each, &stocked, fence);
    if !decided.keys.is_empty() {
        match db::write(conn, &decided).await {
            Ok(true) => {}
            Ok(false) => return Ok(Applied::Raced),
            // A key (or its order) was recorded elsewhere meanwhile: start again.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                return Ok(Applied::Raced);
            }
            Err(e) => return Err(e),
        }
    }
    let sold = decided
        .moves
        .skus
        .iter()
        .filter_map(|sku| Sku::parse(sku).ok())
        .collect();
    let sold_out = stocked
        .iter()
        .filter(|(_, s)| s.left <= 0)
        .filter_map(|(sku, _)| Sku::parse(sku).ok())
        .collect();
    Ok(Applied::Done(Answers {
        each,
        sold,
        sold_out,
    }))
}

/// The batch's decisions as the columns [`db::write`] takes.
fn columns<'a>(
    jobs: &[&'a Job],
    each: &'a [BatchAnswer],
    stocked: &'a HashMap<String, Stocked>,
    fence: Option<i64>,
) -> db::Decided<'a> {
    let mut d = db::Decided::default();
    d.moves.fence = fence;
    let mut moved: Vec<(&str, i32, i32)> = stocked
        .iter()
        .filter(|(_, s)| s.taken > 0 || s.held > 0)
        .map(|(sku, s)| (sku.as_str(), s.taken, s.held))
        .collect();
    // SKU order, as every writer of stock rows locks them.
    moved.sort_unstable();
    for (sku, taken, held) in moved {
        d.moves.skus.push(sku);
        d.moves.sold.push(taken);
        d.moves.held.push(held);
        d.moves.released.push(0);
    }
    for (job, answer) in jobs.iter().zip(each) {
        let (scope, key) = (job.scope.as_str(), job.key.as_str());
        let shopper = job.request.shopper().identities();
        let record = match answer {
            BatchAnswer::Made(made @ Made::Order(order)) => {
                // Sold from free stock; the ledger's actor is the key's scope.
                d.orders.add(order, (scope, key), shopper, false, scope);
                made_record(made)
            }
            BatchAnswer::Made(made @ Made::Hold(hold)) => {
                let h = &mut d.holds;
                h.ids.push(hold.id);
                h.names.push(hold.customer_name.as_deref());
                h.emails.push(hold.email.as_deref());
                h.scopes.push(scope);
                h.keys.push(key);
                h.expires.push(hold.expires_at);
                h.shoppers.push(shopper.join("\n"));
                for line in &hold.lines {
                    h.line_holds.push(hold.id);
                    h.line_scopes.push(scope);
                    h.skus.push(line.sku.as_str());
                    h.quantities.push(line.quantity);
                    h.prices.push(line.unit_price_cents);
                }
                h.events.push(made.event().payload);
                made_record(made)
            }
            BatchAnswer::Short(shortages) => short_record(shortages),
            _ => continue,
        };
        d.key_scopes.push(scope);
        d.keys.push(key);
        d.fingerprints.push(job.fingerprint.as_str());
        d.statuses.push(record.status as i16);
        d.bodies.push(record.body);
    }
    d
}
