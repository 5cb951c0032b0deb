//! Stock and product changes in the admin: counts that lose no update while orders keep
//! coming, cancels sent at once, the admin API's keys, and product forms' validation.

use std::time::Duration;

use futures_util::future::join_all;
use stockade::config::Settings;

use crate::helpers::{ADMIN_USER, spawn_app, spawn_app_with, test_settings};

use super::forms::{field, form_key, location};

#[tokio::test]
async fn compare_and_set_counts_lose_no_update_while_orders_keep_coming() {
    let app = spawn_app().await;
    app.add_product("BUSY-1", "Busy", 1_000, 500).await;
    let csrf = app.login_admin().await;
    let app = &app;
    let sold = async {
        let answers = join_all((0..100).map(|i| async move {
            tokio::time::sleep(Duration::from_millis(i * 3)).await;
            app.post_order(&format!("busy-{i}"), &[("BUSY-1", 1)])
                .await
                .status()
                .as_u16()
        }))
        .await;
        answers.iter().filter(|s| **s == 201).count() as i32
    };
    let admin = async {
        let (mut added, mut conflicts) = (0, 0);
        for round in 0..12 {
            // A stocktake finds two more than the page showed; retried when stock moved.
            let (status, html) = app.get_text("/admin/products/BUSY-1").await;
            assert_eq!(status, 200);
            let adjust = "/admin/products/BUSY-1/adjust";
            let shown: i32 = field(&html, adjust, "expected").parse().unwrap();
            let new = (shown + 2).to_string();
            let res = app
                .admin_post(
                    adjust,
                    &[
                        ("csrf", &csrf),
                        ("key", &field(&html, adjust, "key")),
                        ("expected", &shown.to_string()),
                        ("on_hand", &new),
                        ("reason", "stocktake"),
                    ],
                )
                .await;
            match res.status().as_u16() {
                303 => added += 2,
                409 => {
                    conflicts += 1;
                    let html = res.text().await.unwrap();
                    assert!(
                        html.contains("Stock moved while you were counting"),
                        "{html}"
                    );
                }
                other => panic!("adjust answered {other}"),
            }
            if round % 3 == 0 {
                let restock = "/admin/products/BUSY-1/restock";
                let res = app
                    .admin_post(
                        restock,
                        &[
                            ("csrf", &csrf),
                            ("key", &field(&html, restock, "key")),
                            ("units", "10"),
                            ("reason", "delivery"),
                        ],
                    )
                    .await;
                assert_eq!(res.status().as_u16(), 303);
                added += 10;
            }
        }
        (added, conflicts)
    };
    let (sold, (added, conflicts)) = tokio::join!(sold, admin);
    println!("{sold} sold, {added} added by the admin, {conflicts} counts refused as stale");
    assert_eq!(
        app.stock("BUSY-1").await.0,
        500 + added - sold,
        "no update lost"
    );
    app.assert_invariants().await;
    // The ledger page verifies.
    let (_, html) = app.get_text("/admin/products/BUSY-1/ledger?verify=1").await;
    assert!(html.contains("Verified: the ledger sums to"), "{html}");
}

