//! The workloads: what their requests do, what each expects, and the products, stock
//! and holds each starts with.

use std::sync::Arc;

use clap::ValueEnum;
use sqlx::PgPool;

use super::load::Work;
use super::pgbench;

/// What the requests do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Orders of one unit of one SKU whose stock never runs out.
    HotSku,
    /// Holds of one unit of that SKU (what the storefront's "Checkout" button places),
    /// through `POST /api/v1/holds`.
    HoldHot,
    /// Confirmations of holds of that SKU placed beforehand ("Place order"), each once,
    /// through `POST /api/v1/holds/{id}/confirm`.
    Confirm,
    /// Orders of one unit of a SKU picked uniformly from `--skus`.
    Uniform,
    /// Carts: orders of one unit of the hot SKU and one of a SKU picked uniformly from
    /// `--skus`.
    Cart,
    /// Shoppers in a hot drop, through the shop's HTML forms with cookies and CSRF
    /// tokens: product page, add to cart, cart, "Checkout", checkout page, "Place order";
    /// measured in completed checkouts.
    Storefront,
    /// Checkouts paid by card through a provider (a fresh localstripe): a hold, its
    /// payment, its confirmation over the JSON API; measured in completed checkouts,
    /// beside the provider's own rate for the same calls.
    PaidCheckout,
    /// Orders for a SKU with no stock: every answer is 409.
    SoldOut,
    /// GET /products/{sku}, the HTML page, of a SKU picked uniformly from `--skus`, from a
    /// server whose page cache is off: every page is a cold read.
    ProductPage,
    /// GET /?q=WORD, the catalogue page searched for one of [`SEARCH_WORDS`] words (each
    /// in the descriptions of a hundredth of `--skus`), from a server whose page cache is
    /// off: every page is a cold read of the listing and its category counts.
    Search,
    /// Orders of quantity 0, refused (422) before any database or Redis work: HTTP, the API
    /// key, JSON and validation alone.
    Refused,
}

impl Workload {
    /// Every workload, in the order a full bench runs them.
    pub const ALL: [Self; 11] = [
        Self::HotSku,
        Self::HoldHot,
        Self::Confirm,
        Self::Cart,
        Self::Storefront,
        Self::PaidCheckout,
        Self::Uniform,
        Self::SoldOut,
        Self::ProductPage,
        Self::Search,
        Self::Refused,
    ];

