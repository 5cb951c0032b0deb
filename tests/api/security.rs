//! Hardening: login throttling per address, trusted proxies, control characters and
//! numeric bounds at every entry point. Cache and cookie headers are in `headers.rs`, slow
//! clients in `slow_clients.rs`.

use std::time::{Duration, Instant};

use crate::helpers::{ADMIN_PASSWORD, ADMIN_USER, TestApp, client, spawn_app_with, test_settings};

/// An app behind a trusted proxy at 127.0.0.1 (where the tests connect from), with admin
/// `ada`, `max` failures allowed per (account, address) and `per_client` per address.
async fn proxied_app(max: i64, per_client: i64, window: Duration) -> TestApp {
    let mut settings = test_settings().await;
    settings.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    settings.login_max_failures = max;
    settings.login_max_failures_per_client = per_client;
    settings.login_window = window;
    let app = spawn_app_with(settings).await;
    app.create_admin().await;
    app
}

/// The storefront CSRF token of `client` (its cookie, as pages embed it).
async fn csrf_of(app: &TestApp, client: &reqwest::Client) -> String {
    let html = client
        .get(app.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    crate::helpers::csrf_in(&html)
}

/// POSTs the login form from `client` with `X-Forwarded-For: forwarded_for` (as the
/// trusted proxy would pass it on).
async fn login_as(
    app: &TestApp,
    client: &reqwest::Client,
    forwarded_for: &str,
    username: &str,
    password: &str,
) -> reqwest::Response {
    let csrf = csrf_of(app, client).await;
    client
        .post(app.url("/admin/login"))
        .header("X-Forwarded-For", forwarded_for)
        .form(&[
            ("csrf", csrf.as_str()),
            ("username", username),
            ("password", password),
        ])
        .send()
        .await
        .unwrap()
}

fn retry_after(res: &reqwest::Response) -> u64 {
    res.headers()
        .get("retry-after")
        .expect("429 says when to retry")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn failures_from_one_address_lock_out_that_address_but_not_the_admin_elsewhere() {
    let app = proxied_app(3, 20, Duration::from_secs(900)).await;
    let attacker = client();
    for i in 0..3 {
        let res = login_as(
            &app,
            &attacker,
            "198.51.100.66",
            ADMIN_USER,
            &format!("guess {i}"),
        )
        .await;
        assert_eq!(res.status().as_u16(), 401, "guess {i} is checked");
    }
    // The attacker's address is throttled, even with the right password.
    let res = login_as(&app, &attacker, "198.51.100.66", ADMIN_USER, ADMIN_PASSWORD).await;
    assert_eq!(res.status().as_u16(), 429);
    let wait = retry_after(&res);
    assert!((1..=900).contains(&wait), "Retry-After {wait}");
    // The admin, at another address, gets in with the right password.
    let admin = client();
    let res = login_as(&app, &admin, "203.0.113.10", ADMIN_USER, ADMIN_PASSWORD).await;
    assert_eq!(res.status().as_u16(), 303, "the honest client is let in");
    // The attacker is still throttled: the admin's success forgave only its own attempt.
    let res = login_as(&app, &attacker, "198.51.100.66", ADMIN_USER, ADMIN_PASSWORD).await;
    assert_eq!(res.status().as_u16(), 429);
    // Throttled attempts were not recorded: three failures of the pair, three of the address.
    let rows = app
        .count("select count(*) from login_failures where kind = 'pair'")
        .await;
    assert_eq!(rows, 3);
}

#[tokio::test]
async fn rotating_spoofed_forwarded_for_hops_do_not_escape_the_throttle() {
    let app = proxied_app(3, 5, Duration::from_secs(900)).await;
    let attacker = client();
    let mut statuses = Vec::new();
    for i in 0..8 {
        // The left-most hops are the attacker's own; the right-most is what the proxy saw.
        let forwarded = format!("10.{i}.{i}.1, 192.0.2.{i}, 198.51.100.66");
        let res = login_as(
            &app,
            &attacker,
            &forwarded,
            ADMIN_USER,
            &format!("guess {i}"),
        )
        .await;
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429, 429, 429]);
    // Rotating accounts as well runs into the per-address limit.
    let mut statuses = Vec::new();
    for (i, name) in ["eve", "mallory", "trudy", "oscar"].iter().enumerate() {
        let forwarded = format!("172.16.0.{i}, 198.51.100.66");
        let res = login_as(&app, &attacker, &forwarded, name, "guess").await;
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 429, 429], "five failures per address");

    // Without trusted proxies the header is ignored altogether: the peer is the client.
    let mut settings = test_settings().await;
    settings.login_max_failures = 2;
    let app = spawn_app_with(settings).await;
    app.create_admin().await;
    let mut statuses = Vec::new();
    for i in 0..4 {
        let forwarded = format!("203.0.113.{i}");
        let res = login_as(&app, &attacker, &forwarded, ADMIN_USER, "wrong").await;
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 429, 429]);
}

