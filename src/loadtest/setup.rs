//! A run's stock: the scenario's SKUs set to the asked units, through the ledger.

use anyhow::Context;
use sqlx::PgPool;

use super::check::RedisTarget;
use super::{CATALOGUE_SKUS, HOT_SKU, LoadtestArgs, Scenario};
use crate::catalog::Sku;

/// Sets the scenario's SKUs to `args.stock` units, through the ledger: products are created
/// when missing, active holds on them released, and the difference recorded as an
/// adjustment by `loadtest`. The servers learn of the new stock as of an admin restock:
/// the SKUs' sold-out hints in `redis` are cleared (an earlier run's hint would otherwise
/// answer "sold out" for up to its TTL while the new stock waits).
pub async fn setup(
    db: &PgPool,
    redis: Option<&RedisTarget>,
    args: &LoadtestArgs,
) -> anyhow::Result<()> {
    let mut skus = vec![(
        HOT_SKU.to_string(),
        "Flash Drop: Numbered Edition".to_string(),
        19_900,
    )];
    if args.scenario != Scenario::FlashSale {
        skus.extend((1..=CATALOGUE_SKUS).map(|i| {
            (
                format!("LT-{i:04}"),
                format!("Load-test item {i}"),
                1_000 + 100 * i as i64,
            )
        }));
    }
    let redis = redis
        .map(|t| crate::locking::Redis::connect_lazy(&t.url, &t.prefix))
        .transpose()?;
    if redis.is_none() {
        eprintln!(
            "no --redis-url: a sold-out hint left by an earlier run may answer \"sold out\" \
             for a few seconds"
        );
    }
    let mut hinted = Vec::new();
    for (sku, name, price) in skus {
        let sku = Sku::parse(&sku)?;
        set_stock(db, &sku, &name, price, args.stock()).await?;
        if let Some(redis) = &redis
            && !redis.clear_sold_out(&sku).await
        {
            hinted.push(sku.to_string());
        }
    }
    if !hinted.is_empty() {
        eprintln!(
            "Redis did not answer: {} may answer \"sold out\" for a few seconds",
            hinted.join(", ")
        );
    }
    Ok(())
}

/// Sets one product to `units` (created when missing) and clears its sold-out hint.
pub(super) async fn reset_sku(
    db: &PgPool,
    redis: Option<&RedisTarget>,
    sku: &str,
    name: &str,
    price: i64,
    units: i32,
) -> anyhow::Result<()> {
    let sku = Sku::parse(sku)?;
    set_stock(db, &sku, name, price, units).await?;
    if let Some(target) = redis {
        let redis = crate::locking::Redis::connect_lazy(&target.url, &target.prefix)?;
        if !redis.clear_sold_out(&sku).await {
            eprintln!("Redis did not answer: {sku} may answer \"sold out\" for a few seconds");
        }
    }
    Ok(())
}

#[tracing::instrument(skip_all, fields(sku = %sku, units = units))]
async fn set_stock(
    db: &PgPool,
    sku: &Sku,
    name: &str,
    price: i64,
    units: i32,
) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    let created = sqlx::query!(
        "insert into products (sku, name, price_cents) values ($1, $2, $3) on conflict (sku) do nothing",
        sku.as_str(),
        name,
        price,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if created {
        crate::inventory::db::create_stock(&mut tx, sku, units, "loadtest").await?;
        tx.commit().await?;
        return Ok(());
    }
    tx.commit().await?;
    // Free what active holds keep, then adjust on_hand to the wanted number.
    let holds = sqlx::query_scalar!(
        r#"select distinct h.id from holds h join hold_lines l on l.hold_id = h.id
            where h.state = 'active' and l.sku = $1"#,
        sku.as_str(),
    )
    .fetch_all(db)
    .await?;
    for hold in holds {
        crate::holds::release(db, None, hold, "loadtest").await?;
    }
    let mut tx = db.begin().await?;
    let row = sqlx::query!(
        "select on_hand, reserved from stock where sku = $1 for update",
        sku.as_str(),
    )
    .fetch_one(&mut *tx)
    .await?;
    let (on_hand, reserved) = (row.on_hand, row.reserved);
    // The row is locked: the count cannot move between reading and setting it.
    let target = units.max(reserved);
    crate::inventory::db::adjust(&mut tx, sku, on_hand, target, "load test setup", "loadtest")
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Makes an unlimited API client, which may order without paying, for this run in `db` (the servers' database); its key.
pub async fn own_api_key(db: &PgPool) -> anyhow::Result<String> {
    let name = format!(
        "loadtest {}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let (client, key) = crate::clients::create(db, &name, crate::clients::Limit::Unlimited)
        .await
        .context("cannot make an API client for the load test")?;
    // Its plain orders are placed whether or not the shop takes payments.
    crate::clients::allow_unpaid_orders(db, client.id).await?;
    Ok(key)
}

/// Creates a new database beside the one `url` names; returns its URL.
pub(super) async fn fresh_database(url: &str, strategy: &str) -> anyhow::Result<String> {
    use sqlx::Connection;
    let (head, query) = url.split_once('?').map_or((url, ""), |(h, q)| (h, q));
    let (base, _) = head
        .rsplit_once('/')
        .context("DATABASE_URL has no database name")?;
    let name = format!(
        "loadtest_{}_{}",
        strategy.replace('-', "_"),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let mut conn = crate::pg::connect(url).await?;
    // A runtime string, not `query!`: a database name is an identifier and cannot be bound.
    sqlx::query(sqlx::AssertSqlSafe(format!(r#"create database "{name}""#)))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(match query {
        "" => format!("{base}/{name}"),
        q => format!("{base}/{name}?{q}"),
    })
}
