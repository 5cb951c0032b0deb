//! Purchase limits per shopper: a limited drop cannot be taken by one shopper, however
//! many cookies, keys or processes they use; other shoppers still buy.

use futures_util::future::join_all;
use stockade::config::{OrderStrategy, Settings};

use crate::helpers::{TestApp, client, hidden, serve_app, spawn_app_with, test_settings};

/// The shopper behind `address`, as a trusted proxy in front of the app says.
const BOT: &str = "203.0.113.7";
const HONEST: &str = "198.51.100.20";

async fn app_with_a_drop(strategy: OrderStrategy) -> TestApp {
    let app = spawn_app_with(Settings {
        order_strategy: strategy,
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..test_settings().await
    })
    .await;
    app.add_product("DROP-1", "Numbered Drop", 9_900, 40).await;
    set_limit(&app, 1).await;
    app
}

/// DROP-1 sells at most `limit` per customer.
async fn set_limit(app: &TestApp, limit: i32) {
    stockade::catalog::db::set_purchase_limit(
        &app.db,
        &stockade::catalog::Sku::parse("DROP-1").unwrap(),
        Some(limit),
    )
    .await
    .unwrap();
}

/// One fresh browser (`browser`, a client with a new cookie jar) from `address` at `base`:
/// the product page (for its CSRF cookie), one unit into the cart, and "Checkout".
/// Returns where it went.
async fn browser_checkout(browser: reqwest::Client, base: &str, address: &str) -> (u16, String) {
    let page = |path: &str| {
        browser
            .get(format!("{base}{path}"))
            .header("x-forwarded-for", address)
    };
    let product = page("/products/DROP-1").send().await.unwrap();
    assert_eq!(product.status().as_u16(), 200);
    let html = product.text().await.unwrap();
    let csrf = hidden(&html, "csrf");
    let added = browser
        .post(format!("{base}/cart/add"))
        .header("x-forwarded-for", address)
        .form(&[
            ("csrf", csrf.as_str()),
            ("sku", "DROP-1"),
            ("quantity", "1"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(added.status().as_u16(), 303);
    let cart = page("/cart").send().await.unwrap().text().await.unwrap();
    let res = browser
        .post(format!("{base}/checkout"))
        .header("x-forwarded-for", address)
        .form(&[
            ("csrf", csrf.as_str()),
            ("key", &hidden(&cart, "key")),
            ("lines", &hidden(&cart, "lines")),
        ])
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let location = res
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_string())
        .unwrap_or_default();
    if status == 409 {
        // Back on the cart, told why.
        let page = res.text().await.unwrap();
        assert!(page.contains("Your cart"), "{page}");
        assert!(page.contains("limited to 1 per customer"), "{page}");
    }
    (status, location)
}

/// Units of DROP-1 held (active holds) or sold (placed orders).
async fn taken(app: &TestApp) -> i64 {
    app.count(
        r#"select (select coalesce(sum(l.quantity), 0) from holds h join hold_lines l on l.hold_id = h.id
                    where h.state = 'active' and l.sku = 'DROP-1')
                + (select coalesce(sum(l.quantity), 0) from orders o join order_lines l on l.order_id = o.id
                    where o.status = 'placed' and l.sku = 'DROP-1')"#,
    )
    .await
}

#[tokio::test]
async fn a_bot_with_fifty_cookies_from_one_address_gets_one_unit_of_a_limited_drop() {
    let app = app_with_a_drop(OrderStrategy::RedisLock).await;
    // Fifty checkouts of one SKU queue for its lease one at a time: on a busy machine the
    // last may wait seconds, which is what the lease wait sheds, not what is tested here.
    // So it may wait for most of the (test's 10 s) budget, less the 2 s transaction.
    let extra = [
        ("STOCKADE_TRUSTED_PROXIES", "127.0.0.1".to_string()),
        ("STOCKADE_LEASE_WAIT_MS", "7000".to_string()),
    ];
    let (one, two) = tokio::join!(serve_app(&app, &extra, &[]), serve_app(&app, &extra, &[]));
    let bases = [one.address.clone(), two.address.clone()];

    // The browsers are made before any connects: making one takes a while (its TLS roots),
    // and made inside the concurrent checkouts they kept the test's one thread from
    // sending the requests of connections already open, for longer than the server waits
    // for a request's head (5 s; it then answers 408, which the client, not having sent
    // its request yet, takes for an unexpected message).
    let browsers: Vec<reqwest::Client> = (0..50).map(|_| client()).collect();
    let tries = join_all(
        browsers
            .into_iter()
            .enumerate()
            .map(|(i, browser)| browser_checkout(browser, &bases[i % 2], BOT)),
    )
    .await;
    let held: Vec<&(u16, String)> = tries
        .iter()
        .filter(|(status, location)| *status == 303 && location.starts_with("/checkout/"))
        .collect();
    assert_eq!(held.len(), 1, "one checkout for the bot: {tries:?}");
    assert!(
        tries.iter().all(|(status, _)| [303, 409].contains(status)),
        "{tries:?}"
    );
    assert_eq!(taken(&app).await, 1);

    // The API, with fresh keys, from the same address: refused too.
    let api = client()
        .post(format!("{}/api/v1/orders", bases[1]))
        .header("x-forwarded-for", BOT)
        .header("idempotency-key", "bot-api-1")
        .json(&serde_json::json!({"lines": [{"sku": "DROP-1", "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(api.status().as_u16(), 409);
    let problem: serde_json::Value = api.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("1 per customer"),
        "{problem}"
    );

    // Another shopper still buys.
    let (status, location) = browser_checkout(client(), &bases[0], HONEST).await;
    assert_eq!((status, &location[..10]), (303, "/checkout/"), "{location}");
    assert_eq!(taken(&app).await, 2);
    app.assert_invariants().await;
}

/// Orders of the API under `strategy`: one email or one address gets one unit; a second
/// order in the same batch by the same shopper is refused; released holds give it back.
async fn api_orders_respect_the_limit(strategy: OrderStrategy) {
    let app = app_with_a_drop(strategy).await;
    let order = |key: &'static str, address: &'static str, email: Option<&'static str>| {
        let app = &app;
        async move {
            let mut body = serde_json::json!({"lines": [{"sku": "DROP-1", "quantity": 1}]});
            if let Some(email) = email {
                body["email"] = email.into();
            }
            app.client
                .post(app.url("/api/v1/orders"))
                .header("x-forwarded-for", address)
                .header("idempotency-key", key)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // Ten at once from one address: one order.
    let keys = ["a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9"];
    let answers = join_all(keys.iter().map(|k| order(k, BOT, None))).await;
    assert_eq!(
        answers.iter().filter(|s| **s == 201).count(),
        1,
        "{answers:?}"
    );
    assert_eq!(
        answers.iter().filter(|s| **s == 409).count(),
        9,
        "{answers:?}"
    );
    // The same email from another address: refused; the key is not spent.
    assert_eq!(
        order("e1", "192.0.2.1", Some("buyer@example.com")).await,
        201
    );
    assert_eq!(
        order("e2", "192.0.2.2", Some("Buyer@Example.com")).await,
        409
    );
    // More than the limit in one order is refused whoever asks.
    let res = app
        .client
        .post(app.url("/api/v1/orders"))
        .header("x-forwarded-for", HONEST)
        .header("idempotency-key", "two")
        .json(&serde_json::json!({"lines": [{"sku": "DROP-1", "quantity": 2}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 409);
    assert_eq!(order("h1", HONEST, None).await, 201);
    assert_eq!(taken(&app).await, 3);
    assert_eq!(app.stock("DROP-1").await.0, 37);
    app.assert_invariants().await;
}

#[tokio::test]
async fn api_orders_respect_the_limit_under_redis_lock() {
    api_orders_respect_the_limit(OrderStrategy::RedisLock).await;
}

#[tokio::test]
async fn api_orders_respect_the_limit_under_batched() {
    api_orders_respect_the_limit(OrderStrategy::Batched).await;
}

#[tokio::test]
async fn a_released_hold_gives_the_shopper_their_allowance_back() {
    let app = app_with_a_drop(OrderStrategy::RedisLock).await;
    let hold = |key: &'static str| {
        let app = &app;
        async move {
            app.client
                .post(app.url("/api/v1/holds"))
                .header("x-forwarded-for", BOT)
                .header("idempotency-key", key)
                .json(&serde_json::json!({"lines": [{"sku": "DROP-1", "quantity": 1}]}))
                .send()
                .await
                .unwrap()
        }
    };
    let first = hold("h1").await;
    assert_eq!(first.status().as_u16(), 201);
    let first: serde_json::Value = first.json().await.unwrap();
    assert_eq!(hold("h2").await.status().as_u16(), 409);
    let released = app
        .client
        .delete(app.url(&format!("/api/v1/holds/{}", first["id"].as_str().unwrap())))
        .send()
        .await
        .unwrap();
    assert!(released.status().is_success(), "{}", released.status());
    assert_eq!(hold("h3").await.status().as_u16(), 201);
    assert_eq!(taken(&app).await, 1);
}

#[tokio::test]
async fn an_admin_sets_the_limit_and_the_catalogue_shows_it() {
    let app = app_with_a_drop(OrderStrategy::RedisLock).await;
    let products: serde_json::Value = app.get("/api/v1/products").await.json().await.unwrap();
    let drop = products
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["sku"] == "DROP-1")
        .unwrap();
    assert_eq!(drop["purchase_limit"], 1);
    let csrf = app.login_admin().await;
    let set = |body: serde_json::Value| {
        let app = &app;
        let csrf = csrf.clone();
        async move {
            app.client
                .patch(app.url("/api/v1/admin/products/DROP-1"))
                .header("X-CSRF-Token", csrf)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        set(serde_json::json!({"purchase_limit": 0})).await.status(),
        422
    );
    assert_eq!(set(serde_json::json!({"price": 1})).await.status(), 422);
    let res = set(serde_json::json!({"purchase_limit": 2})).await;
    assert_eq!(res.status().as_u16(), 200);
    let (_, html) = app.get_text("/products/DROP-1").await;
    assert!(html.contains("Limit 2 per customer"), "{html}");
    assert_eq!(
        set(serde_json::json!({"purchase_limit": null}))
            .await
            .status(),
        200
    );
    let (_, html) = app.get_text("/products/DROP-1").await;
    assert!(!html.contains("per customer"), "{html}");
    // The admin form sets it too.
    let csrf = app.admin_csrf().await;
    let res = app
        .admin_post(
            "/admin/products/DROP-1",
            &[
                ("csrf", &csrf),
                ("name", "Numbered Drop"),
                ("price", "99.00"),
                ("purchase_limit", "3"),
                ("active", "on"),
            ],
        )
        .await;
    let status = res.status().as_u16();
    assert_eq!(status, 303, "{}", res.text().await.unwrap());
    let limit: Option<i32> =
        sqlx::query_scalar!("select purchase_limit from products where sku = 'DROP-1'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(limit, Some(3));
}

#[tokio::test]
async fn one_api_client_gets_its_allowance_once_from_any_address() {
    let app = app_with_a_drop(OrderStrategy::RedisLock).await;
    let (_, key) =
        stockade::clients::create(&app.db, "reseller", stockade::clients::Limit::Unlimited)
            .await
            .unwrap();
    let order = |idempotency: &'static str, address: &'static str| {
        let (app, key) = (&app, &key);
        async move {
            app.client
                .post(app.url("/api/v1/orders"))
                .bearer_auth(key)
                .header("x-forwarded-for", address)
                .header("idempotency-key", idempotency)
                .json(&serde_json::json!({"lines": [{"sku": "DROP-1", "quantity": 1}]}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(order("k1", "192.0.2.10").await, 201);
    assert_eq!(
        order("k2", "192.0.2.11").await,
        409,
        "the client is one shopper"
    );
    assert_eq!(taken(&app).await, 1);
}

/// POSTs `body` to the API's `path` from `address`, under `key`.
async fn api_post(
    app: &TestApp,
    path: &str,
    address: &str,
    key: &str,
    body: serde_json::Value,
) -> reqwest::Response {
    app.client
        .post(app.url(path))
        .header("x-forwarded-for", address)
        .header("idempotency-key", key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// An API hold of one unit of DROP-1 from `address`; its id.
async fn hold_one(app: &TestApp, address: &str, key: &str) -> String {
    let body = serde_json::json!({"lines": [{"sku": "DROP-1", "quantity": 1}]});
    let res = api_post(app, "/api/v1/holds", address, key, body).await;
    assert_eq!(res.status().as_u16(), 201, "hold {key}");
    let hold: serde_json::Value = res.json().await.unwrap();
    hold["id"].as_str().unwrap().to_string()
}

/// Runs hold `id` out of time, and the sweeper over it, as if its minutes had passed.
async fn expire(app: &TestApp, id: &str) {
    sqlx::query("update holds set expires_at = now() - interval '1 second' where id = $1::uuid")
        .bind(id)
        .execute(&app.db)
        .await
        .unwrap();
    app.sweep_holds().await;
}

async fn confirm_hold(app: &TestApp, id: &str, body: serde_json::Value) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/api/v1/holds/{id}/confirm")))
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn confirming_expired_holds_cannot_buy_past_the_purchase_limit() {
    let app = app_with_a_drop(OrderStrategy::RedisLock).await;
    // Three holds in turn, each let run out before the next: each was within the limit.
    let mut holds = Vec::new();
    for key in ["x1", "x2", "x3"] {
        let id = hold_one(&app, BOT, key).await;
        expire(&app, &id).await;
        holds.push(id);
    }
    assert_eq!(taken(&app).await, 0);
    // Confirmed after expiry, each buys from free stock: the first is the one unit.
    let answers = [
        confirm_hold(&app, &holds[0], serde_json::json!({})).await,
        confirm_hold(&app, &holds[1], serde_json::json!({})).await,
        confirm_hold(&app, &holds[2], serde_json::json!({})).await,
    ];
    let statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses, [201, 409, 409]);
    let [_, second, _] = answers;
    let problem: serde_json::Value = second.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("limited to 1 per customer, and you already have 1"),
        "{problem}"
    );
    assert_eq!(taken(&app).await, 1);

    // The drop's other way round: a hold expires, a new order takes the unit, and the
    // old hold's confirmation is refused.
    let old = hold_one(&app, HONEST, "y1").await;
    expire(&app, &old).await;
    let body = serde_json::json!({"lines": [{"sku": "DROP-1", "quantity": 1}]});
    let order = api_post(&app, "/api/v1/orders", HONEST, "y2", body).await;
    assert_eq!(order.status().as_u16(), 201);
    let res = confirm_hold(&app, &old, serde_json::json!({})).await;
    assert_eq!(res.status().as_u16(), 409);
    assert_eq!(taken(&app).await, 2);
    assert_eq!(app.stock("DROP-1").await, (38, 0));
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_email_given_at_confirmation_is_counted_and_recorded() {
    let app = app_with_a_drop(OrderStrategy::RedisLock).await;
    set_limit(&app, 2).await;
    // Dave orders his two units by the API.
    let body = serde_json::json!({
        "lines": [{"sku": "DROP-1", "quantity": 2}], "email": "dave@example.com"
    });
    let order = api_post(&app, "/api/v1/orders", "192.0.2.50", "d1", body).await;
    assert_eq!(order.status().as_u16(), 201);
    // A hold from another address, without an email, confirmed as Dave: refused, and the
    // hold is still there to be confirmed by someone else.
    let hold = hold_one(&app, "192.0.2.51", "d2").await;
    let body = serde_json::json!({"email": "Dave@Example.com"});
    let res = confirm_hold(&app, &hold, body).await;
    assert_eq!(res.status().as_u16(), 409);
    assert_eq!(taken(&app).await, 3, "two sold, one still held");
    // Confirmed as Frank: placed, and the order counts against Frank's email too.
    let body = serde_json::json!({"email": "frank@example.com"});
    let res = confirm_hold(&app, &hold, body).await;
    assert_eq!(res.status().as_u16(), 201);
    let placed: serde_json::Value = res.json().await.unwrap();
    let shopper: Vec<String> = sqlx::query_scalar("select shopper from orders where id = $1::uuid")
        .bind(placed["id"].as_str().unwrap())
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(
        shopper.contains(&"email:frank@example.com".to_string())
            && shopper.contains(&"addr:192.0.2.51".to_string()),
        "{shopper:?}"
    );
    let body = serde_json::json!({
        "lines": [{"sku": "DROP-1", "quantity": 2}], "email": "FRANK@example.com"
    });
    let again = api_post(&app, "/api/v1/orders", "192.0.2.52", "f2", body).await;
    assert_eq!(again.status().as_u16(), 409, "Frank has one of his two");
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_cart_holds_no_more_than_a_products_limit_and_says_so_at_the_line() {
    let app = app_with_a_drop(OrderStrategy::Batched).await;
    let browser = client();
    let base = &app.address;
    let html = browser
        .get(format!("{base}/products/DROP-1"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = hidden(&html, "csrf");
    let post = |path: &str, quantity: &str| {
        browser
            .post(format!("{base}{path}"))
            .form(&[
                ("csrf", csrf.as_str()),
                ("sku", "DROP-1"),
                ("quantity", quantity),
            ])
            .send()
    };
    // Two asked, one kept: the limit is 1 per customer.
    assert_eq!(post("/cart/add", "2").await.unwrap().status().as_u16(), 303);
    let cart = |browser: &reqwest::Client| browser.get(format!("{base}/cart")).send();
    let page = cart(&browser).await.unwrap().text().await.unwrap();
    assert!(
        page.contains("Limit 1 per customer: that is the most you can buy."),
        "{page}"
    );
    assert_eq!(hidden(&page, "lines"), "DROP-1~1");
    // Adding again, or raising the line, keeps it at the limit.
    post("/cart/add", "1").await.unwrap();
    post("/cart/update", "3").await.unwrap();
    let page = cart(&browser).await.unwrap().text().await.unwrap();
    assert_eq!(hidden(&page, "lines"), "DROP-1~1");
    // A limit lowered below what a cart holds: the line says what to do.
    set_limit(&app, 3).await;
    post("/cart/update", "3").await.unwrap();
    stockade::catalog::db::set_purchase_limit(
        &app.db,
        &stockade::catalog::Sku::parse("DROP-1").unwrap(),
        Some(2),
    )
    .await
    .unwrap();
    let page = cart(&browser).await.unwrap().text().await.unwrap();
    assert!(
        page.contains("Limit 2 per customer — please lower the quantity to 2."),
        "{page}"
    );
}
