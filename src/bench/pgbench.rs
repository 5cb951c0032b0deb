//! PostgreSQL's own limit: `pgbench` running the minimal SQL of the work a request does,
//! against the same database server the app uses.
//!
//! The scripts write what the app writes, with the real columns, so the invariant checker
//! would pass on a database pgbench sold from: the idempotency record claimed and completed,
//! the conditional stock update, one ledger row, the order and its line, one COMMIT. What
//! they leave out is everything that is not SQL: HTTP, JSON, leases, the pool, and the
//! reads the app makes before it decides (the key's record, prices and availability).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

use super::Workload;

/// The price every bench product is seeded with, which the scripts' orders capture.
pub const PRICE_CENTS: i64 = 1_000;

/// What pgbench measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PgbenchResult {
    /// The script's name, e.g. `order-hot-sku`.
    pub script: String,
    /// Transactions per second, without the initial connection time.
    pub tps: f64,
    pub transactions: u64,
    pub failed: u64,
    pub clients: usize,
    pub seconds: u64,
    /// Open loop (`-R`): the rate pgbench scheduled transactions at.
    pub offered_rate: Option<f64>,
    /// Open loop: latency from each transaction's scheduled start (its run time plus how
    /// late it started), in milliseconds.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Bytes of WAL the cluster wrote per transaction over the run.
    pub wal_per_transaction: Option<f64>,
}

/// `pgbench`: on `PATH`, else next to `postgres`, else in Debian's versioned folders
/// (the newest), as local mode finds the server's binaries.
pub fn find() -> anyhow::Result<PathBuf> {
    if let Some(p) = crate::local::find_binary("pgbench") {
        return Ok(p);
    }
    if let Some(postgres) =
        crate::local::find_binary("postgres").and_then(|p| std::fs::canonicalize(p).ok())
        && let Some(p) = postgres.parent().map(|d| d.join("pgbench"))
        && p.is_file()
    {
        return Ok(p);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let p = e.path().join("bin/pgbench");
            p.is_file().then_some((version, p))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p).context(
        "pgbench not found: it ships with PostgreSQL (Debian/Ubuntu: apt-get install \
         postgresql-client, or the postgresql server package)",
    )
}

/// A script's idempotency key: one random key per transaction and client.
const KEY: &str = "'pgbench-' || :client_id::text || '-' || :k::text";

/// The key claimed (`{claim}`) and completed with a 201 (`{complete}`), under `{scope}`,
/// as every placement does around its change.
const CLAIM: &str = "insert into idempotency_keys (scope, key, fingerprint, state, owner)
     values ('{scope}', {key}, 'pgbench', 'in_flight', gen_random_uuid())
     on conflict (scope, key) do nothing;";
const COMPLETE: &str = "update idempotency_keys
   set state = 'completed', response_status = 201, response_body = '{}', completed_at = now()
 where scope = '{scope}' and key = {key} and state = 'in_flight';";

/// `text` with its key's claim, completion and scope written out.
fn keyed(text: &str, scope: &str) -> String {
    text.replace("{claim}", CLAIM)
        .replace("{complete}", COMPLETE)
        .replace("{scope}", scope)
        .replace("{key}", KEY)
}

/// The one-SKU order transaction; `{pick}` chooses the SKU, `{sku}` is its SQL expression.
const ORDER: &str = r#"-- One order of one unit, written as the app writes it, in one transaction.
\set k random(1, 9000000000000000000)
{pick}
begin;
{claim}
update stock set on_hand = on_hand - 1, updated_at = now()
 where sku = {sku} and on_hand - reserved >= 1;
insert into stock_movements (sku, delta, reason, reference, actor)
     values ({sku}, -1, 'order', md5({key}), 'pgbench');
insert into orders (id, total_cents, idempotency_scope, idempotency_key)
     values (md5({key})::uuid, {price}, '{scope}',
             {key});
insert into order_lines (order_id, sku, quantity, unit_price_cents)
     values (md5({key})::uuid, {sku}, 1, {price});
{complete}
commit;
"#;

