use stockade::seed::DEMO_CATALOGUE;

use crate::helpers::{fresh_database, spawn_app};

#[tokio::test]
async fn migrations_apply_on_an_empty_database_and_guard_stock() {
    let url = fresh_database().await;
    let empty = url.replace("/test_", "/empty_");
    let name = empty.rsplit('/').next().unwrap().to_string();
    let admin = crate::helpers::servers().await.url("postgres");
    let pool = sqlx::PgPool::connect(&admin).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        r#"create database "{name}" template template0"#
    )))
    .execute(&pool)
    .await
    .unwrap();
    let db = sqlx::PgPool::connect(&empty).await.unwrap();
    stockade::startup::MIGRATOR.run(&db).await.unwrap();
    // Running them again is a no-op.
    stockade::startup::MIGRATOR.run(&db).await.unwrap();

    sqlx::query!("insert into products (sku, name, price_cents) values ('AB-1', 'x', 100)")
        .execute(&db)
        .await
        .unwrap();
    for bad in [
        "insert into stock (sku, on_hand) values ('AB-1', -1)",
        "insert into stock (sku, on_hand, reserved) values ('AB-1', 1, 2)",
        "insert into products (sku, name, price_cents) values ('ab 1', 'x', 1)",
        "insert into products (sku, name, price_cents) values ('AB-2', 'x', -1)",
    ] {
        assert!(
            sqlx::query(bad).execute(&db).await.is_err(),
            "accepted: {bad}"
        );
    }
    sqlx::query!(
        "insert into stock_movements (sku, delta, reason, actor) values ('AB-1', 1, 'initial', 't')"
    )
    .execute(&db)
    .await
    .unwrap();
    let err = sqlx::query!("delete from stock_movements")
        .execute(&db)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
    let err = sqlx::query!("update stock_movements set delta = 5")
        .execute(&db)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
}

#[tokio::test]
async fn catalogue_lists_every_seeded_product_with_price_and_stock_badge() {
    let app = spawn_app().await;
    app.seed_demo().await;
    sqlx::query!("update stock set on_hand = 0 where sku = 'NB-DOT-A5'")
        .execute(&app.db)
        .await
        .unwrap();

    let (status, html) = app.get_text("/").await;
    assert_eq!(status, 200);
    for (sku, name, _, _, _) in DEMO_CATALOGUE {
        // As the card shows it: numbers and their units kept together.
        let shown = stockade::text::keep_units_together(name);
        let escaped = shown.replace('&', "&amp;").replace('\'', "&#39;");
        assert!(html.contains(&escaped), "{name} missing");
        assert!(
            html.contains(&format!("/products/{sku}")),
            "{sku} link missing"
        );
    }
    assert!(html.contains("$189.00"), "price of the Alpine 75");
    assert!(
        html.contains("Only 3 left"),
        "the limited drop shows its few units"
    );
    assert!(html.contains("Sold out"), "a product at zero says so");
    assert!(html.contains("In stock"));
}

#[tokio::test]
async fn product_page_shows_name_price_and_availability() {
    let app = spawn_app().await;
    app.seed_demo().await;
    let (status, html) = app.get_text("/products/KB-DROP-ORCA").await;
    assert_eq!(status, 200);
    assert!(html.contains("Orca Limited Edition Keyboard"));
    assert!(html.contains("$349.00"));
    assert!(html.contains("Only 3 left"));
    assert!(html.contains("3 available"));
    assert!(html.contains("Limit 1 per customer"), "{html}");

    // SKUs are case-insensitive in addresses.
    let (status, html) = app.get_text("/products/kb-drop-orca").await;
    assert_eq!(status, 200);
    assert!(html.contains("Orca Limited Edition Keyboard"));
}

#[tokio::test]
async fn reserved_units_are_not_offered_as_available() {
    let app = spawn_app().await;
    app.add_product("HELD-1", "Held thing", 1000, 10).await;
    sqlx::query!("update stock set reserved = 8 where sku = 'HELD-1'")
        .execute(&app.db)
        .await
        .unwrap();
    let (_, html) = app.get_text("/products/HELD-1").await;
    assert!(html.contains("Only 2 left"), "{html}");
}