#[tokio::test]
async fn attempts_while_throttled_do_not_extend_the_lockout() {
    let window = Duration::from_secs(8);
    let app = proxied_app(2, 100, window).await;
    let attacker = client();
    let addr = "198.51.100.66";
    // Sent before the first failure is recorded, returned after it: it lapses between.
    let first_sent = Instant::now();
    let res = login_as(&app, &attacker, addr, ADMIN_USER, "wrong").await;
    let first_done = Instant::now();
    assert_eq!(res.status().as_u16(), 401);
    let res = login_as(&app, &attacker, addr, ADMIN_USER, "wrong").await;
    assert_eq!(res.status().as_u16(), 401);
    // Keep knocking while throttled, as an attacker keeping the account locked would.
    let mut waits = Vec::new();
    while first_sent.elapsed() < window - Duration::from_millis(1500) {
        let res = login_as(&app, &attacker, addr, ADMIN_USER, "wrong").await;
        assert_eq!(res.status().as_u16(), 429);
        waits.push(retry_after(&res));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(waits.len() >= 3, "{waits:?}");
    assert!(
        waits.windows(2).all(|w| w[1] <= w[0]),
        "Retry-After never grows: {waits:?}"
    );
    // Once the first failure lapses the address may log in again, however often it
    // knocked meanwhile.
    tokio::time::sleep((window + Duration::from_millis(200)).saturating_sub(first_done.elapsed()))
        .await;
    let res = login_as(&app, &attacker, addr, ADMIN_USER, ADMIN_PASSWORD).await;
    assert_eq!(res.status().as_u16(), 303, "the lockout ended on time");
}

/// Runs `stockade admin unlock` against `app`'s database.
fn unlock(app: &TestApp, args: &[&str]) -> String {
    let out = crate::helpers::processes::clean_stockade_command()
        .env(
            "DATABASE_URL",
            app.settings.database_url.as_deref().unwrap(),
        )
        .env("STOCKADE_LOG", "off")
        .args(["admin", "unlock"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn admin_unlock_clears_the_failure_records() {
    let app = proxied_app(2, 100, Duration::from_secs(900)).await;
    let attacker = client();
    let addr = "198.51.100.66";
    for _ in 0..2 {
        login_as(&app, &attacker, addr, ADMIN_USER, "wrong").await;
    }
    login_as(&app, &attacker, addr, "someone", "wrong").await;
    let locked = login_as(&app, &attacker, addr, ADMIN_USER, ADMIN_PASSWORD).await;
    assert_eq!(locked.status().as_u16(), 429);

    // Another account's records stay when one account is unlocked.
    let said = unlock(&app, &["--username", "Ada"]);
    assert!(said.contains("cleared 2"), "{said}");
    let pairs = "select count(*) from login_failures where kind = 'pair'";
    assert_eq!(app.count(pairs).await, 1);
    let res = login_as(&app, &attacker, addr, ADMIN_USER, ADMIN_PASSWORD).await;
    assert_eq!(res.status().as_u16(), 303, "unlocked");

    unlock(&app, &[]);
    assert_eq!(app.count("select count(*) from login_failures").await, 0);
}

// ---------------------------------------------------------------- control characters, bounds

/// Rows that a refused request must not have written.
async fn written(app: &TestApp) -> (i64, i64, i64, i64, i64) {
    (
        app.count("select count(*) from orders").await,
        app.count("select count(*) from idempotency_keys").await,
        app.count("select count(*) from products").await,
        app.count("select count(*) from stock_movements").await,
        app.count("select count(*) from holds where customer_name is not null")
            .await,
    )
}

#[tokio::test]
async fn control_characters_get_422_naming_the_field_at_every_entry_point() {
    let app = spawn_app_with(test_settings().await).await;
    app.add_product("GOOD-1", "Good", 1_000, 50).await;
    let before = written(&app).await;

    // The order API.
    for (field, value) in [
        ("name", "Ada\u{0}Lovelace"),
        ("email", "ada\u{0}@example.com"),
        ("name", "bell\u{7}"),
    ] {
        let res = app
            .client
            .post(app.url("/api/v1/orders"))
            .header("Idempotency-Key", format!("ctl-{field}-{}", value.len()))
            .json(&serde_json::json!({"lines": [{"sku": "GOOD-1", "quantity": 1}], field: value}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 422, "{field}={value:?}");
        let body: serde_json::Value = res.json().await.unwrap();
        let detail = body["detail"].as_str().unwrap().to_lowercase();
        assert!(
            detail.contains(field) && detail.contains("control characters"),
            "{detail}"
        );
    }
    assert_eq!(written(&app).await, before, "the API wrote nothing");

    // The checkout form (a hold placed through the API first).
    let res = app
        .client
        .post(app.url("/api/v1/holds"))
        .header("Idempotency-Key", "hold-1")
        .json(&serde_json::json!({"lines": [{"sku": "GOOD-1", "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let hold: serde_json::Value = res.json().await.unwrap();
    let id = hold["id"].as_str().unwrap().to_string();
    let before = written(&app).await;
    let csrf = app.csrf().await;
    let res = app
        .client
        .post(app.url(&format!("/checkout/{id}/confirm")))
        .form(&[
            ("csrf", csrf.as_str()),
            ("name", "Ada\u{0}"),
            ("email", "ada@example.com"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 422);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("Name must not contain control characters")
    );
    assert_eq!(written(&app).await, before, "the checkout wrote nothing");

    // The login form.
    let res = app.login("ada\u{0}", "whatever it is").await;
    assert_eq!(res.status().as_u16(), 422);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("Username must not contain control characters")
    );
    assert_eq!(app.count("select count(*) from login_failures").await, 0);

    // The admin product forms: names refuse newlines, descriptions keep them.
    let token = app.login_admin().await;
    let before = written(&app).await;
    for (name, description) in [
        ("Bad\u{0}name", "fine"),
        ("Bad\nname", "fine"),
        ("Fine", "nul\u{0}here"),
    ] {
        let res = app
            .admin_post(
                "/admin/products",
                &[
                    ("csrf", token.as_str()),
                    ("sku", "NEW-1"),
                    ("name", name),
                    ("description", description),
                    ("price", "10.00"),
                    ("on_hand", "5"),
                ],
            )
            .await;
        assert_eq!(res.status().as_u16(), 422, "{name:?} / {description:?}");
        let page = res.text().await.unwrap();
        let field = if name == "Fine" {
            "description"
        } else {
            "name"
        };
        assert!(
            page.contains(&format!("The {field} must not contain control characters")),
            "{field}"
        );
    }
    assert_eq!(
        written(&app).await,
        before,
        "the product forms wrote nothing"
    );
    let res = app
        .admin_post(
            "/admin/products",
            &[
                ("csrf", token.as_str()),
                ("sku", "NEW-1"),
                ("name", "Fine"),
                ("description", "line one\r\nline two"),
                ("price", "10.00"),
                ("on_hand", "5"),
            ],
        )
        .await;
    assert_eq!(
        res.status().as_u16(),
        303,
        "a description may have line breaks"
    );

    // The admin stock API.
    let before = written(&app).await;
    let res = app
        .client
        .post(app.url("/api/v1/admin/stock/GOOD-1/restock"))
        .header("Idempotency-Key", "restock-ctl")
        .header("X-CSRF-Token", &token)
        .json(&serde_json::json!({"units": 5, "reason": "delivery\u{0}"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 422);
    let body: serde_json::Value = res.json().await.unwrap();
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("reason must not contain"),
        "{body}"
    );
    assert_eq!(written(&app).await, before, "the stock API wrote nothing");
}

#[tokio::test]
async fn admin_numbers_past_what_stock_can_hold_get_422_not_500() {
    let app = spawn_app_with(test_settings().await).await;
    app.add_product("BIG-1", "Big", 1_000, 10).await;
    let token = app.login_admin().await;
    // A count close to the column's limit (2^31 - 1).
    sqlx::query!("update stock set on_hand = 2147480000 where sku = 'BIG-1'")
        .execute(&app.db)
        .await
        .unwrap();
    let movements = app.count("select count(*) from stock_movements").await;

    // The restock form: a valid number of units that would overflow the count.
    let (_, html) = app.get_text("/admin/products/BIG-1").await;
    let marker = r#"name="key" value=""#;
    let start = html.find(marker).unwrap() + marker.len();
    let key = html[start..].split('"').next().unwrap().to_string();
    let res = app
        .admin_post(
            "/admin/products/BIG-1/restock",
            &[
                ("csrf", token.as_str()),
                ("key", key.as_str()),
                ("units", "10000000"),
                ("reason", "delivery"),
            ],
        )
        .await;
    assert_eq!(res.status().as_u16(), 422);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("past the most it can have on hand")
    );

    // The stock API: the same, and numbers beyond 32 bits.
    let api = |path: &'static str, key: &'static str, body: serde_json::Value| {
        let app = &app;
        let token = token.clone();
        async move {
            let res = app
                .client
                .post(app.url(path))
                .header("Idempotency-Key", key)
                .header("X-CSRF-Token", token)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let body: serde_json::Value = res.json().await.unwrap();
            (
                status,
                body["detail"].as_str().unwrap_or_default().to_string(),
            )
        }
    };
    let restock = "/api/v1/admin/stock/BIG-1/restock";
    let adjust = "/api/v1/admin/stock/BIG-1/adjust";
    for (path, key, body, words) in [
        (
            restock,
            "r1",
            serde_json::json!({"units": 10_000_000, "reason": "x"}),
            "past the most",
        ),
        (
            restock,
            "r2",
            serde_json::json!({"units": 2_147_483_648i64, "reason": "x"}),
            "units must be",
        ),
        (
            restock,
            "r3",
            serde_json::json!({"units": -2_147_483_649i64, "reason": "x"}),
            "units must be",
        ),
        (
            adjust,
            "a1",
            serde_json::json!({"expected_on_hand": 2_147_483_648i64, "on_hand": 1, "reason": "x"}),
            "expected_on_hand must be",
        ),
        (
            adjust,
            "a2",
            serde_json::json!({"expected_on_hand": 0, "on_hand": 2_147_483_648i64, "reason": "x"}),
            "on_hand must be",
        ),
    ] {
        let (status, detail) = api(path, key, body).await;
        assert_eq!(status, 422, "{key}: {detail}");
        assert!(detail.contains(words), "{key}: {detail}");
    }
    assert_eq!(app.stock("BIG-1").await, (2_147_480_000, 0));
    assert_eq!(
        app.count("select count(*) from stock_movements").await,
        movements,
        "nothing was written"
    );
}