/// A cart's transaction: one unit of a uniform SKU and one of the hot SKU, their rows
/// updated in SKU order (`BENCH-0…` before `BENCH-HOT`), as the app locks them.
const CART: &str = r#"-- One cart (a uniform SKU and the hot SKU, a unit each), as the app writes it.
\set k random(1, 9000000000000000000)
\set n random(1, {skus})
begin;
{claim}
update stock set on_hand = on_hand - 1, updated_at = now()
 where sku = {side} and on_hand - reserved >= 1;
update stock set on_hand = on_hand - 1, updated_at = now()
 where sku = {hot} and on_hand - reserved >= 1;
insert into stock_movements (sku, delta, reason, reference, actor)
     values ({side}, -1, 'order', md5({key}), 'pgbench'),
            ({hot}, -1, 'order', md5({key}), 'pgbench');
insert into orders (id, total_cents, idempotency_scope, idempotency_key)
     values (md5({key})::uuid, 2 * {price}, '{scope}',
             {key});
insert into order_lines (order_id, sku, quantity, unit_price_cents)
     values (md5({key})::uuid, {side}, 1, {price}),
            (md5({key})::uuid, {hot}, 1, {price});
{complete}
commit;
"#;

/// The one-SKU hold transaction: as an order, with `reserved += 1` and a hold row.
const HOLD: &str = r#"-- One hold of one unit, written as the app writes it, in one transaction.
\set k random(1, 9000000000000000000)
begin;
{claim}
update stock set reserved = reserved + 1, updated_at = now()
 where sku = {sku} and on_hand - reserved >= 1;
insert into stock_movements (sku, delta, reserved_delta, reason, reference, actor)
     values ({sku}, 0, 1, 'hold', md5({key}), 'pgbench');
insert into holds (id, state, expires_at, idempotency_scope, idempotency_key)
     values (md5({key})::uuid, 'active',
             now() + interval '10 minutes', '{scope}',
             {key});
insert into hold_lines (hold_id, sku, quantity, unit_price_cents)
     values (md5({key})::uuid, {sku}, 1, {price});
{complete}
commit;
"#;

/// A confirmation: the next seeded hold locked, its reserved unit sold, the order, its
/// line, its ledger row, the hold marked confirmed; one commit.
const CONFIRM: &str = r#"-- One hold confirmed, written as the app writes it, in one transaction.
select nextval('pgbench_confirm') as n \gset
begin;
select state from holds where id = lpad(to_hex(:n::bigint), 32, '0')::uuid for update;
update stock set on_hand = on_hand - 1, reserved = reserved - 1, updated_at = now()
 where sku = {sku} and reserved >= 1;
insert into orders (id, total_cents, idempotency_scope, idempotency_key)
     values (md5('pgbench-confirm-' || :n::text)::uuid, {price}, 'hold', lpad(to_hex(:n::bigint), 32, '0')::uuid::text);
insert into order_lines (order_id, sku, quantity, unit_price_cents)
     values (md5('pgbench-confirm-' || :n::text)::uuid, {sku}, 1, {price});
insert into stock_movements (sku, delta, reserved_delta, reason, reference, actor)
     values ({sku}, -1, -1, 'order', md5('pgbench-confirm-' || :n::text)::uuid::text, 'pgbench');
update holds set state = 'confirmed', order_id = md5('pgbench-confirm-' || :n::text)::uuid, updated_at = now()
 where id = lpad(to_hex(:n::bigint), 32, '0')::uuid;
commit;
"#;

/// A sold-out answer: the plain read that finds no stock, and the 409 stored under the key.
const SOLD_OUT: &str = r#"-- A sold-out answer: read availability, store the 409 under the key (one commit).
\set k random(1, 9000000000000000000)
select s.on_hand - s.reserved as available
  from products p join stock s on s.sku = p.sku
 where p.active and p.sku = {sku};
insert into idempotency_keys
       (scope, key, fingerprint, state, owner, response_status, response_body, completed_at)