    /// Whether `--soak` can run it for hours: a request workload that runs out of nothing
    /// (confirmations run out of seeded holds; the storefront is a flow, not a request).
    pub fn soaks(self) -> bool {
        !matches!(self, Self::Confirm | Self::Storefront | Self::PaidCheckout)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::HotSku => "hot-sku",
            Self::HoldHot => "hold-hot",
            Self::Confirm => "confirm",
            Self::Uniform => "uniform",
            Self::Cart => "cart",
            Self::Storefront => "storefront",
            Self::PaidCheckout => "paid-checkout",
            Self::SoldOut => "sold-out",
            Self::ProductPage => "product-page",
            Self::Search => "search",
            Self::Refused => "refused",
        }
    }

    /// Whether requests place orders (and so depend on the strategy and get checked).
    pub fn orders(self) -> bool {
        matches!(
            self,
            Self::HotSku
                | Self::HoldHot
                | Self::Confirm
                | Self::Uniform
                | Self::Cart
                | Self::Storefront
                | Self::PaidCheckout
                | Self::SoldOut
        )
    }

    /// What each request of this workload sends (`skus`: how many the uniform one spreads
    /// over; `holds`: how many the confirmations go through); `None` for the storefront, whose shoppers send a flow of requests
    /// ([`super::storefront`]).
    pub fn work(self, skus: usize, holds: i64) -> Option<Work> {
        let work = match self {
            Self::HotSku => Work::Order {
                path: ORDERS,
                skus: Arc::new(vec![HOT_SKU.to_string()]),
                quantity: 1,
            },
            Self::HoldHot => Work::Order {
                path: "/api/v1/holds",
                skus: Arc::new(vec![HOT_SKU.to_string()]),
                quantity: 1,
            },
            Self::Confirm => Work::Confirm {
                paths: Arc::new(
                    (1..=holds)
                        .map(|n| format!("/api/v1/holds/{}/confirm", bench_hold(n)))
                        .collect(),
                ),
                next: Arc::default(),
            },
            Self::Uniform => Work::Order {
                path: ORDERS,
                skus: Arc::new((1..=skus).map(uniform_sku).collect()),
                quantity: 1,
            },
            Self::Cart => Work::Cart {
                hot: HOT_SKU.to_string(),
                skus: Arc::new((1..=skus).map(uniform_sku).collect()),
            },
            Self::SoldOut => Work::Order {
                path: ORDERS,
                skus: Arc::new(vec![SOLD_OUT_SKU.to_string()]),
                quantity: 1,
            },
            Self::Refused => Work::Order {
                path: ORDERS,
                skus: Arc::new(vec![HOT_SKU.to_string()]),
                quantity: 0,
            },
            Self::ProductPage => Work::Page {
                paths: Arc::new(
                    (1..=skus)
                        .map(|n| format!("/products/{}", uniform_sku(n)))
                        .collect(),
                ),
            },
            Self::Search => Work::Page {
                paths: Arc::new(
                    (1..=SEARCH_WORDS)
                        .map(|n| format!("/?q={}", search_word(n)))
                        .collect(),
                ),
            },
            Self::Storefront | Self::PaidCheckout => return None,
        };
        Some(work)
    }

    /// The settings this workload's servers get beyond the bench's own.
    pub fn server_settings(self) -> Vec<(&'static str, String)> {
        let setting = |name, value: &str| (name, value.to_string());
        match self {
            // Checkout forms have no API client: they count against their address's
            // bucket, and every shopper here comes from 127.0.0.1. The API workloads'
            // client is unlimited; these are the shop's highest limits. Likewise the live
            // holds one address may keep of a product: every shopper holds the hot SKU
            // from 127.0.0.1 (each shopper's own cap stays).
            Self::Storefront => vec![
                setting("STOCKADE_RATE_LIMIT_PER_MINUTE", "1000000"),
                setting("STOCKADE_RATE_LIMIT_BURST", "1000000"),
                setting("STOCKADE_HOLD_MAX_PER_SKU_PER_ADDRESS", "1000000"),
            ],
            // The page's cost when it misses the cache, which is what a drop's first
            // visitors and a crawler's random pages meet.
            Self::ProductPage | Self::Search => vec![setting("STOCKADE_PAGE_CACHE_MS", "0")],
            _ => Vec::new(),
        }
    }

    /// The status every answer should have (the storefront's: that of "Place order", a
    /// 303 to the order's page, which completes a checkout).
    pub fn expected_status(self) -> u16 {
        match self {
            Self::Storefront => 303,
            Self::HotSku
            | Self::HoldHot
            | Self::Confirm
            | Self::Uniform
            | Self::Cart
            | Self::PaidCheckout => 201,
            Self::SoldOut => 409,
            Self::ProductPage | Self::Search => 200,
            Self::Refused => 422,
        }
    }
}

/// Confirmations a second that the `confirm` workload's seeded holds are enough for,
/// over a whole run (warm-up included): well above what one server confirms.
const CONFIRMS_PER_SECOND_SEEDED: f64 = 20_000.0;

/// Holds the `confirm` workload's database starts with, for a run of `seconds` (warm-up
/// included): more than it confirms, and no more, as seeding them is most of a short
/// run's time.
pub fn confirm_holds(seconds: f64) -> i64 {
    (seconds * CONFIRMS_PER_SECOND_SEEDED).ceil().max(1_000.0) as i64
}

/// The id of the `n`th hold seeded for `confirm` (1-based), as the seed's SQL makes it.
pub fn bench_hold(n: i64) -> uuid::Uuid {
    uuid::Uuid::from_u128(n as u128)
}

/// Where orders are posted.
const ORDERS: &str = "/api/v1/orders";

/// The hot SKU (also the product page's and the holds').
pub const HOT_SKU: &str = "BENCH-HOT";
/// The SKU with no stock.
pub const SOLD_OUT_SKU: &str = "BENCH-SOLD";
/// Units of the hot SKU: more than any run can sell.
pub const HOT_STOCK: i32 = 10_000_000;
/// Units of each uniform SKU.
pub const UNIFORM_STOCK: i32 = 1_000_000;
/// The uniform SKUs' names in SQL, from pgbench's `:n` (see [`uniform_sku`]).
pub const UNIFORM_SKU_SQL: &str = "('BENCH-' || lpad(:n::text, 5, '0'))";

/// How many words the `search` workload searches for, each in the description of one in
/// `SEARCH_WORDS` products.
pub const SEARCH_WORDS: usize = 100;
/// The search words in SQL, from pgbench's `:w` (see [`search_word`]), as the prefix
/// tsquery the page asks for.
pub const SEARCH_WORD_SQL: &str = "('tag' || lpad(:w::text, 3, '0') || ':*')";

/// The `n`th search word (1-based): `tag001` to `tag100`.
pub fn search_word(n: usize) -> String {
    format!("tag{n:03}")
}

