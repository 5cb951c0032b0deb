//! The admin's pages: restocking, the live dashboard.

use fantoccini::Locator;

use super::{body_text, log_in, save_screenshot};
use crate::helpers::{browser, spawn_app};

#[tokio::test]
async fn an_admin_restocks_the_drop_and_watches_the_dashboard_follow_an_order() {
    let app = spawn_app().await;
    app.seed_demo().await;
    app.create_admin().await;
    // The limited drop sells out (to one buyer: its one-per-customer limit lifted).
    sqlx::query!("update products set purchase_limit = null where sku = 'KB-DROP-ORCA'")
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(
        app.post_order("drop", &[("KB-DROP-ORCA", 3)])
            .await
            .status()
            .as_u16(),
        201
    );

    let b = browser().await;
    b.goto(&app.url("/admin")).await.unwrap();
    assert!(
        b.current_url()
            .await
            .unwrap()
            .path()
            .starts_with("/admin/login")
    );
    log_in(&b).await;
    b.wait()
        .for_element(Locator::Id("units-on-hand"))
        .await
        .unwrap();
    assert!(
        body_text(&b)
            .await
            .contains("Orca Limited Edition Keyboard"),
        "listed as sold out"
    );

    b.goto(&app.url("/admin/products/KB-DROP-ORCA"))
        .await
        .unwrap();
    b.find(Locator::Id("units"))
        .await
        .unwrap()
        .send_keys("5")
        .await
        .unwrap();
    b.find(Locator::Id("restock-reason"))
        .await
        .unwrap()
        .send_keys("Second batch from the workshop")
        .await
        .unwrap();
    b.find(Locator::Id("restock"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let notice = b.wait().for_element(Locator::Id("notice")).await.unwrap();
    assert_eq!(
        notice.text().await.unwrap(),
        "Added 5 units; 5 on hand now."
    );
    assert_eq!(app.stock("KB-DROP-ORCA").await, (5, 0));

    // The dashboard follows an order placed elsewhere, without a reload.
    b.goto(&app.url("/admin")).await.unwrap();
    let shown = |b: &fantoccini::Client| {
        let b = b.clone();
        async move {
            let text = b
                .find(Locator::Id("units-on-hand"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            text.parse::<i64>().unwrap()
        }
    };
    let before = shown(&b).await;
    assert_eq!(
        app.post_order("live", &[("KB-ALPINE-75", 2)])
            .await
            .status()
            .as_u16(),
        201
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while shown(&b).await != before - 2 {
        if std::time::Instant::now() > deadline {
            let status = b
                .find(Locator::Id("live-status"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            panic!("the dashboard did not update ({status}): still {before}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let orders = b
        .find(Locator::Id("orders-today"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(orders, "2");
    save_screenshot(&b, "dashboard.png").await;

    b.goto(&app.url("/admin/products/KB-DROP-ORCA/ledger"))
        .await
        .unwrap();
    b.find(Locator::Id("verify"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let verdict = b.wait().for_element(Locator::Id("verdict")).await.unwrap();
    assert!(verdict.text().await.unwrap().starts_with("Verified"));
    assert!(
        body_text(&b)
            .await
            .contains("Second batch from the workshop")
    );
    save_screenshot(&b, "ledger.png").await;

    b.find(Locator::Id("log-out"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait().for_element(Locator::Id("log-in")).await.unwrap();
    b.goto(&app.url("/admin")).await.unwrap();
    assert!(
        b.current_url()
            .await
            .unwrap()
            .path()
            .starts_with("/admin/login"),
        "logged out"
    );
    b.close().await.unwrap();
}

#[tokio::test]
async fn an_admin_watches_a_flash_sale_live_on_the_dashboard() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: stockade::loadtest::LoadtestArgs,
    }
    let app = spawn_app().await;
    app.seed_demo().await;
    app.create_admin().await;
    let b = browser().await;
    b.goto(&app.url("/admin")).await.unwrap();
    log_in(&b).await;
    b.wait()
        .for_element(Locator::Id("units-on-hand"))
        .await
        .unwrap();

    // 400 buyers arriving at 60 a second for 200 units, while the dashboard is open.
    let out =
        std::env::temp_dir().join(format!("stockade-watch-{}", uuid::Uuid::new_v4().simple()));
    let args = Cli::parse_from([
        "loadtest",
        "--target",
        &app.address,
        "--stock",
        "200",
        "--buyers",
        "400",
        "--rate",
        "60",
        "--hold-share",
        "0.1",
        "--quiet",
        "--database-url",
        app.settings.database_url.as_deref().unwrap(),
        "--out",
        &out.display().to_string(),
    ])
    .args;
    let sale = stockade::loadtest::run_report(&args);
    let watch = async {
        let mut seen = Vec::new();
        let mut shot = false;
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_secs(8) {
            let text = b
                .find(Locator::Id("units-on-hand"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            if seen.last() != Some(&text) {
                seen.push(text);
            }
            if !shot && started.elapsed() > std::time::Duration::from_millis(3000) {
                save_screenshot(&b, "flash-sale-dashboard.png").await;
                shot = true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        seen
    };
    let (report, seen) = tokio::join!(sale, watch);
    let report = report.unwrap();
    assert!(report.runs[0].passed(), "{:#?}", report.runs[0].verdicts);
    let status = b
        .find(Locator::Id("live-status"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        seen.len() >= 3,
        "the dashboard changed during the sale: {seen:?} ({status}, sale took {:.1} s)",
        report.runs[0].result.wall_seconds
    );
    // The sale is over; within a few of the dashboard's one-second polls (on a busy
    // machine, a few more) it shows what the database holds.
    let on_hand = sqlx::query_scalar!(r#"select sum(on_hand)::bigint as "on_hand!" from stock"#)
        .fetch_one(&app.db)
        .await
        .unwrap();
    let settled_by = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let shown = b
            .find(Locator::Id("units-on-hand"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if shown == on_hand.to_string() {
            break;
        }
        assert!(
            std::time::Instant::now() < settled_by,
            "the dashboard shows {shown} units on hand 15 s after the sale; the database holds {on_hand}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    b.close().await.unwrap();
}

/// Fills in the "add units" form on the page the browser is on (whatever it held before)
/// and returns the form's idempotency key.
async fn fill_restock(b: &fantoccini::Client, units: &str, reason: &str) -> String {
    for (id, text) in [("units", units), ("restock-reason", reason)] {
        let field = b.find(Locator::Id(id)).await.unwrap();
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }
    b.find(Locator::Css(
        "form[action$=\"/restock\"] input[name=\"key\"]",
    ))
    .await
    .unwrap()
    .attr("value")
    .await
    .unwrap()
    .expect("the form carries a key")
}

/// The notice on the page, once there is one.
async fn notice(b: &fantoccini::Client) -> String {
    b.wait()
        .for_element(Locator::Id("notice"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_admin_restock_refreshed_resubmitted_and_double_clicked_adds_once_per_intended_submit() {
    let app = spawn_app().await;
    app.add_product("FORM-1", "Restocked by hand", 1_000, 65)
        .await;
    app.create_admin().await;
    let restocks = "select count(*) from stock_movements where reason = 'restock'";
    let b = browser().await;
    b.goto(&app.url("/admin/products/FORM-1")).await.unwrap();
    log_in(&b).await;
    b.wait().for_element(Locator::Id("restock")).await.unwrap();

    // One submit: 303 to the product page, which says what was done.
    let key = fill_restock(&b, "5", "Delivery").await;
    b.find(Locator::Id("restock"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(notice(&b).await, "Added 5 units; 70 on hand now.");
    let result = b.current_url().await.unwrap();
    assert_eq!(result.path(), "/admin/products/FORM-1");
    assert_eq!(result.query(), Some(format!("done={key}").as_str()));
    assert_eq!(app.stock("FORM-1").await, (70, 0));

    // Reloading the result page shows the result again and adds nothing.
    b.refresh().await.unwrap();
    assert_eq!(notice(&b).await, "Added 5 units; 70 on hand now.");
    assert_eq!(app.stock("FORM-1").await, (70, 0));

    // Back to the form that was sent, and send it again: the same result, nothing added.
    b.back().await.unwrap();
    b.wait().for_element(Locator::Id("restock")).await.unwrap();
    assert_eq!(
        fill_restock(&b, "5", "Delivery").await,
        key,
        "back shows the form that was sent"
    );
    b.find(Locator::Id("restock"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait().for_url(&result).await.unwrap();
    assert_eq!(notice(&b).await, "Added 5 units; 70 on hand now.");
    assert_eq!(app.stock("FORM-1").await, (70, 0));
    assert_eq!(app.count(restocks).await, 1);

    // A second delivery, double-clicked while the first click is still being applied (the
    // test holds the stock row, so the first request waits): the units are added once.
    let second = fill_restock(&b, "5", "Second delivery").await;
    assert_ne!(second, key, "the result page carries a fresh form");
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query!("select on_hand from stock where sku = 'FORM-1' for update")
        .fetch_one(&mut *lock)
        .await
        .unwrap();
    let double_click = b.execute(
        "const b = document.getElementById('restock'); b.click(); setTimeout(() => b.click(), 150);",
        vec![],
    );
    let release = async {
        app.wait_for_a_row("select count(*) from idempotency_keys where state = 'in_flight'")
            .await;
        // The second click's request arrives meanwhile and waits for the first.
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        lock.rollback().await.unwrap();
    };
    let (clicked, ()) = tokio::join!(double_click, release);
    clicked.unwrap();
    let second_result = result
        .join(&format!("/admin/products/FORM-1?done={second}"))
        .unwrap();
    b.wait().for_url(&second_result).await.unwrap();
    assert_eq!(notice(&b).await, "Added 5 units; 75 on hand now.");
    assert_eq!(app.stock("FORM-1").await, (75, 0));
    assert_eq!(app.count(restocks).await, 2);
    app.assert_invariants().await;
    b.close().await.unwrap();
}