values ('api', {key}, 'pgbench', 'completed',
        gen_random_uuid(), 409, '{"shortages": []}', now())
    on conflict (scope, key) do nothing;
"#;

/// The product page's one query (`catalog::db::find_product`), of a random product.
const PRODUCT_PAGE: &str = r#"-- The product page's query, of a SKU picked at random.
\set n random(1, {skus})
select p.sku, p.name, p.description, p.price_cents, p.purchase_limit, p.category,
       i.image_etag, coalesce(s.on_hand - s.reserved, 0) as available
  from products p left join stock s on s.sku = p.sku
  left join product_images i on i.sku = p.sku
 where p.active and p.sku = {sku};
"#;

const SEARCH: &str = r#"-- The catalogue page searched for a word picked at random: its
-- listing by best match, the categories, and the matches in each.
\set w random(1, {words})
select p.sku, p.name, p.description, p.price_cents, p.purchase_limit, p.category,
       i.image_etag as image, coalesce(s.on_hand - s.reserved, 0) as available,
       count(*) over () as total
  from products p left join stock s on s.sku = p.sku
  left join product_images i on i.sku = p.sku
 where p.active and p.search @@ to_tsquery('english', {word})
 order by ts_rank(p.search, to_tsquery('english', {word})) desc, p.name, p.sku
 limit 24 offset 0;
select category, count(*) as products from products
 where active and category is not null
 group by category order by category;
select category, count(*) as products from products
 where active and category is not null and search @@ to_tsquery('english', {word})
 group by category;
"#;

/// The pgbench script for `workload`, its name, and what it contains; none for `refused`,
/// whose requests touch no database.
pub fn script(workload: Workload, skus: usize) -> Option<(String, String)> {
    let quoted = |sku: &str| format!("'{sku}'");
    let (name, text) = match workload {
        Workload::HotSku => (
            "order-hot-sku",
            keyed(ORDER, "api")
                .replace("{pick}", "")
                .replace("{sku}", &quoted(super::HOT_SKU)),
        ),
        Workload::HoldHot => (
            "hold-hot-sku",
            keyed(HOLD, "api-hold").replace("{sku}", &quoted(super::HOT_SKU)),
        ),
        Workload::Confirm => ("confirm", CONFIRM.replace("{sku}", &quoted(super::HOT_SKU))),
        Workload::Uniform => (
            "order-uniform",
            keyed(ORDER, "api")
                .replace("{pick}", &format!(r"\set n random(1, {skus})"))
                .replace("{sku}", super::UNIFORM_SKU_SQL),
        ),
        Workload::Cart => (
            "cart",
            keyed(CART, "api")
                .replace("{skus}", &skus.to_string())
                .replace("{side}", super::UNIFORM_SKU_SQL)
                .replace("{hot}", &quoted(super::HOT_SKU)),
        ),
        Workload::SoldOut => (
            "sold-out",
            keyed(SOLD_OUT, "api").replace("{sku}", &quoted(super::SOLD_OUT_SKU)),
        ),
        Workload::ProductPage => (
            "product-page",
            PRODUCT_PAGE
                .replace("{skus}", &skus.to_string())
                .replace("{sku}", super::UNIFORM_SKU_SQL),
        ),
        Workload::Search => (
            "search",
            SEARCH
                .replace("{words}", &super::SEARCH_WORDS.to_string())
                .replace("{word}", super::SEARCH_WORD_SQL),
        ),
        // The storefront's requests are pages around a hold and a confirmation, which
        // `hold-hot-sku` and `confirm` measure; the refused ones do no SQL at all.
        Workload::Refused | Workload::Storefront | Workload::PaidCheckout => return None,
    };
    Some((
        name.to_string(),
        text.replace("{price}", &PRICE_CENTS.to_string()),
    ))
}

