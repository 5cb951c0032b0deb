//! API clients: keys, whose orders and idempotency keys are whose, anonymous API orders as
//! a setting, and rate limits shared by server processes (and kept per process while
//! Redis is away).

use std::time::{Duration, Instant};

use stockade::clients::{self, CACHE_FOR, Limit};
use stockade::config::{OrderStrategy, Settings};

use crate::helpers::*;

const SKU: &str = "KEYED-1";

/// A test app that refuses anonymous API orders (the default outside tests).
async fn keyed_app() -> TestApp {
    let app = spawn_app_with(Settings {
        api_anonymous_orders: false,
        ..test_settings().await
    })
    .await;
    app.add_product(SKU, "Keyed", 1_000, 1_000).await;
    app
}

async fn new_key(app: &TestApp, name: &str, limit: Limit) -> String {
    clients::create(&app.db, name, limit).await.unwrap().1
}

/// POSTs `body` to `url` under `key`, with `api_key` as a bearer token when given.
async fn post_as(
    url: &str,
    api_key: Option<&str>,
    key: &str,
    body: serde_json::Value,
) -> reqwest::Response {
    let mut req = client()
        .post(url)
        .header("Idempotency-Key", key)
        .json(&body);
    if let Some(api_key) = api_key {
        req = req.bearer_auth(api_key);
    }
    req.send().await.unwrap()
}

fn one(quantity: i64) -> serde_json::Value {
    serde_json::json!({"lines": [{"sku": SKU, "quantity": quantity}]})
}

async fn get_as(url: &str, api_key: Option<&str>) -> reqwest::Response {
    let mut req = client().get(url);
    if let Some(api_key) = api_key {
        req = req.bearer_auth(api_key);
    }
    req.send().await.unwrap()
}

