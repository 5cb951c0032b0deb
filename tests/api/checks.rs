//! `stockade check --quick` on a live shop: incremental, never a false alarm while orders
//! commit around it, catching a broken ledger, and shown on the dashboard.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use stockade::loadtest::quick::quick_check;

use crate::helpers::{TestApp, client, post_order_to, spawn_app};

const STALE: Duration = Duration::from_secs(30);

/// `stockade check [--quick]` as a process of its own; its exit code and output.
fn check_process(url: &str, quick: bool) -> (Option<i32>, String) {
    let mut cmd = crate::helpers::processes::clean_stockade_command();
    cmd.arg("check")
        .env("DATABASE_URL", url)
        .env("STOCKADE_LOG", "error");
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

async fn through(app: &TestApp) -> i64 {
    app.count("select through_id from ledger_cursor").await
}

/// Runs quick checks, each passing, until the checkpoint has summed the whole ledger as it
/// is now. The checkpoint moves once every transaction older than the one a run noted has
/// ended, in the whole server: tests running beside this one hold it back for a while.
async fn quick_checks_until_the_checkpoint_is_at_the_end(app: &TestApp, what: &str) {
    let end = app
        .count("select coalesce(max(id), 0) from stock_movements")
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert_eq!(failed_invariants(app).await, Vec::<String>::new(), "{what}");
        let through = through(app).await;
        if through >= end {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the checkpoint stayed at ledger row {through}, short of {end}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn failed_invariants(app: &TestApp) -> Vec<String> {
    quick_check(&app.db, STALE, 30)
        .await
        .unwrap()
        .verdicts
        .into_iter()
        .filter(|v| !v.pass)
        .map(|v| format!("{} {:?}", v.id, v.rows))
        .collect()
}

#[tokio::test]
async fn quick_checks_in_other_processes_pass_throughout_a_sale_and_then_read_only_what_is_new() {
    let app = spawn_app().await;
    app.add_product("QC-1", "Quick Check One", 500, 100_000)
        .await;
    app.add_product("QC-2", "Quick Check Two", 700, 100_000)
        .await;
    let url = app.settings.database_url.as_deref().unwrap().to_string();

    let selling = Arc::new(AtomicBool::new(true));
    let buyers: Vec<_> = (0..6)
        .map(|i| {
            let (base, selling, http) = (app.address.clone(), selling.clone(), client());
            tokio::spawn(async move {
                let mut placed = 0;
                while selling.load(Ordering::Relaxed) {
                    let key = uuid::Uuid::new_v4().to_string();
                    let lines: &[(&str, i64)] = if i % 2 == 0 {
                        &[("QC-1", 1)]
                    } else {
                        &[("QC-1", 1), ("QC-2", 2)]
                    };
                    if post_order_to(&http, &base, &key, lines).await.status() == 201 {
                        placed += 1;
                    }
                }
                placed
            })
        })
        .collect();
    // Quick checks from processes of their own, one after another, while orders commit:
    // six at least, and on until one has moved the checkpoint (a transaction of a test
    // beside this one can hold it back for a while).
    let mut runs = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while runs.len() < 6 || (through(&app).await == 0 && std::time::Instant::now() < deadline) {
        let url = url.clone();
        runs.push(
            tokio::task::spawn_blocking(move || check_process(&url, true))
                .await
                .unwrap(),
        );
    }
    selling.store(false, Ordering::Relaxed);
    let mut placed = 0;
    for buyer in buyers {
        placed += buyer.await.unwrap();
    }
    assert!(placed > 50, "the sale sold: {placed}");
    for (code, out) in &runs {
        assert_eq!(*code, Some(0), "a quick check during the sale: {out}");
        assert!(out.contains("PASS I1") && out.contains("PASS I7"), "{out}");
    }
    assert!(
        through(&app).await > 0,
        "the checkpoint moved during the sale"
    );

    // Quiet now: the next runs move the checkpoint to the end and then read nothing old.
    quick_checks_until_the_checkpoint_is_at_the_end(&app, "after the sale").await;
    let run = quick_check(&app.db, STALE, 30).await.unwrap();
    assert!(
        run.covered.contains(" 0 ledger rows past the checkpoint"),
        "nothing new to read: {}",
        run.covered
    );
    let ledger = app.count("select max(id) from stock_movements").await;
    assert_eq!(
        through(&app).await,
        ledger,
        "summed through the whole ledger"
    );
    let (sold, summed) = (
        app.count("select sum(quantity)::bigint from order_lines where sku = 'QC-1'")
            .await,
        app.count("select sold from ledger_checkpoints where sku = 'QC-1'")
            .await,
    );
    assert_eq!(sold, summed, "the checkpoint's sales are the order lines'");
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_ledger_row_still_uncommitted_when_the_checkpoint_moves_is_summed_once_it_commits() {
    let app = spawn_app().await;
    app.add_product("QC-LATE", "Late Ledger Row", 500, 100)
        .await;
    app.add_product("QC-OTHER", "Sold Meanwhile", 500, 100)
        .await;
    let sku = stockade::catalog::Sku::parse("QC-LATE").unwrap();
    // A restock whose ledger id is taken now and committed later.
    let mut late = app.db.begin().await.unwrap();
    stockade::inventory::db::restock(&mut late, &sku, 5, "late", "test")
        .await
        .unwrap()
        .unwrap();
    // Ledger rows with larger ids commit meanwhile (of another SKU: the restock holds its
    // stock row's lock).
    for i in 0..3 {
        let res = app
            .post_order(&format!("late-{i}"), &[("QC-OTHER", 1)])
            .await;
        assert_eq!(res.status(), 201);
    }
    for _ in 0..3 {
        assert_eq!(failed_invariants(&app).await, Vec::<String>::new());
    }
    late.commit().await.unwrap();
    quick_checks_until_the_checkpoint_is_at_the_end(&app, "the late row is summed, not skipped")
        .await;
    let summed = app
        .count("select on_hand from ledger_checkpoints where sku = 'QC-LATE'")
        .await;
    assert_eq!(summed, 100 + 5);
}

#[tokio::test]
async fn a_broken_ledger_fails_the_quick_check_and_the_dashboard_says_so() {
    let app = spawn_app().await;
    app.add_product("QC-BRK", "Broken Ledger", 500, 10).await;
    assert_eq!(
        app.post_order("brk-1", &[("QC-BRK", 2)]).await.status(),
        201
    );
    app.login_admin().await;
    let (_, page) = app.get_text("/admin").await;
    assert!(page.contains("not checked yet"), "{page}");

    for _ in 0..2 {
        assert_eq!(failed_invariants(&app).await, Vec::<String>::new());
    }
    let (_, page) = app.get_text("/admin").await;
    assert!(
        page.contains(r#"Invariants: <b class="ok">PASS</b> at the last quick check"#),
        "{page}"
    );

    // Units that vanish from the stock row with no ledger row: past the checkpoint.
    sqlx::query!("update stock set on_hand = on_hand - 1 where sku = 'QC-BRK'")
        .execute(&app.db)
        .await
        .unwrap();
    let failed = failed_invariants(&app).await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].contains("QC-BRK: on_hand 7 but the ledger sums to 8"),
        "{failed:?}"
    );
    let (_, page) = app.get_text("/admin").await;
    assert!(
        page.contains(r#"<b class="bad">FAIL</b>"#) && page.contains("I1: ledger conservation"),
        "{page}"
    );

    // A full check from the command line finds the same, and is recorded as one.
    let url = app.settings.database_url.as_deref().unwrap().to_string();
    let (code, out) = tokio::task::spawn_blocking(move || check_process(&url, false))
        .await
        .unwrap();
    assert_eq!(code, Some(3), "{out}");
    let (_, page) = app.get_text("/admin").await;
    assert!(page.contains("at the last full check"), "{page}");
}

#[tokio::test]
async fn a_late_ledger_row_whose_transaction_started_after_a_committed_one_is_not_skipped() {
    let app = spawn_app().await;
    app.add_product("QC-EARLY", "Committed First", 500, 10)
        .await;
    app.add_product("QC-LATER", "Committed Last", 500, 10).await;
    let restock = |sku: &'static str| {
        format!(
            "insert into stock_movements (sku, delta, reason, actor) values ('{sku}', 1, 'restock', 'test')"
        )
    };
    // U takes its transaction id first, T second; T's ledger row gets the smaller ledger id,
    // and U commits while T is still open: no transaction id above U's has finished.
    let mut u = app.db.begin().await.unwrap();
    sqlx::query("update stock set on_hand = on_hand + 1 where sku = 'QC-EARLY'")
        .execute(&mut *u)
        .await
        .unwrap();
    let mut t = app.db.begin().await.unwrap();
    sqlx::query("update stock set on_hand = on_hand + 1 where sku = 'QC-LATER'")
        .execute(&mut *t)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(restock("QC-LATER")))
        .execute(&mut *t)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(restock("QC-EARLY")))
        .execute(&mut *u)
        .await
        .unwrap();
    u.commit().await.unwrap();
    for _ in 0..3 {
        assert_eq!(failed_invariants(&app).await, Vec::<String>::new());
    }
    t.commit().await.unwrap();
    quick_checks_until_the_checkpoint_is_at_the_end(&app, "T's row is summed once it commits")
        .await;
    let summed = app
        .count("select on_hand from ledger_checkpoints where sku = 'QC-LATER'")
        .await;
    assert_eq!(summed, 11);
}
