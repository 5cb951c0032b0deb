//! Pages in a real headless Chromium.

use fantoccini::Locator;

use crate::helpers::{browser, docs_dir, spawn_app};

#[tokio::test]
async fn a_shopper_browses_from_the_catalogue_to_a_product() {
    let app = spawn_app().await;
    app.seed_demo().await;
    let b = browser().await;
    b.goto(&app.url("/")).await.unwrap();
    assert_eq!(b.title().await.unwrap(), "Catalogue · Stockade");
    save_screenshot(&b, "catalogue.png").await;

    b.find(Locator::Css("a.card-link[href=\"/products/KB-DROP-ORCA\"]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait()
        .for_element(Locator::Css("h1.product-name"))
        .await
        .unwrap();
    assert!(
        b.current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/products/KB-DROP-ORCA")
    );
    let name = b
        .find(Locator::Css("h1.product-name"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(name, "Orca Limited Edition Keyboard");
    let price = b
        .find(Locator::Css(".price-large"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(price, "$349.00");
    let badge = b
        .find(Locator::Id("stock-badge"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(badge, "Only 3 left");
    // The stylesheet loaded (served by the app, allowed by the CSP).
    let header_bg = b
        .execute(
            "return getComputedStyle(document.querySelector('.site-header')).backgroundColor",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(header_bg, "rgb(31, 58, 52)");
    b.close().await.unwrap();
}

/// Saves under `target/screenshots/`, and into `docs/` when `UPDATE_DOCS_SCREENSHOTS=1`.
pub async fn save_screenshot(b: &fantoccini::Client, name: &str) {
    let png = b.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG image");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), &png).unwrap();
    if std::env::var("UPDATE_DOCS_SCREENSHOTS").as_deref() == Ok("1") {
        std::fs::create_dir_all(docs_dir()).unwrap();
        std::fs::write(docs_dir().join(name), &png).unwrap();
    }
}

#[tokio::test]
async fn a_shopper_checks_out_double_clicks_goes_back_and_resubmits_yet_orders_once() {
    let app = spawn_app().await;
    app.seed_demo().await;
    let b = browser().await;
    for (sku, quantity) in [("MS-DRIFT-WL", "2"), ("NB-DOT-A5", "1")] {
        b.goto(&app.url(&format!("/products/{sku}"))).await.unwrap();
        let field = b.find(Locator::Id("quantity")).await.unwrap();
        field.clear().await.unwrap();
        field.send_keys(quantity).await.unwrap();
        b.find(Locator::Id("add-to-cart"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        b.wait()
            .for_element(Locator::Css("table.lines"))
            .await
            .unwrap();
    }
    let cart_link = b
        .find(Locator::Id("cart-link"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(cart_link, "Cart 3");
    b.find(Locator::Id("checkout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait()
        .for_element(Locator::Id("place-order"))
        .await
        .unwrap();
    b.find(Locator::Id("name"))
        .await
        .unwrap()
        .send_keys("Grace")
        .await
        .unwrap();
    b.find(Locator::Id("email"))
        .await
        .unwrap()
        .send_keys("grace@example.com")
        .await
        .unwrap();
    save_screenshot(&b, "checkout.png").await;

    // Double click: two clicks as fast as the page allows.
    b.execute(
        "const b = document.getElementById('place-order'); b.click(); b.click();",
        vec![],
    )
    .await
    .unwrap();
    b.wait().for_element(Locator::Id("order-id")).await.unwrap();
    let first_id = b
        .find(Locator::Id("order-id"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let total = b
        .find(Locator::Id("order-total"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(total, "$180.00");
    save_screenshot(&b, "order.png").await;

    // Back to the checkout. Checkout pages are `no-store`, so the browser asks again and
    // is sent to the order; a form kept anyway would be submitted again.
    b.back().await.unwrap();
    b.wait()
        .for_element(Locator::Css("#place-order, #order-id"))
        .await
        .unwrap();
    if let Ok(button) = b.find(Locator::Id("place-order")).await {
        button.click().await.unwrap();
    }
    b.wait().for_element(Locator::Id("order-id")).await.unwrap();
    let second_id = b
        .find(Locator::Id("order-id"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(first_id, second_id, "the same order is shown");

    assert_eq!(app.count("select count(*) from orders").await, 1);
    assert_eq!(app.stock("MS-DRIFT-WL").await.0, 118);
    app.assert_invariants().await;
    b.close().await.unwrap();
}

/// The visible text of the page.
async fn body_text(b: &fantoccini::Client) -> String {
    b.find(Locator::Css("body"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Fills in the login form, if the browser is on it.
async fn log_in(b: &fantoccini::Client) {
    b.wait().for_element(Locator::Id("log-in")).await.unwrap();
    b.find(Locator::Id("username"))
        .await
        .unwrap()
        .send_keys(crate::helpers::ADMIN_USER)
        .await
        .unwrap();
    b.find(Locator::Id("password"))
        .await
        .unwrap()
        .send_keys(crate::helpers::ADMIN_PASSWORD)
        .await
        .unwrap();
    b.find(Locator::Id("log-in"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

#[tokio::test]
async fn an_admin_restocks_the_drop_and_watches_the_dashboard_follow_an_order() {
    let app = spawn_app().await;
    app.seed_demo().await;
    stockade::admin::create_admin(
        &app.db,
        crate::helpers::ADMIN_USER,
        crate::helpers::ADMIN_PASSWORD,
    )
    .await
    .unwrap();
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
async fn product_names_that_look_like_markup_show_as_text_everywhere() {
    let app = spawn_app().await;
    let names = [
        ("XSS-1", "<script>alert(1)</script>"),
        ("XSS-2", "\"><img src=x onerror=alert(1)>"),
    ];
    for (sku, name) in names {
        app.add_product(sku, name, 1_000, 3).await;
    }
    stockade::admin::create_admin(
        &app.db,
        crate::helpers::ADMIN_USER,
        crate::helpers::ADMIN_PASSWORD,
    )
    .await
    .unwrap();
    assert_eq!(
        app.post_order("x", &[("XSS-1", 1), ("XSS-2", 1)])
            .await
            .status()
            .as_u16(),
        201
    );
    let order = sqlx::query_scalar!(r#"select id::text as "id!" from orders"#)
        .fetch_one(&app.db)
        .await
        .unwrap();

    let b = browser().await;
    let app = &app;
    let check = |path: String| {
        let b = b.clone();
        async move {
            b.goto(&app.url(&path)).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            assert!(
                b.get_alert_text().await.is_err(),
                "a dialog opened on {path}"
            );
            let text = body_text(&b).await;
            for (_, name) in names {
                assert!(text.contains(name), "{name} not shown as text on {path}");
            }
        }
    };
    for sku in ["XSS-1", "XSS-2"] {
        b.goto(&app.url(&format!("/products/{sku}"))).await.unwrap();
        b.find(Locator::Id("add-to-cart"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        // The cart page the form leads to: the next `goto` must not race the submit.
        b.wait()
            .for_element(Locator::Css("table.lines"))
            .await
            .unwrap();
    }
    for path in ["/", "/cart"] {
        check(path.to_string()).await;
    }
    b.goto(&app.url("/admin")).await.unwrap();
    log_in(&b).await;
    b.wait()
        .for_element(Locator::Id("units-on-hand"))
        .await
        .unwrap();
    // The dashboard once rendered, and once redrawn by its live script.
    check("/admin".into()).await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(b.get_alert_text().await.is_err());
    let text = body_text(&b).await;
    assert!(names.iter().all(|(_, n)| text.contains(n)), "{text}");
    for path in [
        "/admin/products".to_string(),
        format!("/admin/orders/{order}"),
    ] {
        check(path).await;
    }
    // And each product's own pages, one name at a time.
    for (sku, name) in names {
        for path in [format!("/products/{sku}"), format!("/admin/products/{sku}")] {
            b.goto(&app.url(&path)).await.unwrap();
            assert!(b.get_alert_text().await.is_err(), "{path}");
            assert!(body_text(&b).await.contains(name), "{path}");
        }
    }
    b.close().await.unwrap();
}

#[tokio::test]
async fn a_hold_counts_down_reserves_the_last_unit_and_releases_it() {
    let app = spawn_app().await;
    app.add_product("LAST-DROP", "The last one", 9_900, 1).await;
    let first = browser().await;
    first.goto(&app.url("/products/LAST-DROP")).await.unwrap();
    first
        .find(Locator::Id("add-to-cart"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    first
        .wait()
        .for_element(Locator::Id("checkout"))
        .await
        .unwrap();
    first
        .find(Locator::Id("checkout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let timer = first
        .wait()
        .for_element(Locator::Id("time-left"))
        .await
        .unwrap();
    let t1 = timer.text().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    let t2 = timer.text().await.unwrap();
    let secs = |t: &str| {
        let (m, s) = t.split_once(':').unwrap();
        m.parse::<i64>().unwrap() * 60 + s.parse::<i64>().unwrap()
    };
    assert!(
        secs(&t1) >= 590 && secs(&t2) < secs(&t1),
        "counting down: {t1} then {t2}"
    );

    // Meanwhile another shopper sees it sold out.
    let second = browser().await;
    second.goto(&app.url("/products/LAST-DROP")).await.unwrap();
    let badge = second
        .find(Locator::Id("stock-badge"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(badge, "Sold out");

    // The first shopper leaves; the unit is back for the second.
    first
        .find(Locator::Id("cancel-checkout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    first
        .wait()
        .for_url(&url::Url::parse(&app.url("/cart")).unwrap())
        .await
        .unwrap();
    second.refresh().await.unwrap();
    let badge = second
        .find(Locator::Id("stock-badge"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(badge, "Only 1 left");

    // The second checks out and places the order.
    second
        .find(Locator::Id("add-to-cart"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    second
        .wait()
        .for_element(Locator::Id("checkout"))
        .await
        .unwrap();
    second
        .find(Locator::Id("checkout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    second
        .wait()
        .for_element(Locator::Id("place-order"))
        .await
        .unwrap();
    second
        .find(Locator::Id("name"))
        .await
        .unwrap()
        .send_keys("Lin")
        .await
        .unwrap();
    second
        .find(Locator::Id("email"))
        .await
        .unwrap()
        .send_keys("lin@example.com")
        .await
        .unwrap();
    second
        .find(Locator::Id("place-order"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    second
        .wait()
        .for_element(Locator::Id("order-id"))
        .await
        .unwrap();
    assert!(body_text(&second).await.contains("Thank you, Lin!"));
    assert_eq!(app.stock("LAST-DROP").await, (0, 0));
    app.assert_invariants().await;
    first.close().await.unwrap();
    second.close().await.unwrap();
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
    stockade::admin::create_admin(
        &app.db,
        crate::helpers::ADMIN_USER,
        crate::helpers::ADMIN_PASSWORD,
    )
    .await
    .unwrap();
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
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let on_hand = sqlx::query_scalar!(r#"select sum(on_hand)::bigint as "on_hand!" from stock"#)
        .fetch_one(&app.db)
        .await
        .unwrap();
    let shown = b
        .find(Locator::Id("units-on-hand"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(shown, on_hand.to_string(), "and settled on the truth");
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
    stockade::admin::create_admin(
        &app.db,
        crate::helpers::ADMIN_USER,
        crate::helpers::ADMIN_PASSWORD,
    )
    .await
    .unwrap();
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
        while app
            .count("select count(*) from idempotency_keys where state = 'in_flight'")
            .await
            == 0
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
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

#[tokio::test]
async fn every_page_fits_a_phone_and_a_desktop() {
    let app = spawn_app().await;
    app.seed_demo().await;
    stockade::admin::create_admin(
        &app.db,
        crate::helpers::ADMIN_USER,
        crate::helpers::ADMIN_PASSWORD,
    )
    .await
    .unwrap();
    let order: serde_json::Value = app
        .post_order("fit-order", &[("CB-BRAID-2M", 1), ("MS-DRIFT-WL", 2)])
        .await
        .json()
        .await
        .unwrap();
    let order = order["id"].as_str().unwrap().to_string();
    let hold: serde_json::Value = app
        .client
        .post(app.url("/api/v1/holds"))
        .header("Idempotency-Key", "fit-hold")
        .json(
            &serde_json::json!({"lines": [{"sku": "LT-ARC-LAMP", "quantity": 1},
                                            {"sku": "CF-BEANS-ETH", "quantity": 3}]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let hold = hold["id"].as_str().unwrap().to_string();

    let b = browser().await;
    // A cart with lines, and an admin session.
    for sku in ["CB-BRAID-2M", "DM-WALNUT-90"] {
        b.goto(&app.url(&format!("/products/{sku}"))).await.unwrap();
        b.find(Locator::Id("add-to-cart"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        b.wait()
            .for_element(Locator::Css("table.lines"))
            .await
            .unwrap();
    }
    b.goto(&app.url("/admin")).await.unwrap();
    log_in(&b).await;
    b.wait().for_element(Locator::Css(".stats")).await.unwrap();

    let pages = [
        "/".to_string(),
        "/?q=coffee&category=Coffee&sort=price-high".into(),
        "/products/CB-BRAID-2M".into(),
        "/cart".into(),
        format!("/checkout/{hold}"),
        format!("/orders/{order}"),
        "/admin".into(),
        "/admin/products".into(),
        "/admin/products/new".into(),
        "/admin/products/KB-ALPINE-75".into(),
        "/admin/products/KB-ALPINE-75/ledger".into(),
        "/admin/orders".into(),
        format!("/admin/orders/{order}"),
        "/admin/holds".into(),
        "/admin/api-clients".into(),
        "/admin/webhooks".into(),
        "/admin/deliveries".into(),
    ];
    let mut wider = Vec::new();
    for (width, height) in [(390, 844), (1280, 900)] {
        b.set_window_size(width, height).await.unwrap();
        for page in &pages {
            b.goto(&app.url(page)).await.unwrap();
            let sizes = b
                .execute(
                    "return [document.documentElement.scrollWidth, window.innerWidth];",
                    vec![],
                )
                .await
                .unwrap();
            let (scroll, inner) = (sizes[0].as_f64().unwrap(), sizes[1].as_f64().unwrap());
            assert!(
                inner <= f64::from(width),
                "{page}: the window is {inner} px wide"
            );
            if scroll > inner {
                wider.push(format!("{page} at {width} px: {scroll} px wide"));
            }
            // The README's screenshots: each page on a phone and on a desktop.
            let shown = match page.as_str() {
                "/" => Some("catalogue"),
                "/products/CB-BRAID-2M" => Some("product"),
                "/cart" => Some("cart"),
                "/admin" => Some("dashboard"),
                checkout if checkout.starts_with("/checkout/") => Some("checkout"),
                _ => None,
            };
            if let Some(name) = shown {
                let device = if width == 390 { "phone" } else { "desktop" };
                save_screenshot(&b, &format!("{name}-{device}.png")).await;
            }
        }
    }
    b.set_window_size(1280, 900).await.unwrap();
    assert!(wider.is_empty(), "wider than the screen: {wider:#?}");
}
