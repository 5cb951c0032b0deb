//! Backups with point-in-time recovery (pgBackRest), as a user runs them: `stockade serve
//! --backups`, `stockade backup take`, `stockade backup restore --to`.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use stockade::loadtest::run::LogEntry;

use crate::helpers::{UNLIMITED_RATE, client, post_order_to, serve, servers};

const SKU: &str = "PITR-1";
const SELLERS: u64 = 8;

/// Runs `stockade backup …`; its standard output, or a panic with its error.
fn backup_command(args: &[&str]) -> String {
    let out = crate::helpers::processes::clean_stockade_command()
        .arg("backup")
        .args(args)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "stockade backup {args:?}: {stderr}{stdout}"
    );
    stdout
}

/// Buyers ordering one unit each, as fast as answers come, until `stop`; the orders the
/// shop acknowledged (201) and the keys of every request sent.
async fn sell(base: String, stop: Arc<AtomicBool>) -> (Vec<LogEntry>, Vec<String>) {
    let started = Instant::now();
    let buyers: Vec<_> = (0..SELLERS)
        .map(|buyer| {
            let (base, stop, http) = (base.clone(), stop.clone(), client());
            tokio::spawn(async move {
                let (mut created, mut sent) = (Vec::new(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let key = uuid::Uuid::new_v4().to_string();
                    sent.push(key.clone());
                    let at = started.elapsed();
                    let res = post_order_to(&http, &base, &key, &[(SKU, 1)]).await;
                    if res.status() == 201 {
                        let body: serde_json::Value = res.json().await.unwrap();
                        created.push(LogEntry {
                            at_ms: at.as_secs_f64() * 1e3,
                            buyer,
                            behaviour: "pitr".into(),
                            kind: "order".into(),
                            key,
                            status: 201,
                            outcome: "created".into(),
                            id: body["id"].as_str().map(String::from),
                            latency_ms: (started.elapsed() - at).as_secs_f64() * 1e3,
                            target: 0,
                        });
                    }
                }
                (created, sent)
            })
        })
        .collect();
    let (mut created, mut sent) = (Vec::new(), Vec::new());
    for buyer in buyers {
        let (c, s) = buyer.await.unwrap();
        created.extend(c);
        sent.extend(s);
    }
    (created, sent)
}

/// Waits until PostgreSQL has archived every WAL segment written so far.
async fn archive_everything(db: &sqlx::PgPool) {
    let segment: String =
        sqlx::query_scalar!(r#"select pg_walfile_name(pg_switch_wal()) as "segment!""#)
            .fetch_one(db)
            .await
            .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let archived: Option<String> =
            sqlx::query_scalar!("select last_archived_wal from pg_stat_archiver")
                .fetch_one(db)
                .await
                .unwrap();
        if archived.as_deref() >= Some(segment.as_str()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{segment} not archived within 30 s (last: {archived:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn add_stock(db: &sqlx::PgPool, units: i32) {
    let mut tx = db.begin().await.unwrap();
    sqlx::query!(
        "insert into products (sku, name, price_cents) values ($1, 'Restore Test Drop', 1000)",
        SKU
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let sku = stockade::catalog::Sku::parse(SKU).unwrap();
    stockade::inventory::db::create_stock(&mut tx, &sku, units, "test")
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

fn env_for(data_dir: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("STOCKADE_DATA_DIR", data_dir.display().to_string()),
        ("STOCKADE_LISTEN", "127.0.0.1:0".into()),
        ("STOCKADE_API_ANONYMOUS_ORDERS", "true".into()),
        ("STOCKADE_RATE_LIMIT_PER_MINUTE", UNLIMITED_RATE.to_string()),
        ("STOCKADE_RATE_LIMIT_BURST", UNLIMITED_RATE.to_string()),
    ]
}

#[tokio::test]
async fn a_restore_to_a_moment_mid_sale_has_every_order_acknowledged_before_it_and_none_after() {
    let root = servers().await.fresh_dir("backups");
    let backups = root.join("backups");
    let backups_arg = backups.display().to_string();
    let mut shop = serve(&env_for(&root.join("data")), &["--backups", &backups_arg]).await;
    assert!(
        shop.printed("Backups")
            .is_some_and(|b| b.contains(&backups_arg)),
        "local mode says where its backups go: {:?}",
        shop.printed("Backups")
    );
    let listed = backup_command(&["list", "--backups", &backups_arg]);
    assert_eq!(
        listed.lines().filter(|l| l.contains(" full ")).count(),
        1,
        "a first full backup is taken at start: {listed}"
    );
    let db = sqlx::PgPool::connect(&shop.printed("PostgreSQL").unwrap())
        .await
        .unwrap();
    add_stock(&db, 1_000_000).await;

    // The sale goes on while a full backup is taken and WAL is archived.
    let stop = Arc::new(AtomicBool::new(false));
    let before = tokio::spawn(sell(shop.address.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let taken = Instant::now();
    let args = ["take", "--backups", &backups_arg, "--type", "full"].map(String::from);
    let took = tokio::task::spawn_blocking(move || {
        backup_command(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    let backup_time = taken.elapsed();
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    let (acknowledged, _) = before.await.unwrap();

    // Every acknowledgement of the first part arrived before the moment; every request of
    // the second part is sent after it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let moment = Utc::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Selling a second at a time until at least 20 are acknowledged (a busy machine may
    // sell fewer in one second), for at most ten.
    let (mut acknowledged_after, mut sent_after) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let stop = Arc::new(AtomicBool::new(false));
        let after = tokio::spawn(sell(shop.address.clone(), stop.clone()));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        stop.store(true, Ordering::Relaxed);
        let (acknowledged, sent) = after.await.unwrap();
        acknowledged_after.extend(acknowledged);
        sent_after.extend(sent);
        if acknowledged_after.len() >= 20 {
            break;
        }
    }
    assert!(
        acknowledged.len() >= 20 && acknowledged_after.len() >= 20,
        "the sale sold on both sides of the moment: {} then {}",
        acknowledged.len(),
        acknowledged_after.len()
    );
    archive_everything(&db).await;
    db.close().await;

    let restored_dir = root.join("restored");
    let restored_arg = restored_dir.display().to_string();
    let restoring = Instant::now();
    let to = moment.to_rfc3339();
    let out = backup_command(&[
        "restore",
        "--backups",
        &backups_arg,
        "--data-dir",
        &restored_arg,
        "--to",
        &to,
    ]);
    let restore_time = restoring.elapsed();
    assert!(out.contains("recovery stopping"), "{out}");
    assert!(shop.stop(), "clean exit on SIGTERM");

    // The restored folder starts as a shop of its own.
    let mut restored = serve(&env_for(&restored_dir), &[]).await;
    let db = sqlx::PgPool::connect(&restored.printed("PostgreSQL").unwrap())
        .await
        .unwrap();
    let orders: HashSet<String> = sqlx::query_scalar!("select id::text as \"id!\" from orders")
        .fetch_all(&db)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let missing: Vec<_> = acknowledged
        .iter()
        .filter(|e| !orders.contains(e.id.as_deref().unwrap()))
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged before the moment, but lost: {missing:?}"
    );
    // Stored keys are scoped by who placed them: `<owner>:<key>`.
    let keys: HashSet<String> =
        sqlx::query_scalar!(r#"select idempotency_key as "key!" from orders"#)
            .fetch_all(&db)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|k| Some(k.split_once(':')?.1.to_string()))
            .collect();
    assert!(
        acknowledged.iter().all(|e| keys.contains(&e.key)),
        "the keys are found as sent"
    );
    let late: Vec<_> = sent_after.iter().filter(|k| keys.contains(*k)).collect();
    assert!(
        late.is_empty(),
        "sent after the moment, yet restored: {late:?}"
    );

    let verdicts =
        stockade::loadtest::check::check(&db, Some(&acknowledged), None, Duration::from_secs(60))
            .await
            .unwrap();
    assert!(
        verdicts.iter().all(|v| v.pass) && verdicts.len() == 8,
        "I1–I8 on the restored database: {verdicts:?}"
    );
    eprintln!(
        "point-in-time restore: {} orders before the moment, {} after; backup during the \
         sale {:.1} s ({}); restore {:.1} s; {} orders restored",
        acknowledged.len(),
        acknowledged_after.len(),
        backup_time.as_secs_f64(),
        took.trim(),
        restore_time.as_secs_f64(),
        orders.len()
    );
    db.close().await;
    assert!(restored.stop());
}