#[tokio::test]
async fn unknown_sku_gets_the_friendly_404_page_with_the_request_id() {
    let app = spawn_app().await;
    for path in [
        "/products/NOPE-404",
        "/products/not%20a%20sku",
        "/no/such/page",
    ] {
        let res = app.get(path).await;
        assert_eq!(res.status().as_u16(), 404, "{path}");
        let request_id = res.headers()["x-request-id"].to_str().unwrap().to_string();
        assert!(
            res.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        let html = res.text().await.unwrap();
        assert!(html.contains("Not found"), "{path}: {html}");
        assert!(html.contains(&request_id), "{path}: request id shown");
        assert!(html.contains("Back to the catalogue"));
    }
}

#[tokio::test]
async fn api_paths_answer_errors_as_problem_json() {
    let app = spawn_app().await;
    let res = app.get("/api/v1/no-such-thing").await;
    assert_eq!(res.status().as_u16(), 404);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], 404);
    assert!(body["detail"].as_str().unwrap().len() > 10);
    assert!(body["request_id"].as_str().is_some());
}

#[tokio::test]
async fn every_response_carries_the_security_headers() {
    let app = spawn_app().await;
    for path in ["/", "/static/style.css", "/nope"] {
        let res = app.get(path).await;
        let h = res.headers();
        assert!(
            h["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("default-src 'self'")
        );
        assert!(
            h["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("frame-ancestors 'none'")
        );
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert!(h.contains_key("referrer-policy"));
        let permissions = h["permissions-policy"].to_str().unwrap();
        for feature in ["camera=()", "geolocation=()", "microphone=()", "payment=()"] {
            assert!(permissions.contains(feature), "{path}: {permissions}");
        }
    }
}

#[tokio::test]
async fn seeding_writes_a_ledger_that_sums_to_stock() {
    let app = spawn_app().await;
    app.seed_demo().await;
    app.seed_demo().await; // a second seed adds nothing
    let count = sqlx::query_scalar!(r#"select count(*) as "count!" from products"#)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(count as usize, DEMO_CATALOGUE.len());
    let mismatches = stockade::inventory::db::ledger_mismatches(&app.db)
        .await
        .unwrap();
    assert!(mismatches.is_empty(), "{mismatches:?}");
    // The check can fail: break the stock row behind the ledger's back.
    sqlx::query!("update stock set on_hand = on_hand + 1 where sku = 'MG-STONE-350'")
        .execute(&app.db)
        .await
        .unwrap();
    let mismatches = stockade::inventory::db::ledger_mismatches(&app.db)
        .await
        .unwrap();
    assert_eq!(mismatches.len(), 1);
    assert_eq!(mismatches[0].sku, "MG-STONE-350");
}

#[tokio::test]
async fn pages_reuse_what_they_read_for_a_moment_and_show_sold_out_at_once() {
    let app = crate::helpers::spawn_app_with(stockade::config::Settings {
        page_cache: std::time::Duration::from_millis(500),
        ..crate::helpers::test_settings().await
    })
    .await;
    app.add_product("CACHE-1", "Cached", 1_000, 4).await;
    let page = || async { app.get_text("/products/CACHE-1").await.1 };
    assert!(page().await.contains("Only 4 left"));

    // A change this process did not make shows once the entry is half a second old:
    // meanwhile views are served without reading the database.
    sqlx::query!("update stock set on_hand = 3 where sku = 'CACHE-1'")
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query!("insert into stock_movements (sku, delta, reason, actor) values ('CACHE-1', -1, 'adjust', 'test')")
    .execute(&app.db)
    .await
    .unwrap();
    assert!(page().await.contains("Only 4 left"), "served from memory");
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert!(
        page().await.contains("Only 3 left"),
        "at most half a second stale"
    );

    // Selling the last units here shows "Sold out" at once, on the page and in the API.
    assert_eq!(
        app.post_order("last", &[("CACHE-1", 3)]).await.status(),
        201
    );
    assert!(page().await.contains("Sold out"));
    let api: serde_json::Value = app
        .get("/api/v1/products/CACHE-1")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(api["available"], 0);
    app.assert_invariants().await;
}