/// Runs `pgbench -n -M prepared -c clients -j 2 -T seconds -f script` against `database_url`
/// (passed through the environment, so the password is not on a command line). With
/// `open_loop`, transactions are scheduled at that rate (`-R`) and logged per transaction
/// (`-l`) into the given folder, for their latency from scheduled start.
pub async fn run(
    bin: &Path,
    database_url: &str,
    name: &str,
    script: &Path,
    clients: usize,
    seconds: u64,
    open_loop: Option<(f64, &Path)>,
) -> anyhow::Result<PgbenchResult> {
    let url = reqwest::Url::parse(database_url).context("DATABASE_URL is not a URL")?;
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["-n", "-M", "prepared", "-j", "2"])
        .args(["-c", &clients.to_string(), "-T", &seconds.to_string()])
        .arg("-f")
        .arg(script)
        .env("PGHOST", url.host_str().unwrap_or("127.0.0.1"))
        .env("PGPORT", url.port().unwrap_or(5432).to_string())
        .env("PGUSER", decode(url.username()))
        .env("PGDATABASE", decode(url.path().trim_start_matches('/')))
        .kill_on_drop(true);
    crate::children::mark_tokio(&mut cmd);
    if let Some(password) = url.password() {
        cmd.env("PGPASSWORD", decode(password));
    }
    if let Some((rate, logs)) = open_loop {
        std::fs::create_dir_all(logs)?;
        cmd.args(["-R", &format!("{rate:.0}"), "-l", "--log-prefix"])
            .arg(logs.join("pgbench_log"));
    }
    for (k, v) in url.query_pairs() {
        if k == "sslmode" {
            cmd.env("PGSSLMODE", v.as_ref());
        }
    }
    let out = tokio::time::timeout(Duration::from_secs(seconds + 60), cmd.output())
        .await
        .context("pgbench did not finish")?
        .with_context(|| format!("cannot run {}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "pgbench ({name}) failed with {}:\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (tps, transactions, failed) = parse(&stdout)
        .with_context(|| format!("no `tps = …` line in pgbench's output:\n{stdout}"))?;
    let (p50_ms, p99_ms) = match open_loop {
        Some((_, logs)) => {
            let latency = scheduled_latency(logs)?;
            let ms = |q: f64| Some(latency.value_at_quantile(q) as f64 / 1000.0);
            (ms(0.5), ms(0.99))
        }
        None => (None, None),
    };
    Ok(PgbenchResult {
        script: name.to_string(),
        tps,
        transactions,
        failed,
        clients,
        seconds,
        offered_rate: open_loop.map(|(rate, _)| rate),
        p50_ms,
        p99_ms,
        wal_per_transaction: None,
    })
}

/// Latency in microseconds from each logged transaction's scheduled start, over every
/// per-thread log file in `logs`.
fn scheduled_latency(logs: &Path) -> anyhow::Result<hdrhistogram::Histogram<u64>> {
    let mut latency = hdrhistogram::Histogram::new(3).expect("3 significant digits");
    for entry in std::fs::read_dir(logs)? {
        let text = std::fs::read_to_string(entry?.path())?;
        for us in text.lines().filter_map(scheduled_latency_us) {
            latency.saturating_record(us);
        }
    }
    anyhow::ensure!(!latency.is_empty(), "pgbench logged no transactions");
    Ok(latency)
}

/// One line of pgbench's per-transaction log under `-R`: `client transaction time_us
/// script epoch epoch_us lag_us`; the latency from scheduled start is `time + lag`.
/// Skipped transactions (`time` = `skipped`) and failed ones (`failed`) count as nothing.
fn scheduled_latency_us(line: &str) -> Option<u64> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let time: u64 = fields.get(2)?.parse().ok()?;
    let lag: u64 = fields.get(6)?.parse().ok()?;
    Some(time + lag)
}

