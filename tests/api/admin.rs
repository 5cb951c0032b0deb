//! The admin: login, sessions, CSRF, the route guard, stock changes under load, and stock
//! forms that apply once however often they are sent.

use std::collections::BTreeSet;
use std::time::Duration;

use actix_web::http::Method;
use futures_util::future::join_all;
use stockade::catalog::Sku;
use stockade::config::Settings;
use stockade::http::admin::inventory;
use stockade::idempotency::{
    Fingerprint, IdempotencyKey, Once, Request, RunError, Scope, StoredResponse, run,
};
use stockade::inventory::db::restock;

use crate::helpers::{
    ADMIN_PASSWORD, ADMIN_USER, TestApp, client, spawn_app, spawn_app_with, test_settings,
};

/// A concrete URL for a route pattern.
async fn concrete(app: &TestApp, pattern: &str) -> String {
    let order = sqlx::query_scalar!(r#"select id::text as "id!" from orders limit 1"#)
        .fetch_one(&app.db)
        .await
        .unwrap();
    let hold = sqlx::query_scalar!(r#"select id::text as "id!" from holds limit 1"#)
        .fetch_one(&app.db)
        .await
        .unwrap();
    let drop = sqlx::query_scalar!(r#"select id::text as "id!" from drops limit 1"#)
        .fetch_one(&app.db)
        .await
        .unwrap();
    let id = if pattern.starts_with("/admin/holds") {
        hold
    } else if pattern.contains("/admin/drops") {
        drop
    } else {
        order
    };
    pattern
        .replace("{sku}", "KB-ALPINE-75")
        .replace("{id}", &id)
        .replace("{action}", "pause")
}

/// An app with the demo catalogue, one order, one hold and one drop (of a product the
/// order and hold leave alone).
async fn stocked_app() -> TestApp {
    let app = spawn_app().await;
    app.seed_demo().await;
    stockade::drops::db::create(
        &app.db,
        &stockade::drops::NewDrop {
            sku: "KB-DROP-ORCA".into(),
            opens_at: chrono::Utc::now() + chrono::Duration::hours(1),
            prequeue_seconds: 0,
            queueing: stockade::drops::Queueing::Fifo,
            admit_per_minute: 60,
            max_active: None,
            session_seconds: 600,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        app.post_order("o1", &[("MS-DRIFT-WL", 1)])
            .await
            .status()
            .as_u16(),
        201
    );
    let res = app
        .client
        .post(app.url("/api/v1/holds"))
        .header("Idempotency-Key", "h1")
        .json(&serde_json::json!({"lines": [{"sku": "MG-STONE-350", "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    app
}

#[tokio::test]
async fn every_admin_route_is_closed_to_anonymous_visitors_and_open_to_admins() {
    let app = stocked_app().await;
    let anonymous = client();
    let routes = inventory();
    assert!(routes.len() >= 15, "the inventory lists the admin routes");
    for (method, pattern) in &routes {
        let url = app.url(&concrete(&app, pattern).await);
        for probe in [Method::GET, Method::POST, method.clone()] {
            let req = match probe {
                Method::GET => anonymous.get(&url),
                _ => anonymous
                    .request(as_reqwest(&probe), &url)
                    .form(&[("csrf", "x")]),
            };
            let res = req.send().await.unwrap();
            let status = res.status().as_u16();
            if pattern.starts_with("/api/") {
                assert_eq!(status, 401, "anonymous {probe} {pattern}");
                assert_eq!(res.headers()["content-type"], "application/problem+json");
            } else {
                assert_eq!(status, 303, "anonymous {probe} {pattern}");
                let location = res.headers()["location"].to_str().unwrap();
                assert!(
                    location.starts_with("/admin/login"),
                    "{probe} {pattern} → {location}"
                );
            }
        }
    }

    // Logged in: every GET route answers; every POST route refuses a missing CSRF token.
    app.login_admin().await;
    for (method, pattern) in &routes {
        let url = app.url(&concrete(&app, pattern).await);
        if *method == Method::GET {
            let res = app.client.get(&url).send().await.unwrap();
            assert_eq!(res.status().as_u16(), 200, "admin GET {pattern}");
        } else {
            let res = if pattern.starts_with("/api/") {
                app.client
                    .request(as_reqwest(method), &url)
                    .header("Idempotency-Key", "probe")
                    .json(&serde_json::json!({"units": 1, "expected_on_hand": 0, "on_hand": 1, "reason": "probe"}))
                    .send()
                    .await
                    .unwrap()
            } else {
                app.client
                    .post(&url)
                    .form(&[("reason", "probe")])
                    .send()
                    .await
                    .unwrap()
            };
            assert_eq!(
                res.status().as_u16(),
                403,
                "admin {method} {pattern} without a CSRF token"
            );
        }
    }
}

/// The same method, as the HTTP client spells it.
fn as_reqwest(method: &Method) -> reqwest::Method {
    reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap()
}

#[tokio::test]
async fn every_admin_page_links_only_to_guarded_routes() {
    // Crawl the admin as an admin; every admin address found must be in the inventory
    // (so the test above covers it) and refuse anonymous visitors.
    let app = stocked_app().await;
    app.login_admin().await;
    let patterns: Vec<&str> = inventory().into_iter().map(|(_, p)| p).collect();
    let matches = |path: &str| {
        patterns.iter().any(|p| {
            let (a, b): (Vec<&str>, Vec<&str>) =
                (p.split('/').collect(), path.split('/').collect());
            a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.starts_with('{') || x == y)
        })
    };
    let mut seen = BTreeSet::new();
    let mut queue = vec!["/admin".to_string()];
    while let Some(path) = queue.pop() {
        if !seen.insert(path.clone()) || seen.len() > 80 {
            continue;
        }
        let (_, html) = app.get_text(&path).await;
        for attr in ["href=\"", "action=\""] {
            for piece in html.split(attr).skip(1) {
                let link = piece
                    .split('"')
                    .next()
                    .unwrap()
                    .split('?')
                    .next()
                    .unwrap()
                    .to_string();
                let admin_link = link.starts_with("/admin") || link.starts_with("/api/v1/admin");
                if admin_link && link != "/admin/login" && link != "/admin/logout" {
                    assert!(
                        matches(&link),
                        "{link} (linked from {path}) is not in the inventory"
                    );
                    if attr == "href=\"" {
                        queue.push(link);
                    }
                }
            }
        }
    }
    assert!(seen.len() > 8, "crawled {seen:?}");
    let anonymous = client();
    for path in &seen {
        let res = anonymous.get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status().as_u16(), 303, "anonymous {path}");
    }
}

/// `(what is wrong, the form, an Origin header)`.
type Forgery<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<&'a str>);

/// Logs a second browser in as the same admin; returns that session's CSRF token.
async fn second_session(app: &TestApp) -> String {
    log_in_as(app, &client(), ADMIN_USER, ADMIN_PASSWORD).await
}

/// Logs `browser` in as `username`; returns that session's CSRF token.
async fn log_in_as(
    app: &TestApp,
    browser: &reqwest::Client,
    username: &str,
    password: &str,
) -> String {
    let text = |path: &'static str| {
        let browser = browser.clone();
        async move {
            browser
                .get(app.url(path))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let after = |html: &str, marker: &str| {
        let start = html.find(marker).unwrap() + marker.len();
        html[start..start + 64].to_string()
    };
    let csrf = after(&text("/").await, r#"<meta name="csrf-token" content=""#);
    let res = browser
        .post(app.url("/admin/login"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("username", username),
            ("password", password),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 303);
    let html = text("/admin").await;
    let form = &html[html.find(r#"action="/admin/logout""#).unwrap()..];
    after(form, r#"name="csrf" value=""#)
}

async fn ledger_rows(app: &TestApp) -> i64 {
    app.count("select count(*) from stock_movements").await
}

#[tokio::test]
async fn forged_admin_posts_are_refused_and_change_nothing() {
    let app = stocked_app().await;
    let token = app.login_admin().await;
    let second_token = second_session(&app).await;
    assert_ne!(second_token, token);

    let before = (app.stock("KB-ALPINE-75").await, ledger_rows(&app).await);
    let path = "/admin/products/KB-ALPINE-75/restock";
    let zeros = "0".repeat(64);
    let cases: Vec<Forgery> = vec![
        ("no token", vec![("units", "5"), ("reason", "forged")], None),
        (
            "a wrong token",
            vec![("units", "5"), ("reason", "forged"), ("csrf", &zeros)],
            None,
        ),
        (
            "another session's token",
            vec![
                ("units", "5"),
                ("reason", "forged"),
                ("csrf", &second_token),
            ],
            None,
        ),
        (
            "a cross-site Origin",
            vec![("units", "5"), ("reason", "forged"), ("csrf", &token)],
            Some("https://evil.example"),
        ),
    ];
    for (name, form, origin) in cases {
        let mut req = app.client.post(app.url(path)).form(&form);
        if let Some(origin) = origin {
            req = req.header("Origin", origin);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status().as_u16(), 403, "{name}");
        assert_eq!(
            (app.stock("KB-ALPINE-75").await, ledger_rows(&app).await),
            before,
            "{name} changed something"
        );
    }
    // Sec-Fetch-Site: cross-site is refused too, even on the storefront.
    let res = app
        .client
        .post(app.url("/cart/add"))
        .header("Sec-Fetch-Site", "cross-site")
        .form(&[("sku", "KB-ALPINE-75"), ("quantity", "1")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 403);
    // The genuine form works.
    let key = form_key(&app, "/admin/products/KB-ALPINE-75", path).await;
    let res = app
        .admin_post(
            path,
            &[
                ("units", "5"),
                ("reason", "delivery"),
                ("csrf", &token),
                ("key", &key),
            ],
        )
        .await;
    assert_eq!(res.status().as_u16(), 303);
    assert_eq!(app.stock("KB-ALPINE-75").await.0, before.0.0 + 5);
}

fn cookie_value(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| {
            c.strip_prefix(&format!("{name}="))
                .map(|rest| rest.split(';').next().unwrap().to_string())
        })
}

#[tokio::test]
async fn sessions_are_new_at_login_and_dead_after_logout() {
    let app = spawn_app().await;
    app.create_admin().await;
    let first = app.login(ADMIN_USER, ADMIN_PASSWORD).await;
    let first_token = cookie_value(&first, "stockade_admin").expect("session cookie");
    let set_cookie = first.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(
        set_cookie.contains("httponly") && set_cookie.contains("samesite=strict"),
        "{set_cookie}"
    );
    let second = app.login(ADMIN_USER, ADMIN_PASSWORD).await;
    let second_token = cookie_value(&second, "stockade_admin").unwrap();
    assert_ne!(first_token, second_token, "the session id changes at login");

    // The replaced session is dead; so is the current one after logout.
    let with_cookie = |token: String| {
        let app = &app;
        async move {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap()
                .get(app.url("/admin"))
                .header("Cookie", format!("stockade_admin={token}"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(with_cookie(first_token).await, 303);
    assert_eq!(with_cookie(second_token.clone()).await, 200);
    let csrf = app.admin_csrf().await;
    let res = app.admin_post("/admin/logout", &[("csrf", &csrf)]).await;
    assert_eq!(res.headers()["location"], "/admin/login");
    assert_eq!(
        with_cookie(second_token).await,
        303,
        "the old cookie is dead after logout"
    );
    assert_eq!(app.count("select count(*) from admin_sessions").await, 0);
}

#[tokio::test]
async fn unknown_users_and_wrong_passwords_get_the_same_answer_and_brute_force_gets_429() {
    let mut settings = test_settings().await;
    settings.login_max_failures = 3;
    settings.login_max_failures_per_client = 6;
    let app = spawn_app_with(settings).await;
    app.create_admin().await;
    let unknown = app.login("nobody", "whatever-it-is").await;
    let (unknown_status, unknown_body) = (unknown.status().as_u16(), unknown.text().await.unwrap());
    let wrong = app.login(ADMIN_USER, "not the password").await;
    let (wrong_status, wrong_body) = (wrong.status().as_u16(), wrong.text().await.unwrap());
    assert_eq!((unknown_status, wrong_status), (401, 401));
    let message = |body: &str| body.contains("Wrong username or password.");
    assert!(message(&unknown_body) && message(&wrong_body));

    assert_eq!(
        app.login(ADMIN_USER, "guess two").await.status().as_u16(),
        401
    );
    assert_eq!(
        app.login(ADMIN_USER, "guess three").await.status().as_u16(),
        401
    );
    let res = app.login(ADMIN_USER, "guess four").await;
    assert_eq!(
        res.status().as_u16(),
        429,
        "after three failures on the account"
    );
    assert!(res.headers().contains_key("retry-after"));
    // Even the right password waits now.
    assert_eq!(
        app.login(ADMIN_USER, ADMIN_PASSWORD)
            .await
            .status()
            .as_u16(),
        429
    );
    // The per-client limit stops guessing across accounts.
    for name in ["eve", "mallory", "trudy"] {
        app.login(name, "guess").await;
    }
    assert_eq!(app.login("oscar", "guess").await.status().as_u16(), 429);
}

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

#[tokio::test]
async fn guesses_sent_all_at_once_are_throttled_like_guesses_in_a_row() {
    let mut settings = test_settings().await;
    settings.login_max_failures = 3;
    let app = spawn_app_with(settings).await;
    app.create_admin().await;
    let answers = join_all((0..20).map(|i| {
        let app = &app;
        async move {
            app.login(ADMIN_USER, &format!("guess number {i}"))
                .await
                .status()
                .as_u16()
        }
    }))
    .await;
    let checked = answers.iter().filter(|s| **s == 401).count();
    let refused = answers.iter().filter(|s| **s == 429).count();
    assert_eq!((checked, refused), (3, 17), "{answers:?}");
}

// ---------------------------------------------------------------- stock forms apply once

/// The value of field `name` in the form of `html` that posts to `action`.
fn field(html: &str, action: &str, name: &str) -> String {
    let start = html
        .find(&format!(r#"action="{action}""#))
        .unwrap_or_else(|| panic!("no form posts to {action}"));
    let form = &html[start..];
    let form = &form[..form.find("</form>").unwrap()];
    let marker = format!(r#"name="{name}" value=""#);
    let start = form
        .find(&marker)
        .unwrap_or_else(|| panic!("the {action} form has no {name}"))
        + marker.len();
    form[start..].split('"').next().unwrap().to_string()
}

/// Opens `page` and returns the idempotency key of its form that posts to `action`.
async fn form_key(app: &TestApp, page: &str, action: &str) -> String {
    let (status, html) = app.get_text(page).await;
    assert_eq!(status, 200, "{page}");
    let key = field(&html, action, "key");
    assert_eq!(key.len(), 36, "a generated key: {key}");
    key
}

fn location(res: &reqwest::Response) -> String {
    res.headers()["location"].to_str().unwrap().to_string()
}

/// Asserts that every answer is 303 to `page?done=key`, and that this page shows `notice`.
async fn assert_all_show(
    app: &TestApp,
    answers: Vec<reqwest::Response>,
    page: &str,
    key: &str,
    notice: &str,
) {
    let expected = format!("{page}?done={key}");
    for res in &answers {
        assert_eq!(res.status().as_u16(), 303, "answered {res:?}");
        assert_eq!(location(res), expected);
    }
    let (status, html) = app.get_text(&expected).await;
    assert_eq!(status, 200);
    assert!(
        html.contains(&format!(r#"id="notice">{notice}</p>"#)),
        "{expected} does not show {notice:?}: {html}"
    );
}

/// Sends `form` to `path` `times` times at once.
async fn send_at_once(
    app: &TestApp,
    path: &str,
    form: &[(&str, &str)],
    times: usize,
) -> Vec<reqwest::Response> {
    join_all((0..times).map(|_| app.admin_post(path, form))).await
}

async fn count_where(app: &TestApp, sql: &str, value: &str) -> i64 {
    // Runtime: the statement is the caller's.
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(value)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// Ledger rows of `sku` written for `reason`.
async fn movements(app: &TestApp, sku: &str, reason: &str) -> i64 {
    sqlx::query_scalar!(
        r#"select count(*) as "count!" from stock_movements where sku = $1 and reason = $2"#,
        sku,
        reason
    )
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// Stock and every ledger row: what a refused form must leave as it was.
async fn snapshot(app: &TestApp) -> (Vec<(String, i32, i32)>, i64) {
    let stock = sqlx::query!("select sku, on_hand, reserved from stock order by sku")
        .fetch_all(&app.db)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.sku, r.on_hand, r.reserved))
        .collect();
    (stock, ledger_rows(app).await)
}

#[tokio::test]
async fn a_restock_form_sent_twice_or_twice_at_once_adds_its_units_once() {
    let app = spawn_app().await;
    app.add_product("ONCE-1", "Once", 1_000, 10).await;
    let csrf = app.login_admin().await;
    let (page, path) = ("/admin/products/ONCE-1", "/admin/products/ONCE-1/restock");

    // A form without its key, or with a broken one, is refused: nothing changes.
    let before = snapshot(&app).await;
    for key in [None, Some(""), Some("bad\u{7f}key")] {
        let mut form = vec![("csrf", csrf.as_str()), ("units", "5"), ("reason", "x")];
        form.extend(key.map(|k| ("key", k)));
        let res = app.admin_post(path, &form).await;
        assert_eq!(res.status().as_u16(), 400, "key {key:?}");
        assert!(res.text().await.unwrap().contains("reload the page"));
    }
    // Bad values re-render the form with a message, change nothing, and spend no key.
    let key = form_key(&app, page, path).await;
    let res = app
        .admin_post(
            path,
            &[
                ("csrf", &csrf),
                ("key", &key),
                ("units", "0"),
                ("reason", "x"),
            ],
        )
        .await;
    assert_eq!(res.status().as_u16(), 422);
    let html = res.text().await.unwrap();
    assert!(
        html.contains("Units to add must be a whole number"),
        "{html}"
    );
    assert!(html.contains(r#"action="/admin/products/ONCE-1/restock""#));
    assert_eq!(snapshot(&app).await, before);

    // Sent, then sent again (a refresh, or back and submit): applied once.
    let form = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("units", "5"),
        ("reason", "delivery"),
    ];
    let first = app.admin_post(path, &form).await;
    let again = app.admin_post(path, &form).await;
    assert_all_show(
        &app,
        vec![first, again],
        page,
        &key,
        "Added 5 units; 15 on hand now.",
    )
    .await;
    assert_eq!(app.stock("ONCE-1").await, (15, 0));
    assert_eq!(movements(&app, "ONCE-1", "restock").await, 1);

    // A fresh form sent twice at once (a double click): applied once.
    let key = form_key(&app, page, path).await;
    let form = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("units", "7"),
        ("reason", "second delivery"),
    ];
    let answers = send_at_once(&app, path, &form, 2).await;
    assert_all_show(&app, answers, page, &key, "Added 7 units; 22 on hand now.").await;
    assert_eq!(app.stock("ONCE-1").await, (22, 0));
    assert_eq!(movements(&app, "ONCE-1", "restock").await, 2);

    // The same key with other values: 422, and nothing changes.
    let before = snapshot(&app).await;
    let res = app
        .admin_post(
            path,
            &[
                ("csrf", &csrf),
                ("key", &key),
                ("units", "8"),
                ("reason", "second delivery"),
            ],
        )
        .await;
    assert_eq!(res.status().as_u16(), 422);
    let html = res.text().await.unwrap();
    assert!(
        html.contains("already submitted with other values"),
        "{html}"
    );
    assert_eq!(snapshot(&app).await, before);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_count_form_sent_twice_or_twice_at_once_sets_the_count_once() {
    let app = spawn_app().await;
    app.add_product("COUNT-1", "Counted", 1_000, 10).await;
    let csrf = app.login_admin().await;
    let (page, path) = ("/admin/products/COUNT-1", "/admin/products/COUNT-1/adjust");

    // Sent, then again: the second does not meet "stock moved", it gets the first answer.
    let key = form_key(&app, page, path).await;
    let form = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("expected", "10"),
        ("on_hand", "12"),
        ("reason", "stocktake"),
    ];
    let first = app.admin_post(path, &form).await;
    let again = app.admin_post(path, &form).await;
    assert_all_show(&app, vec![first, again], page, &key, "On hand set to 12.").await;
    assert_eq!(app.stock("COUNT-1").await, (12, 0));
    assert_eq!(movements(&app, "COUNT-1", "adjust").await, 1);

    // Twice at once.
    let key = form_key(&app, page, path).await;
    let form = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("expected", "12"),
        ("on_hand", "7"),
        ("reason", "two broken"),
    ];
    let answers = send_at_once(&app, path, &form, 2).await;
    assert_all_show(&app, answers, page, &key, "On hand set to 7.").await;
    assert_eq!(app.stock("COUNT-1").await, (7, 0));
    assert_eq!(movements(&app, "COUNT-1", "adjust").await, 2);

    // The same key with another count: 422, nothing changes.
    let before = snapshot(&app).await;
    let mut other = form;
    other[3] = ("on_hand", "9");
    let res = app.admin_post(path, &other).await;
    assert_eq!(res.status().as_u16(), 422);
    assert_eq!(snapshot(&app).await, before);

    // A form that shows a stale count still gets the compare-and-set 409, with the new
    // figure in a fresh form, and changes nothing.
    let key = form_key(&app, page, path).await;
    let stale = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("expected", "12"),
        ("on_hand", "20"),
        ("reason", "late count"),
    ];
    for _ in 0..2 {
        let res = app.admin_post(path, &stale).await;
        assert_eq!(res.status().as_u16(), 409);
        let html = res.text().await.unwrap();
        assert!(
            html.contains("Stock moved while you were counting"),
            "{html}"
        );
        assert_eq!(field(&html, path, "expected"), "7");
        assert_ne!(field(&html, path, "key"), key, "a fresh form");
    }
    assert_eq!(snapshot(&app).await, before);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_cancel_form_sent_twice_or_twice_at_once_returns_the_units_once() {
    let app = spawn_app().await;
    app.add_product("BACK-1", "Returned", 1_000, 20).await;
    let mut orders = Vec::new();
    for i in 0..3 {
        let order: serde_json::Value = app
            .post_order(&format!("order-{i}"), &[("BACK-1", 2)])
            .await
            .json()
            .await
            .unwrap();
        orders.push(order["id"].as_str().unwrap().to_string());
    }
    assert_eq!(app.stock("BACK-1").await, (14, 0));
    let csrf = app.login_admin().await;
    let cancelled = "select count(*) from orders where id::text = $1 and status = 'cancelled'";

    // Sent, then again: the second shows what the first did (not "already cancelled").
    let page = format!("/admin/orders/{}", orders[0]);
    let path = format!("{page}/cancel");
    let key = form_key(&app, &page, &path).await;
    let form = [("csrf", csrf.as_str()), ("key", &key)];
    let first = app.admin_post(&path, &form).await;
    let again = app.admin_post(&path, &form).await;
    let notice = "Order cancelled; its units are back in stock.";
    assert_all_show(&app, vec![first, again], &page, &key, notice).await;
    assert_eq!(app.stock("BACK-1").await, (16, 0));
    assert_eq!(movements(&app, "BACK-1", "cancel").await, 1);

    // Twice at once.
    let page = format!("/admin/orders/{}", orders[1]);
    let path = format!("{page}/cancel");
    let key = form_key(&app, &page, &path).await;
    let form = [("csrf", csrf.as_str()), ("key", &key)];
    let answers = send_at_once(&app, &path, &form, 2).await;
    assert_all_show(&app, answers, &page, &key, notice).await;
    assert_eq!(app.stock("BACK-1").await, (18, 0));
    assert_eq!(movements(&app, "BACK-1", "cancel").await, 2);

    // A cancel form's key sent to another order's cancel: 422, that order stays placed.
    let before = snapshot(&app).await;
    let res = app
        .admin_post(&format!("/admin/orders/{}/cancel", orders[2]), &form)
        .await;
    assert_eq!(res.status().as_u16(), 422);
    assert_eq!(snapshot(&app).await, before);
    assert_eq!(count_where(&app, cancelled, &orders[2]).await, 0);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_release_form_sent_twice_or_twice_at_once_returns_the_units_once() {
    let app = spawn_app().await;
    app.add_product("HELD-1", "Held", 1_000, 20).await;
    let mut holds = Vec::new();
    for i in 0..3 {
        let res = crate::helpers::post_lines(
            &app.client,
            &app.url("/api/v1/holds"),
            &format!("hold-{i}"),
            &[("HELD-1", 2)],
        )
        .await;
        assert_eq!(res.status().as_u16(), 201);
        let hold: serde_json::Value = res.json().await.unwrap();
        holds.push(hold["id"].as_str().unwrap().to_string());
    }
    assert_eq!(app.stock("HELD-1").await, (20, 6));
    let csrf = app.login_admin().await;
    let page = "/admin/holds";
    let notice = "Hold released; its units are back on sale.";
    let released = "select count(*) from holds where id::text = $1 and state = 'released'";

    // Sent, then again.
    let path = format!("/admin/holds/{}/release", holds[0]);
    let key = form_key(&app, page, &path).await;
    let form = [("csrf", csrf.as_str()), ("key", &key)];
    let first = app.admin_post(&path, &form).await;
    let again = app.admin_post(&path, &form).await;
    assert_all_show(&app, vec![first, again], page, &key, notice).await;
    assert_eq!(app.stock("HELD-1").await, (20, 4));
    assert_eq!(movements(&app, "HELD-1", "release").await, 1);

    // Twice at once.
    let path = format!("/admin/holds/{}/release", holds[1]);
    let key = form_key(&app, page, &path).await;
    let form = [("csrf", csrf.as_str()), ("key", &key)];
    let answers = send_at_once(&app, &path, &form, 2).await;
    assert_all_show(&app, answers, page, &key, notice).await;
    assert_eq!(app.stock("HELD-1").await, (20, 2));
    assert_eq!(movements(&app, "HELD-1", "release").await, 2);

    // The key sent to another hold's release: 422, that hold keeps its units.
    let before = snapshot(&app).await;
    let res = app
        .admin_post(&format!("/admin/holds/{}/release", holds[2]), &form)
        .await;
    assert_eq!(res.status().as_u16(), 422);
    assert_eq!(snapshot(&app).await, before);
    assert_eq!(count_where(&app, released, &holds[2]).await, 0);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_stock_form_whose_first_send_is_still_running_gets_409_with_retry_after() {
    let mut settings = test_settings().await;
    // Room for the first send to wait on the row lock this test holds.
    settings.statement_timeout = Duration::from_secs(10);
    settings.tx_timeout = Duration::from_secs(11);
    settings.lease_ttl = Duration::from_secs(12);
    let app = spawn_app_with(settings).await;
    app.add_product("SLOW-1", "Slow", 1_000, 10).await;
    let csrf = app.login_admin().await;
    let (page, path) = ("/admin/products/SLOW-1", "/admin/products/SLOW-1/restock");
    let key = form_key(&app, page, path).await;
    let form = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("units", "5"),
        ("reason", "delivery"),
    ];

    let mut lock = app.db.begin().await.unwrap();
    sqlx::query!("select on_hand from stock where sku = 'SLOW-1' for update")
        .fetch_one(&mut *lock)
        .await
        .unwrap();
    let first = app.admin_post(path, &form);
    let second = async {
        // Once the first send holds the key (and waits for the row), send it again.
        while app
            .count("select count(*) from idempotency_keys where state = 'in_flight'")
            .await
            == 0
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let res = app.admin_post(path, &form).await;
        lock.rollback().await.unwrap();
        res
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(second.status().as_u16(), 409);
    assert_eq!(second.headers()["retry-after"], "1");
    let html = second.text().await.unwrap();
    assert!(html.contains("first is still being applied"), "{html}");
    assert_all_show(
        &app,
        vec![first],
        page,
        &key,
        "Added 5 units; 15 on hand now.",
    )
    .await;
    // Sent once more now, it is answered like the first.
    let again = app.admin_post(path, &form).await;
    assert_all_show(
        &app,
        vec![again],
        page,
        &key,
        "Added 5 units; 15 on hand now.",
    )
    .await;
    assert_eq!(app.stock("SLOW-1").await, (15, 0));
    assert_eq!(movements(&app, "SLOW-1", "restock").await, 1);
    app.assert_invariants().await;
}

#[tokio::test]
async fn stock_form_keys_belong_to_one_admin() {
    let app = spawn_app().await;
    app.add_product("TWO-1", "Shared", 1_000, 10).await;
    let csrf = app.login_admin().await;
    let (page, path) = ("/admin/products/TWO-1", "/admin/products/TWO-1/restock");
    let key = form_key(&app, page, path).await;
    let form = [
        ("key", key.as_str()),
        ("units", "5"),
        ("reason", "delivery"),
    ];
    let with_csrf = |csrf| [&[("csrf", csrf)], &form[..]].concat();
    let res = app.admin_post(path, &with_csrf(&csrf)).await;
    assert_all_show(
        &app,
        vec![res],
        page,
        &key,
        "Added 5 units; 15 on hand now.",
    )
    .await;

    // Another admin, sending the very same key, makes a change of their own, and does not
    // see the first admin's result under it.
    stockade::admin::create_admin(&app.db, "grace", "another long passphrase")
        .await
        .unwrap();
    let other = client();
    let other_csrf = log_in_as(&app, &other, "grace", "another long passphrase").await;
    let res = other
        .post(app.url(path))
        .form(&with_csrf(&other_csrf))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 303);
    let html = other
        .get(app.url(&location(&res)))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("Added 5 units; 20 on hand now."), "{html}");
    assert_eq!(app.stock("TWO-1").await, (20, 0));
    let (_, html) = app.get_text(&format!("{page}?done={key}")).await;
    assert!(html.contains("Added 5 units; 15 on hand now."), "{html}");
    app.assert_invariants().await;
}

// ---------------------------------------------------------------- idempotency::run

/// Runs a restock of one unit of `sku` under `key` by [`stockade::idempotency::run`],
/// holding its transaction open for `hold` before answering.
async fn restock_once(
    app: &TestApp,
    key: &str,
    fingerprint: &str,
    stale_after: Duration,
    hold: Duration,
) -> Result<Result<Once, String>, RunError> {
    let request = Request {
        scope: Scope::Admin,
        key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: Fingerprint::of(&fingerprint),
        stale_after,
        wait: Duration::from_secs(10),
    };
    run(
        &app.db,
        request,
        async |tx: &mut sqlx::PgConnection| -> Result<StoredResponse, String> {
            let sku = Sku::parse("RUN-1").unwrap();
            let on_hand = restock(tx, &sku, 1, "run", "test")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("too many")?;
            tokio::time::sleep(hold).await;
            Ok(StoredResponse {
                status: 200,
                body: serde_json::json!({ "on_hand": on_hand }),
            })
        },
    )
    .await
}

#[tokio::test]
async fn twin_runs_under_one_key_apply_the_change_once_and_replay_its_answer() {
    let app = spawn_app().await;
    app.add_product("RUN-1", "Run", 100, 10).await;
    let results = join_all((0..8).map(|_| {
        restock_once(
            &app,
            "twins",
            "restock 1",
            Duration::from_secs(60),
            Duration::from_millis(300),
        )
    }))
    .await;
    let outcomes: Vec<Once> = results.into_iter().map(|r| r.unwrap().unwrap()).collect();
    let expected = StoredResponse {
        status: 200,
        body: serde_json::json!({ "on_hand": 11 }),
    };
    let applied = outcomes
        .iter()
        .filter(|o| **o == Once::Applied(expected.clone()))
        .count();
    let replayed = outcomes
        .iter()
        .filter(|o| **o == Once::Replayed(expected.clone()))
        .count();
    assert_eq!((applied, replayed), (1, 7), "{outcomes:?}");
    assert_eq!(app.stock("RUN-1").await, (11, 0));
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_refused_run_changes_nothing_and_leaves_its_key_to_a_retry() {
    let app = spawn_app().await;
    app.add_product("RUN-1", "Run", 100, 10).await;
    let key = IdempotencyKey::parse("refused").unwrap();
    let request = Request {
        scope: Scope::Admin,
        key: key.clone(),
        fingerprint: Fingerprint::of(&"restock 1"),
        stale_after: Duration::from_secs(60),
        wait: Duration::ZERO,
    };
    let refused = run(&app.db, request, async |tx: &mut sqlx::PgConnection| {
        // Written, then refused: the write must not survive.
        restock(tx, &Sku::parse("RUN-1").unwrap(), 1, "run", "test")
            .await
            .unwrap();
        Err::<StoredResponse, _>("refused")
    })
    .await
    .unwrap();
    assert_eq!(refused, Err("refused"));
    assert_eq!(app.stock("RUN-1").await, (10, 0));
    let stored = stockade::idempotency::stored(&app.db, Scope::Admin, &key)
        .await
        .unwrap();
    assert_eq!(stored, None);
    let retried = restock_once(
        &app,
        "refused",
        "restock 1",
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(matches!(retried, Once::Applied(_)), "{retried:?}");
    assert_eq!(app.stock("RUN-1").await, (11, 0));
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_run_with_other_values_under_a_used_key_is_a_mismatch_and_runs_nothing() {
    let app = spawn_app().await;
    app.add_product("RUN-1", "Run", 100, 10).await;
    let first = restock_once(
        &app,
        "k",
        "restock 1",
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(matches!(first, Once::Applied(_)), "{first:?}");
    let other = restock_once(
        &app,
        "k",
        "restock 2",
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(other, Once::Mismatch);
    assert_eq!(app.stock("RUN-1").await, (11, 0));
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_run_whose_key_was_taken_over_rolls_back_and_the_retry_applies_once() {
    let app = spawn_app().await;
    app.add_product("RUN-1", "Run", 100, 10).await;
    // Every claim counts as stale at once, so the second run takes over the first's key
    // while the first is still inside its transaction.
    let slow = restock_once(
        &app,
        "taken",
        "restock 1",
        Duration::ZERO,
        Duration::from_millis(1500),
    );
    let retry = async {
        // Once the first has claimed the key (its change is running then):
        while app
            .count("select count(*) from idempotency_keys where key = 'taken'")
            .await
            == 0
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        restock_once(&app, "taken", "restock 1", Duration::ZERO, Duration::ZERO).await
    };
    let (slow, retry) = tokio::join!(slow, retry);
    assert!(matches!(slow, Err(RunError::TakenOver)), "{slow:?}");
    assert!(matches!(retry, Ok(Ok(Once::Applied(_)))), "{retry:?}");
    assert_eq!(app.stock("RUN-1").await, (11, 0));
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_order_list_applies_each_filter_that_is_set_and_only_those() {
    let app = stocked_app().await;
    assert_eq!(
        app.post_order("o2", &[("KB-ALPINE-75", 1)])
            .await
            .status()
            .as_u16(),
        201
    );
    let id_of = |sku: &'static str| {
        let app = &app;
        async move {
            sqlx::query_scalar!(
                r#"select order_id::text as "id!" from order_lines where sku = $1"#,
                sku
            )
            .fetch_one(&app.db)
            .await
            .unwrap()
        }
    };
    let (mouse, keyboard) = (id_of("MS-DRIFT-WL").await, id_of("KB-ALPINE-75").await);
    stockade::orders::cancel(&app.db, mouse.parse().unwrap(), "test", "filter test")
        .await
        .unwrap();
    app.login_admin().await;
    let today = chrono::Utc::now().date_naive().to_string();
    let listed = |query: String| {
        let app = &app;
        let (mouse, keyboard) = (mouse.clone(), keyboard.clone());
        async move {
            let (status, html) = app.get_text(&format!("/admin/orders?{query}")).await;
            assert_eq!(status, 200, "{query}");
            let shown = |id: &str| html.contains(&format!("/admin/orders/{id}\""));
            (shown(&mouse), shown(&keyboard))
        }
    };
    assert_eq!(listed(String::new()).await, (true, true));
    assert_eq!(listed("status=cancelled".into()).await, (true, false));
    assert_eq!(listed("status=placed".into()).await, (false, true));
    assert_eq!(listed("sku=kb-alpine-75".into()).await, (false, true));
    assert_eq!(
        listed("status=placed&sku=MS-DRIFT-WL".into()).await,
        (false, false)
    );
    assert_eq!(listed(format!("date={today}")).await, (true, true));
    assert_eq!(listed("date=2001-01-01".into()).await, (false, false));
    assert_eq!(
        listed(format!("status=cancelled&sku=MS-DRIFT-WL&date={today}")).await,
        (true, false)
    );
    let (status, _) = app.get_text("/admin/orders?status=lost").await;
    assert_eq!(status, 422);
}
