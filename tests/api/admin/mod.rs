//! The admin: login, sessions, CSRF, the route guard and the order list; stock changes
//! under load (`stock`), stock forms that apply once however often they are sent
//! (`forms`), and the idempotent run beneath them (`runs`).

pub(crate) mod forms;
mod runs;
mod stock;

use std::collections::BTreeSet;

use actix_web::http::Method;
use futures_util::future::join_all;
use stockade::http::admin::inventory;

use crate::helpers::{
    ADMIN_PASSWORD, ADMIN_USER, TestApp, client, spawn_app, spawn_app_with, test_settings,
};
use forms::form_key;

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
async fn guesses_sent_all_at_once_are_throttled_like_guesses_in_a_row() {
    let mut settings = test_settings().await;
    settings.login_max_failures = 3;
    let app = spawn_app_with(settings).await;
    app.create_admin().await;
    // The browser has its CSRF cookie before it guesses (from the login page), as every
    // browser does; otherwise the first pages' new cookies would replace each other
    // while the guesses' answers are still being read back.
    app.csrf().await;
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