/// Undoes a URL's percent-encoding (passwords may contain `@` or `:`).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `(tps, transactions processed, failed transactions)` from pgbench's report.
fn parse(stdout: &str) -> Option<(f64, u64, u64)> {
    let number = |line: &str| -> Option<f64> { line.split_whitespace().next()?.parse().ok() };
    let mut tps = None;
    let (mut transactions, mut failed) = (0, 0);
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("tps = ")
            && line.contains("without initial connection time")
        {
            tps = number(rest);
        } else if let Some(rest) = line.strip_prefix("number of transactions actually processed:") {
            transactions = rest.trim().split('/').next()?.trim().parse().ok()?;
        } else if let Some(rest) = line.strip_prefix("number of failed transactions:") {
            failed = number(rest.trim()).map_or(0, |n| n as u64);
        }
    }
    Some((tps?, transactions, failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_without_connection_time_is_read_from_pgbench_output() {
        let out = "transaction type: order.sql\nscaling factor: 1\nquery mode: prepared\n\
                   number of clients: 16\nnumber of threads: 2\nduration: 3 s\n\
                   number of transactions actually processed: 4521\n\
                   number of failed transactions: 0 (0.000%)\n\
                   latency average = 10.6 ms\ninitial connection time = 21.3 ms\n\
                   tps = 1507.123456 (without initial connection time)\n";
        assert_eq!(parse(out), Some((1507.123456, 4521, 0)));
        assert_eq!(parse("no numbers here"), None);
    }

    #[test]
    fn open_loop_latency_counts_from_the_scheduled_start() {
        assert_eq!(
            scheduled_latency_us("3 17 1250 0 1764547200 123456 4000"),
            Some(5250)
        );
        assert_eq!(
            scheduled_latency_us("3 18 failed 0 1764547200 123456 10"),
            None
        );
        assert_eq!(scheduled_latency_us("3 17 1250 0 1764547200 123456"), None);
    }

    #[test]
    fn percent_encoded_passwords_are_decoded() {
        assert_eq!(decode("p%40ss%3Aword"), "p@ss:word");
        assert_eq!(decode("plain%zz"), "plain%zz");
    }

    #[test]
    fn every_order_script_writes_the_ledger_the_order_and_completes_the_key() {
        for workload in [Workload::HotSku, Workload::Uniform] {
            let (_, text) = script(workload, 1000).expect("orders have a script");
            for needle in [
                "insert into idempotency_keys",
                "update stock",
                "insert into stock_movements",
                "insert into orders",
                "insert into order_lines",
                "set state = 'completed'",
                "commit;",
            ] {
                assert!(text.contains(needle), "{needle} missing from {text}");
            }
            for placeholder in ["{pick}", "{sku}", "{price}"] {
                assert!(!text.contains(placeholder), "{placeholder} left in {text}");
            }
        }
    }

    #[test]
    fn no_script_keeps_a_placeholder() {
        for workload in Workload::ALL {
            let Some((name, text)) = script(workload, 1000) else {
                continue;
            };
            let left = text.split('{').skip(1).find(|rest| {
                let word = rest.split('}').next().unwrap_or_default();
                !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            });
            assert!(left.is_none(), "{name} keeps a placeholder: {text}");
        }
    }

    #[test]
    fn the_product_page_script_reads_a_random_product_through_the_pages_joins() {
        let (_, text) = script(Workload::ProductPage, 10_000).expect("pages have a script");
        assert!(text.contains(r"\set n random(1, 10000)"), "{text}");
        assert!(text.contains("left join product_images"), "{text}");
        assert!(text.contains(crate::bench::UNIFORM_SKU_SQL), "{text}");
        assert!(!text.contains('{'), "a placeholder left in {text}");
    }

    #[test]
    fn the_search_script_reads_the_listing_and_both_category_counts_of_a_random_word() {
        let (_, text) = script(Workload::Search, 10_000).expect("searches have a script");
        assert!(text.contains(r"\set w random(1, 100)"), "{text}");
        assert_eq!(text.matches("select ").count(), 3, "{text}");
        assert_eq!(
            text.matches(crate::bench::SEARCH_WORD_SQL).count(),
            3,
            "{text}"
        );
        assert!(!text.contains('{'), "a placeholder left in {text}");
    }
}