async fn detail(res: reqwest::Response) -> String {
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = res.json().await.unwrap();
    body["detail"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn orders_and_holds_need_a_valid_key_unless_anonymous_orders_are_allowed() {
    assert!(
        !Settings::default().api_anonymous_orders,
        "anonymous API orders are off unless configured"
    );
    let app = keyed_app().await;
    let orders = app.url("/api/v1/orders");

    // Products stay public.
    assert_eq!(
        get_as(&app.url("/api/v1/products"), None).await.status(),
        200
    );

    for path in ["/api/v1/orders", "/api/v1/holds"] {
        let res = post_as(&app.url(path), None, "k-anon", one(1)).await;
        assert_eq!(res.status(), 401, "{path} without a key");
        assert_eq!(res.headers()["www-authenticate"], "Bearer");
        let message = detail(res).await;
        assert!(message.contains("need an API key"), "{message}");
    }
    for wrong in [
        "sk_0000000000000000000000000000000000000000000000000000000000000000",
        "not-a-key",
    ] {
        let res = post_as(&orders, Some(wrong), "k-wrong", one(1)).await;
        assert_eq!(res.status(), 401, "{wrong}");
        assert_eq!(
            res.headers()["www-authenticate"],
            r#"Bearer error="invalid_token""#
        );
        assert!(detail(res).await.contains("not valid"));
    }
    assert_eq!(app.count("select count(*) from orders").await, 0);
    assert_eq!(app.count("select count(*) from holds").await, 0);

    let key = new_key(&app, "partner", Limit::Default).await;
    assert!(key.starts_with("sk_") && key.len() >= 3 + 32, "{key}");
    let stored = sqlx::query_scalar!("select key_hash from api_clients")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_ne!(stored, key, "only a hash of the key is kept");
    assert_eq!(stored, clients::hash_key(&key));
    let res = post_as(&orders, Some(&key), "k-1", one(1)).await;
    assert_eq!(res.status(), 201);

    // Revoked: refused in every process within the cache's lifetime.
    let revoked = clients::revoke_by_name(&app.db, "partner").await.unwrap();
    assert!(revoked > 0);
    let since = Instant::now();
    loop {
        let res = post_as(&orders, Some(&key), "k-2", one(1)).await;
        if res.status() == 401 {
            assert!(detail(res).await.contains("revoked"));
            break;
        }
        assert_eq!(res.status(), 201);
        assert!(
            since.elapsed() < CACHE_FOR + Duration::from_secs(1),
            "a revoked key still works"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn idempotency_keys_orders_and_holds_belong_to_their_client() {
    let app = keyed_app().await;
    let (a, b) = (
        new_key(&app, "alice-app", Limit::Default).await,
        new_key(&app, "bob-app", Limit::Default).await,
    );
    let orders = app.url("/api/v1/orders");
    let body = serde_json::json!({
        "lines": [{"sku": SKU, "quantity": 1}],
        "email": "ada@example.com",
        "name": "Ada Lovelace",
    });

    let first = post_as(&orders, Some(&a), "shared-key", body.clone()).await;
    assert_eq!(first.status(), 201);
    let first: serde_json::Value = first.json().await.unwrap();
    // Another client, the same key and body: its own new order, not Ada's replayed.
    let other = post_as(&orders, Some(&b), "shared-key", body.clone()).await;
    assert_eq!(other.status(), 201);
    assert!(!other.headers().contains_key("idempotency-replayed"));
    let other: serde_json::Value = other.json().await.unwrap();
    assert_ne!(other["id"], first["id"]);
    // The first client's retry is still a replay of its own order.
    let again = post_as(&orders, Some(&a), "shared-key", body.clone()).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["id"], first["id"]);
    assert_eq!(app.count("select count(*) from orders").await, 2);

    // Reading: only the client that placed it.
    let url = app.url(&format!("/api/v1/orders/{}", first["id"].as_str().unwrap()));
    let mine = get_as(&url, Some(&a)).await;
    assert_eq!(mine.status(), 200);
    assert!(mine.text().await.unwrap().contains("ada@example.com"));
    let theirs = get_as(&url, Some(&b)).await;
    assert_eq!(theirs.status(), 404);
    assert!(!theirs.text().await.unwrap().contains("ada@"));
    assert_eq!(get_as(&url, None).await.status(), 401);

    // Holds: another client can neither read, confirm nor release one.
    let hold = post_as(&app.url("/api/v1/holds"), Some(&a), "hold-1", one(2)).await;
    assert_eq!(hold.status(), 201);
    let hold: serde_json::Value = hold.json().await.unwrap();
    let hold_url = app.url(&format!("/api/v1/holds/{}", hold["id"].as_str().unwrap()));
    assert_eq!(get_as(&hold_url, Some(&b)).await.status(), 404);
    let confirm = format!("{hold_url}/confirm");
    let res = client()
        .post(&confirm)
        .bearer_auth(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let res = client()
        .delete(&hold_url)
        .bearer_auth(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let state = sqlx::query_scalar!("select state from holds")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(state, "active", "the other client changed nothing");
    assert_eq!(get_as(&hold_url, Some(&a)).await.status(), 200);

    // Confirmed by its owner: the order is the owner's too.
    let res = client()
        .post(&confirm)
        .bearer_auth(&a)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let order: serde_json::Value = res.json().await.unwrap();
    let url = app.url(&format!("/api/v1/orders/{}", order["id"].as_str().unwrap()));
    assert_eq!(get_as(&url, Some(&a)).await.status(), 200);
    assert_eq!(get_as(&url, Some(&b)).await.status(), 404);
}

/// Starts checkout in a fresh browser (its own cookies) with the form key `key`.
async fn checkout_in_new_browser(app: &TestApp, key: &str) -> (reqwest::Client, String, String) {
    let browser = client();
    let (_, html) = {
        let res = browser.get(app.url("/")).send().await.unwrap();
        (res.status(), res.text().await.unwrap())
    };
    let csrf = crate::helpers::csrf_in(&html);
    let location = checkout(app, &browser, &csrf, key).await;
    (browser, csrf, location)
}

async fn checkout(app: &TestApp, browser: &reqwest::Client, csrf: &str, key: &str) -> String {
    let res = browser
        .post(app.url("/checkout"))
        .form(&[("csrf", csrf), ("key", key), ("lines", &format!("{SKU}~1"))])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    res.headers()["location"].to_str().unwrap().to_string()
}

#[tokio::test]
async fn a_checkout_form_key_is_the_browsers_own() {
    let app = keyed_app().await;
    let (first, csrf, hold) = checkout_in_new_browser(&app, "form-key-1").await;
    assert!(hold.starts_with("/checkout/"), "{hold}");
    // The same browser pressing again: the same hold.
    assert_eq!(checkout(&app, &first, &csrf, "form-key-1").await, hold);
    // Another browser with the same (leaked) key: a checkout of its own.
    let (_, _, other) = checkout_in_new_browser(&app, "form-key-1").await;
    assert!(other.starts_with("/checkout/"), "{other}");
    assert_ne!(other, hold);
    assert_eq!(app.count("select count(*) from holds").await, 2);
}

#[tokio::test]
async fn stockade_api_key_makes_lists_and_revokes_keys() {
    let app = keyed_app().await;
    let run = |args: &[&str]| {
        let out = crate::helpers::processes::clean_stockade_command()
            .args(args)
            .env(
                "DATABASE_URL",
                app.settings.database_url.as_deref().unwrap(),
            )
            .env("STOCKADE_LOG", "error")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let printed = run(&["api-key", "create", "--name", "cli-client", "--unlimited"]);
    let key = printed.lines().last().unwrap().trim().to_string();
    assert!(key.starts_with("sk_"), "{printed}");
    let res = post_as(&app.url("/api/v1/orders"), Some(&key), "cli-1", one(1)).await;
    assert_eq!(res.status(), 201);

    let listed = run(&["api-key", "list"]);
    assert!(
        listed.contains("cli-client") && listed.contains("unlimited"),
        "{listed}"
    );
    assert!(!listed.contains(&key), "keys are never listed");

    run(&["api-key", "revoke", "--name", "cli-client"]);
    let since = Instant::now();
    while post_as(&app.url("/api/v1/orders"), Some(&key), "cli-2", one(1))
        .await
        .status()
        != 401
    {
        assert!(since.elapsed() < CACHE_FOR + Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_admin_makes_and_revokes_api_clients() {
    let app = keyed_app().await;
    let csrf = app.login_admin().await;
    let (status, html) = app.get_text("/admin/api-clients").await;
    assert_eq!(status, 200);
    assert!(html.contains("No API clients yet"));
    let (_, dashboard) = app.get_text("/admin").await;
    assert!(
        dashboard.contains(r#"href="/admin/api-clients""#),
        "in the nav"
    );

    // Without the session's CSRF token: refused, nothing made.
    let res = app
        .admin_post("/admin/api-clients", &[("name", "forged")])
        .await;
    assert_eq!(res.status(), 403);
    assert_eq!(app.count("select count(*) from api_clients").await, 0);

    let res = app
        .admin_post(
            "/admin/api-clients",
            &[("csrf", &csrf), ("name", "shop-app"), ("rate_limit", "120")],
        )
        .await;
    assert_eq!(res.status(), 201);
    let html = res.text().await.unwrap();
    let marker = r#"<code id="new-key">"#;
    let start = html.find(marker).expect("the key is shown") + marker.len();
    let key = html[start..start + 67].to_string();
    assert!(key.starts_with("sk_"), "{key}");
    assert!(html.contains("120/min"));
    let res = post_as(&app.url("/api/v1/orders"), Some(&key), "admin-1", one(1)).await;
    assert_eq!(res.status(), 201);

    // Shown once: the list never has it again.
    let (_, html) = app.get_text("/admin/api-clients").await;
    assert!(html.contains("shop-app") && !html.contains(&key));

    // A bad rate limit is refused with a message.
    let res = app
        .admin_post(
            "/admin/api-clients",
            &[("csrf", &csrf), ("name", "bad"), ("rate_limit", "-3")],
        )
        .await;
    assert_eq!(res.status(), 422);

    let id = sqlx::query_scalar!("select id from api_clients where name = 'shop-app'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let path = format!("/admin/api-clients/{id}/revoke");
    assert_eq!(app.admin_post(&path, &[]).await.status(), 403);
    let res = app.admin_post(&path, &[("csrf", &csrf)]).await;
    assert_eq!(res.status(), 303);
    // Revoked in this process: at once.
    let res = post_as(&app.url("/api/v1/orders"), Some(&key), "admin-2", one(1)).await;
    assert_eq!(res.status(), 401);
    let (_, html) = app.get_text("/admin/api-clients?revoked=1").await;
    assert!(html.contains("revoked"));
}

/// The sum of `stockade_rate_limited_total{limiter=…}` in a `/metrics` text.
fn rate_limited(metrics: &str, limiter: &str) -> u64 {
    let prefix = format!("stockade_rate_limited_total{{limiter=\"{limiter}\"}} ");
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|n| n.trim().parse::<u64>().unwrap())
        .sum()
}

/// `(status, Retry-After)` of each of `n` orders by `api_key`, sent to `targets` in turn.
async fn burst(targets: &[&str], api_key: &str, n: usize, tag: &str) -> Vec<(u16, Option<u64>)> {
    let mut answers = Vec::new();
    for i in 0..n {
        let url = format!("{}/api/v1/orders", targets[i % targets.len()]);
        let res = post_as(&url, Some(api_key), &format!("{tag}-{i}"), one(1)).await;
        let retry_after = res
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap());
        let status = res.status().as_u16();
        if status == 429 {
            assert!(detail(res).await.contains("Too many orders"));
        }
        answers.push((status, retry_after));
    }
    answers
}

#[tokio::test]
async fn a_burst_past_the_limit_is_refused_across_processes_and_other_clients_are_not() {
    let app = keyed_app().await;
    // Three at once, then one every 30 s: nothing refills while the test runs.
    let limits = [
        ("STOCKADE_API_ANONYMOUS_ORDERS", "false".to_string()),
        ("STOCKADE_RATE_LIMIT_PER_MINUTE", "2".to_string()),
        ("STOCKADE_RATE_LIMIT_BURST", "3".to_string()),
    ];
    let servers = [
        serve_app(&app, &limits, &[]).await,
        serve_app(&app, &limits, &[]).await,
    ];
    let targets: Vec<&str> = servers.iter().map(|s| s.address.as_str()).collect();
    let (a, b) = (
        new_key(&app, "eager", Limit::Default).await,
        new_key(&app, "calm", Limit::Default).await,
    );

    let answers = burst(&targets, &a, 6, "a").await;
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        statuses,
        [201, 201, 201, 429, 429, 429],
        "the burst is shared by both processes"
    );
    for (_, retry_after) in &answers[3..] {
        let secs = retry_after.expect("429 says when to come back");
        assert!((1..=30).contains(&secs), "Retry-After {secs}");
    }
    assert_eq!(app.count("select count(*) from orders").await, 3);

    // Another client has a bucket of its own, on either process.
    let calm = burst(&targets, &b, 2, "b").await;
    assert_eq!(calm, [(201, None), (201, None)]);
    // Overrides: a client with its own rate, and one with none.
    let fast = new_key(&app, "fast", Limit::PerMinute(600)).await;
    let unlimited = new_key(&app, "loadtool", Limit::Unlimited).await;
    for (key, tag) in [(&fast, "fast"), (&unlimited, "unlimited")] {
        let answers = burst(&targets, key, 8, tag).await;
        assert!(answers.iter().all(|(s, _)| *s == 201), "{tag}: {answers:?}");
    }

    let mut refused = 0;
    for target in &targets {
        let metrics = client()
            .get(format!("{target}/metrics"))
            .bearer_auth(crate::helpers::METRICS_TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        refused += rate_limited(&metrics, "redis");
    }
    assert_eq!(refused, 3, "every 429 is counted");
}

#[tokio::test]
async fn with_redis_stopped_each_process_still_limits() {
    let mut app = spawn_app_with_own_redis_and(Settings {
        api_anonymous_orders: false,
        order_strategy: OrderStrategy::PgAtomic,
        rate_limit_per_minute: 2,
        rate_limit_burst: 3,
        ..test_settings().await
    })
    .await;
    app.add_product(SKU, "Keyed", 1_000, 1_000).await;
    let key = new_key(&app, "while-redis-is-away", Limit::Default).await;
    app.stop_redis();

    let answers = burst(&[app.address.as_str()], &key, 5, "away").await;
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        statuses,
        [201, 201, 201, 429, 429],
        "no failing open, no 500"
    );
    assert!(answers[3].1.is_some_and(|s| (1..=30).contains(&s)));
    let metrics = app.metrics().await;
    assert_eq!(rate_limited(&metrics, "process"), 2);
}

#[tokio::test]
async fn checkout_forms_count_against_the_address() {
    let app = spawn_app_with(Settings {
        rate_limit_per_minute: 2,
        rate_limit_burst: 2,
        ..test_settings().await
    })
    .await;
    app.add_product(SKU, "Keyed", 1_000, 1_000).await;
    let csrf = app.csrf().await;
    for key in ["c-1", "c-2"] {
        checkout(&app, &app.client, &csrf, key).await;
    }
    let res = app
        .client
        .post(app.url("/checkout"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("key", "c-3"),
            ("lines", &format!("{SKU}~1")),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert!(res.headers().contains_key("retry-after"));
    // Anonymous API orders from the same address share the bucket.
    let res = post_as(&app.url("/api/v1/orders"), None, "anon-1", one(1)).await;
    assert_eq!(res.status(), 429);
    assert_eq!(app.count("select count(*) from holds").await, 2);
}
