//! The shopping flow in pages, and bad input over pages and API.

use futures_util::future::join_all;

use crate::helpers::{TestApp, spawn_app};

/// Everything a bad request must leave as it was.
#[derive(Debug, PartialEq)]
struct Snapshot {
    stock: Vec<(String, i32, i32)>,
    orders: i64,
    lines: i64,
    movements: i64,
    keys: i64,
}

async fn snapshot(app: &TestApp) -> Snapshot {
    Snapshot {
        stock: sqlx::query_as("select sku, on_hand, reserved from stock order by sku")
            .fetch_all(&app.db)
            .await
            .unwrap(),
        orders: app.count("select count(*) from orders").await,
        lines: app.count("select count(*) from order_lines").await,
        movements: app.count("select count(*) from stock_movements").await,
        keys: app.count("select count(*) from idempotency_keys").await,
    }
}

fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", urlencode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `(path, name, Idempotency-Key, body, expected status, words in the message)`.
type Case<'a> = (&'a str, &'a str, Option<&'a str>, Body, u16, &'a str);

enum Body {
    Json(&'static str),
    Raw(&'static str, &'static str),
    Form(Vec<(&'static str, &'static str)>),
    Big,
}

#[tokio::test]
async fn bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let app = spawn_app().await;
    app.add_product("GOOD-1", "Good", 1_000, 5).await;
    let before = snapshot(&app).await;
    let long_key = "k".repeat(256);
    let ok_lines = r#"{"lines":[{"sku":"GOOD-1","quantity":1}]}"#;
    let cases: Vec<Case> = vec![
        // API: (method+path, name, idempotency key, body, status, words in the message)
        (
            "/api/v1/orders",
            "no key",
            None,
            Body::Json(ok_lines),
            400,
            "Idempotency-Key header is required",
        ),
        (
            "/api/v1/orders",
            "key too long",
            Some(&long_key),
            Body::Json(ok_lines),
            400,
            "longer than 255",
        ),
        (
            "/api/v1/orders",
            "key with a tab",
            Some("a\tb"),
            Body::Json(ok_lines),
            400,
            "printable ASCII",
        ),
        (
            "/api/v1/orders",
            "not JSON",
            Some("k1"),
            Body::Raw("application/json", "{lines:"),
            400,
            "not valid JSON",
        ),
        (
            "/api/v1/orders",
            "not JSON at all",
            Some("k1"),
            Body::Raw("text/plain", "hello"),
            415,
            "application/json",
        ),
        (
            "/api/v1/orders",
            "too big",
            Some("k1"),
            Body::Big,
            413,
            "larger than",
        ),
        (
            "/api/v1/orders",
            "no lines",
            Some("k2"),
            Body::Json(r#"{}"#),
            422,
            "is required",
        ),
        (
            "/api/v1/orders",
            "empty lines",
            Some("k3"),
            Body::Json(r#"{"lines":[]}"#),
            422,
            "at least one line",
        ),
        (
            "/api/v1/orders",
            "zero",
            Some("k4"),
            Body::Json(r#"{"lines":[{"sku":"GOOD-1","quantity":0}]}"#),
            422,
            "at least 1",
        ),
        (
            "/api/v1/orders",
            "negative",
            Some("k5"),
            Body::Json(r#"{"lines":[{"sku":"GOOD-1","quantity":-2}]}"#),
            422,
            "at least 1",
        ),
        (
            "/api/v1/orders",
            "fraction",
            Some("k6"),
            Body::Json(r#"{"lines":[{"sku":"GOOD-1","quantity":1.5}]}"#),
            422,
            "whole number",
        ),
        (
            "/api/v1/orders",
            "string quantity",
            Some("k7"),
            Body::Json(r#"{"lines":[{"sku":"GOOD-1","quantity":"1"}]}"#),
            422,
            "whole number",
        ),
        (
            "/api/v1/orders",
            "above the cap",
            Some("k8"),
            Body::Json(r#"{"lines":[{"sku":"GOOD-1","quantity":11}]}"#),
            422,
            "at most 10",
        ),
        (
            "/api/v1/orders",
            "unknown SKU",
            Some("k9"),
            Body::Json(r#"{"lines":[{"sku":"NOPE-1","quantity":1}]}"#),
            422,
            "NOPE-1",
        ),
        (
            "/api/v1/orders",
            "malformed SKU",
            Some("k10"),
            Body::Json(r#"{"lines":[{"sku":"no pe","quantity":1}]}"#),
            422,
            "not a valid SKU",
        ),
        (
            "/api/v1/orders",
            "bad email",
            Some("k11"),
            Body::Json(r#"{"lines":[{"sku":"GOOD-1","quantity":1}],"email":"nobody"}"#),
            422,
            "email",
        ),
        // Pages
        (
            "/checkout",
            "form without key",
            None,
            Body::Form(vec![
                ("lines", "GOOD-1~1"),
                ("name", "A"),
                ("email", "a@b.co"),
            ]),
            400,
            "form could not be read",
        ),
        (
            "/checkout",
            "damaged key",
            None,
            Body::Form(vec![
                ("key", ""),
                ("lines", "GOOD-1~1"),
                ("name", "A"),
                ("email", "a@b.co"),
            ]),
            400,
            "damaged",
        ),
        (
            "/checkout",
            "no products",
            None,
            Body::Form(vec![
                ("key", "p1"),
                ("lines", ""),
                ("name", "A"),
                ("email", "a@b.co"),
            ]),
            422,
            "no products",
        ),
        (
            "/checkout",
            "above the cap",
            None,
            Body::Form(vec![
                ("key", "p2"),
                ("lines", "GOOD-1~11"),
                ("name", "A"),
                ("email", "a@b.co"),
            ]),
            422,
            "at most 10",
        ),
        (
            "/checkout",
            "unknown SKU",
            None,
            Body::Form(vec![
                ("key", "p3"),
                ("lines", "NOPE-1~1"),
                ("name", "A"),
                ("email", "a@b.co"),
            ]),
            422,
            "NOPE-1",
        ),
        (
            "/checkout",
            "no name",
            None,
            Body::Form(vec![
                ("key", "p4"),
                ("lines", "GOOD-1~1"),
                ("name", " "),
                ("email", "a@b.co"),
            ]),
            422,
            "your name",
        ),
        (
            "/checkout",
            "bad email",
            None,
            Body::Form(vec![
                ("key", "p5"),
                ("lines", "GOOD-1~1"),
                ("name", "A"),
                ("email", "a@"),
            ]),
            422,
            "email address",
        ),
        (
            "/cart/add",
            "zero",
            None,
            Body::Form(vec![("sku", "GOOD-1"), ("quantity", "0")]),
            422,
            "at least 1",
        ),
        (
            "/cart/add",
            "words",
            None,
            Body::Form(vec![("sku", "GOOD-1"), ("quantity", "lots")]),
            422,
            "whole number",
        ),
        (
            "/cart/add",
            "above the cap",
            None,
            Body::Form(vec![("sku", "GOOD-1"), ("quantity", "99")]),
            422,
            "at most 10",
        ),
        (
            "/cart/add",
            "unknown SKU",
            None,
            Body::Form(vec![("sku", "NOPE-1"), ("quantity", "1")]),
            404,
            "NOPE-1",
        ),
        (
            "/cart/update",
            "malformed SKU",
            None,
            Body::Form(vec![("sku", "x y"), ("quantity", "1")]),
            422,
            "not a valid SKU",
        ),
    ];
    for (path, name, key, body, status, words) in cases {
        let mut req = app.client.post(app.url(path));
        if let Some(key) = key {
            req = req.header(
                "Idempotency-Key",
                reqwest::header::HeaderValue::from_bytes(key.as_bytes()).unwrap(),
            );
        }
        req = match body {
            Body::Json(json) => req.header("content-type", "application/json").body(json),
            Body::Raw(ct, text) => req.header("content-type", ct).body(text),
            Body::Form(pairs) => req
                .header("content-type", "application/x-www-form-urlencoded")
                .body(form(&pairs)),
            Body::Big => req
                .header("content-type", "application/json")
                .body(format!(r#"{{"lines":[],"pad":"{}"}}"#, "x".repeat(100_000))),
        };
        let res = req.send().await.unwrap();
        assert_eq!(res.status().as_u16(), status, "{path} {name}");
        let text = res.text().await.unwrap();
        assert!(text.contains(words), "{path} {name}: {text}");
        assert_eq!(
            snapshot(&app).await,
            before,
            "{path} {name} changed something"
        );
    }
    for path in [
        "/api/v1/orders/not-a-uuid",
        "/api/v1/orders/6f1c0d9e-0000-4000-8000-000000000000",
        "/orders/nope",
        "/api/v1/products/NOPE-1",
    ] {
        assert_eq!(app.get(path).await.status().as_u16(), 404, "{path}");
    }
}

/// Adds to the cart through the page form.
async fn add_to_cart(app: &TestApp, sku: &str, quantity: &str) -> reqwest::Response {
    app.client
        .post(app.url("/cart/add"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("sku", sku), ("quantity", quantity)]))
        .send()
        .await
        .unwrap()
}

/// The hidden fields of the checkout form.
fn hidden(html: &str, name: &str) -> String {
    let marker = format!(r#"name="{name}" value=""#);
    let start = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {html}"))
        + marker.len();
    html[start..start + html[start..].find('"').unwrap()].to_string()
}

#[tokio::test]
async fn a_checkout_form_submitted_twice_at_once_makes_one_order_and_both_see_it() {
    let app = spawn_app().await;
    app.seed_demo().await;
    assert_eq!(
        add_to_cart(&app, "MG-STONE-350", "2")
            .await
            .status()
            .as_u16(),
        303
    );
    assert_eq!(
        add_to_cart(&app, "CF-BEANS-ETH", "1")
            .await
            .status()
            .as_u16(),
        303
    );
    let (status, cart) = app.get_text("/cart").await;
    assert_eq!(status, 200);
    assert!(
        cart.contains("Stoneware Mug") && cart.contains("$72.50"),
        "{cart}"
    );

    let (_, checkout) = app.get_text("/checkout").await;
    let body = form(&[
        ("key", &hidden(&checkout, "key")),
        ("lines", &hidden(&checkout, "lines").replace("&#124;", "|")),
        ("name", "Ada"),
        ("email", "ada@example.com"),
    ]);
    let submit = || {
        app.client
            .post(app.url("/checkout"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.clone())
            .send()
    };
    let answers = join_all((0..5).map(|_| submit())).await;
    let locations: Vec<String> = answers
        .iter()
        .map(|r| {
            assert_eq!(r.as_ref().unwrap().status().as_u16(), 303);
            r.as_ref().unwrap().headers()["location"]
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(
        locations.iter().all(|l| *l == locations[0]),
        "{locations:?}"
    );
    assert_eq!(app.count("select count(*) from orders").await, 1);

    // A refresh of the POST later, too.
    let again = submit().await.unwrap();
    assert_eq!(again.headers()["location"].to_str().unwrap(), locations[0]);
    assert_eq!(app.count("select count(*) from orders").await, 1);

    let (status, page) = app.get_text(&locations[0]).await;
    assert_eq!(status, 200);
    assert!(page.contains("Thank you, Ada!"), "{page}");
    assert!(page.contains("$72.50"));
    assert_eq!(app.stock("MG-STONE-350").await.0, 78);
    app.assert_invariants().await;
}

#[tokio::test]
async fn checkout_tells_the_shopper_what_is_left_when_stock_runs_out() {
    let app = spawn_app().await;
    app.add_product("LAST-1", "Last one", 5_000, 2).await;
    add_to_cart(&app, "LAST-1", "2").await;
    let (_, checkout) = app.get_text("/checkout").await;
    // Someone else buys one meanwhile.
    assert_eq!(
        app.post_order("other", &[("LAST-1", 1)])
            .await
            .status()
            .as_u16(),
        201
    );

    let res = app
        .client
        .post(app.url("/checkout"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[
            ("key", &hidden(&checkout, "key")),
            ("lines", "LAST-1~2"),
            ("name", "Bo"),
            ("email", "bo@example.com"),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 409);
    let html = res.text().await.unwrap();
    assert!(html.contains("only 1 left"), "{html}");
    assert!(html.contains("Adjust your cart"));
    assert_eq!(app.count("select count(*) from orders").await, 1);

    let (_, cart) = app.get_text("/cart").await;
    assert!(
        cart.contains("Only 1 left"),
        "the cart shows what is left: {cart}"
    );
}
