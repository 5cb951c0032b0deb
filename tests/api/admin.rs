//! The admin: login, sessions, CSRF, the route guard, stock changes under load.

use std::collections::BTreeSet;
use std::time::Duration;

use actix_web::http::Method;
use futures_util::future::join_all;
use stockade::http::admin::inventory;

use crate::helpers::{
    ADMIN_PASSWORD, ADMIN_USER, TestApp, client, spawn_app, spawn_app_with, test_settings,
};

/// A concrete URL for a route pattern.
async fn concrete(app: &TestApp, pattern: &str) -> String {
    let order: String = sqlx::query_scalar("select id::text from orders limit 1")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let hold: String = sqlx::query_scalar("select id::text from holds limit 1")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let id = if pattern.starts_with("/admin/holds") {
        hold
    } else {
        order
    };
    pattern
        .replace("{sku}", "KB-ALPINE-75")
        .replace("{id}", &id)
}

/// An app with the demo catalogue, one order and one hold.
async fn stocked_app() -> TestApp {
    let app = spawn_app().await;
    app.seed_demo().await;
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
        for probe in [Method::GET, Method::POST] {
            let req = match probe {
                Method::GET => anonymous.get(&url),
                _ => anonymous.post(&url).form(&[("csrf", "x")]),
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
        let _ = method;
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
                    .post(&url)
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
                "admin POST {pattern} without a CSRF token"
            );
        }
    }
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
    let browser = client();
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
            ("username", ADMIN_USER),
            ("password", ADMIN_PASSWORD),
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
    let res = app
        .admin_post(
            path,
            &[("units", "5"), ("reason", "delivery"), ("csrf", &token)],
        )
        .await;
    assert_eq!(res.status().as_u16(), 200);
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
    stockade::admin::create_admin(&app.db, ADMIN_USER, ADMIN_PASSWORD)
        .await
        .unwrap();
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
    stockade::admin::create_admin(&app.db, ADMIN_USER, ADMIN_PASSWORD)
        .await
        .unwrap();
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
            let m = r#"name="expected" value=""#;
            let shown: i32 = html[html.find(m).unwrap() + m.len()..]
                .split('"')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let new = (shown + 2).to_string();
            let res = app
                .admin_post(
                    "/admin/products/BUSY-1/adjust",
                    &[
                        ("csrf", &csrf),
                        ("expected", &shown.to_string()),
                        ("on_hand", &new),
                        ("reason", "stocktake"),
                    ],
                )
                .await;
            match res.status().as_u16() {
                200 => added += 2,
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
                let res = app
                    .admin_post(
                        "/admin/products/BUSY-1/restock",
                        &[("csrf", &csrf), ("units", "10"), ("reason", "delivery")],
                    )
                    .await;
                assert_eq!(res.status().as_u16(), 200);
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
    let app = spawn_app().await;
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
    let answers = join_all((0..8).map(|_| async {
        let res = app.admin_post(&path, &[("csrf", &csrf)]).await;
        (res.status().as_u16(), res.text().await.unwrap())
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
    let status: String = sqlx::query_scalar("select status from orders")
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
    let actors: Vec<String> = sqlx::query_scalar(
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
    let price: i64 = sqlx::query_scalar("select price_cents from products where sku = 'NEW-1'")
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
    stockade::admin::create_admin(&app.db, ADMIN_USER, ADMIN_PASSWORD)
        .await
        .unwrap();
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