/// The `n`th uniform SKU (1-based).
pub fn uniform_sku(n: usize) -> String {
    format!("BENCH-{n:05}")
}

/// Products and stock for `workload`, each with its `initial` ledger row (as
/// `inventory::db::create_stock` writes it), set-based so 10,000 SKUs take one commit;
/// for `confirm`, `holds` holds as well.
pub(super) async fn seed(
    db: &PgPool,
    workload: Workload,
    skus: usize,
    holds: i64,
) -> anyhow::Result<()> {
    let (names, units): (Vec<String>, i32) = match workload {
        Workload::HotSku
        | Workload::HoldHot
        | Workload::Confirm
        | Workload::Storefront
        | Workload::PaidCheckout
        | Workload::Refused => (vec![HOT_SKU.into()], HOT_STOCK),
        Workload::Uniform | Workload::ProductPage | Workload::Search => {
            ((1..=skus).map(uniform_sku).collect(), UNIFORM_STOCK)
        }
        Workload::Cart => {
            let mut names: Vec<String> = (1..=skus).map(uniform_sku).collect();
            names.push(HOT_SKU.into());
            (names, HOT_STOCK)
        }
        Workload::SoldOut => (vec![SOLD_OUT_SKU.into()], 0),
    };
    let mut tx = db.begin().await?;
    sqlx::query!(
        r#"insert into products (sku, name, price_cents)
           select sku, 'Bench item ' || sku, $2 from unnest($1::text[]) sku"#,
        &names,
        pgbench::PRICE_CENTS,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "insert into stock (sku, on_hand) select sku, $2 from unnest($1::text[]) sku",
        &names,
        units,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"insert into stock_movements (sku, delta, reason, actor)
           select sku, $2, 'initial', 'bench' from unnest($1::text[]) sku"#,
        &names,
        units,
    )
    .execute(&mut *tx)
    .await?;
    if workload == Workload::Confirm {
        seed_holds(&mut tx, holds).await?;
    }
    if workload == Workload::Search {
        // The search words of `search_word` and `SEARCH_WORD_SQL`, and ten categories.
        sqlx::query!(
            r#"update products
                  set description = 'Bench item tagged tag'
                          || lpad((substr(sku, 7)::int % 100 + 1)::text, 3, '0'),
                      category = 'Shelf ' || (substr(sku, 7)::int % 10)"#,
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// `n` active holds of one unit of the hot SKU ([`bench_hold`] names them), with their
/// lines, their stock reserved and a ledger row each, as placing them writes.
async fn seed_holds(tx: &mut sqlx::PgConnection, n: i64) -> anyhow::Result<()> {
    let (sku, price) = (HOT_SKU, pgbench::PRICE_CENTS);
    sqlx::query!(
        r#"insert into holds (id, state, expires_at, idempotency_scope, idempotency_key)
           select lpad(to_hex(n), 32, '0')::uuid, 'active', now() + interval '1 day',
                  'api-hold', 'bench-hold-' || n
             from generate_series(1, $1::bigint) as n"#,
        n,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"insert into hold_lines (hold_id, sku, quantity, unit_price_cents)
           select lpad(to_hex(n), 32, '0')::uuid, $2, 1, $3
             from generate_series(1, $1::bigint) as n"#,
        n,
        sku,
        price,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"insert into stock_movements (sku, delta, reserved_delta, reason, reference, actor)
           select $2, 0, 1, 'hold', lpad(to_hex(n), 32, '0')::uuid::text, 'api-hold'
             from generate_series(1, $1::bigint) as n"#,
        n,
        sku,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "update stock set reserved = reserved + $1::bigint::int where sku = $2",
        n,
        sku,
    )
    .execute(&mut *tx)
    .await?;
    // pgbench's script confirms the holds in turn.
    sqlx::query!("create sequence pgbench_confirm")
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_skus_in_rust_and_in_pgbench_sql_agree() {
        assert_eq!(uniform_sku(7), "BENCH-00007");
        assert!(UNIFORM_SKU_SQL.contains("lpad(:n::text, 5, '0')"));
        assert!(crate::catalog::Sku::parse(&uniform_sku(99_999)).is_ok());
    }

    #[test]
    fn search_words_in_rust_and_in_pgbench_sql_agree() {
        assert_eq!(search_word(7), "tag007");
        assert_eq!(
            crate::catalog::browse::prefix_tsquery(&search_word(7)).as_deref(),
            Some("tag007:*")
        );
        assert!(SEARCH_WORD_SQL.contains("'tag' || lpad(:w::text, 3, '0') || ':*'"));
    }
}