#[tokio::test]
async fn cancelling_an_order_twice_at_once_returns_its_stock_once() {
    // Fewer connections than tabs: a cancel that held its key's connection while it took
    // another for the order would leave them all waiting for a fourth until the pool's
    // timeout answered 503 (it did so once in the suite).
    let app = spawn_app_with(Settings {
        db_pool_size: 3,
        ..test_settings().await
    })
    .await;
    app.add_product("CNL-1", "Cancelled", 1_000, 10).await;
    app.add_product("CNL-2", "Also", 1_000, 10).await;
    let order: serde_json::Value = app
        .post_order("to-cancel", &[("CNL-1", 3), ("CNL-2", 1)])
        .await
        .json()
        .await
        .unwrap();
    let id = order["id"].as_str().unwrap().to_string();
    let csrf = app.login_admin().await;
    let path = format!("/admin/orders/{id}/cancel");
    // Eight cancel forms (eight tabs), each with its own key, sent at once.
    let mut keys = Vec::new();
    for _ in 0..8 {
        keys.push(form_key(&app, &format!("/admin/orders/{id}"), &path).await);
    }
    let answers = join_all(keys.iter().map(|key| async {
        let res = app
            .admin_post(&path, &[("csrf", &csrf), ("key", key)])
            .await;
        assert_eq!(res.status().as_u16(), 303);
        app.get_text(&location(&res)).await
    }))
    .await;
    assert!(answers.iter().all(|(s, _)| *s == 200));
    let now = answers
        .iter()
        .filter(|(_, h)| h.contains("its units are back in stock"))
        .count();
    let already = answers
        .iter()
        .filter(|(_, h)| h.contains("already cancelled"))
        .count();
    assert_eq!((now, already), (1, 7));
    assert_eq!(app.stock("CNL-1").await.0, 10);
    assert_eq!(app.stock("CNL-2").await.0, 10);
    assert_eq!(
        app.count("select count(*) from stock_movements where reason = 'cancel'")
            .await,
        2
    );
    let status = sqlx::query_scalar!("select status from orders")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(status, "cancelled");
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_admin_api_changes_stock_once_per_idempotency_key() {
    let app = spawn_app().await;
    app.add_product("API-1", "Via API", 1_000, 10).await;
    let csrf = app.login_admin().await;
    let restock = |key: &'static str, units: i32| {
        let app = &app;
        let csrf = csrf.clone();
        async move {
            app.client
                .post(app.url("/api/v1/admin/stock/API-1/restock"))
                .header("Idempotency-Key", key)
                .header("X-CSRF-Token", csrf)
                .json(&serde_json::json!({"units": units, "reason": "delivery"}))
                .send()
                .await
                .unwrap()
        }
    };
    let first = restock("r1", 5).await;
    assert_eq!(first.status().as_u16(), 200);
    let again = restock("r1", 5).await;
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    assert_eq!(restock("r1", 6).await.status().as_u16(), 422);
    assert_eq!(app.stock("API-1").await.0, 15);

    let adjust = |expected: i32| {
        let app = &app;
        let csrf = csrf.clone();
        async move {
            app.client
                .post(app.url("/api/v1/admin/stock/API-1/adjust"))
                .header("Idempotency-Key", format!("a{expected}"))
                .header("X-CSRF-Token", csrf)
                .json(&serde_json::json!({"expected_on_hand": expected, "on_hand": 12, "reason": "count"}))
                .send()
                .await
                .unwrap()
        }
    };
    let stale = adjust(10).await;
    assert_eq!(stale.status().as_u16(), 409);
    let problem: serde_json::Value = stale.json().await.unwrap();
    assert_eq!(problem["on_hand"], 15);
    assert_eq!(adjust(15).await.status().as_u16(), 200);
    assert_eq!(app.stock("API-1").await.0, 12);
    app.assert_invariants().await;
    let actors = sqlx::query_scalar!(
        "select actor from stock_movements where reason in ('restock', 'adjust') order by id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(
        actors,
        [ADMIN_USER, ADMIN_USER],
        "every change names its admin"
    );
}

#[tokio::test]
async fn product_forms_are_validated() {
    let app = spawn_app().await;
    let csrf = app.login_admin().await;
    let create = |sku: &'static str, name: &'static str, price: &'static str| {
        let app = &app;
        let csrf = csrf.clone();
        async move {
            app.admin_post(
                "/admin/products",
                &[
                    ("csrf", &csrf),
                    ("sku", sku),
                    ("name", name),
                    ("price", price),
                    ("on_hand", "4"),
                    ("active", "on"),
                ],
            )
            .await
        }
    };
    for (sku, name, price, words) in [
        ("bad sku!", "Name", "1.00", "not a valid SKU"),
        ("OK-1", "", "1.00", "name is 1 to 200 characters"),
        ("OK-1", "Name", "-3", "not a price"),
        ("OK-1", "Name", "1.005", "not a price"),
    ] {
        let res = create(sku, name, price).await;
        assert_eq!(res.status().as_u16(), 422, "{sku} {name} {price}");
        assert!(res.text().await.unwrap().contains(words), "{words}");
    }
    assert_eq!(app.count("select count(*) from products").await, 0);
    let res = create("NEW-1", "Brand new", "12.5").await;
    assert_eq!(res.status().as_u16(), 303);
    let price = sqlx::query_scalar!("select price_cents from products where sku = 'NEW-1'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(price, 1250);
    assert_eq!(app.stock("NEW-1").await, (4, 0));
    assert_eq!(
        create("NEW-1", "Again", "1").await.status().as_u16(),
        422,
        "duplicate SKU"
    );
    app.assert_invariants().await;
}
