//! The shopping flow in pages, and bad input over pages and API.

use futures_util::future::join_all;

use crate::helpers::{TestApp, hidden, spawn_app};

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
        stock: sqlx::query!("select sku, on_hand, reserved from stock order by sku")
            .fetch_all(&app.db)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.sku, r.on_hand, r.reserved))
            .collect(),
        orders: app.count("select count(*) from orders").await,
        lines: app.count("select count(*) from order_lines").await,
        movements: app.count("select count(*) from stock_movements").await,
        keys: app.count("select count(*) from idempotency_keys").await,
    }
}

/// Where the checkout tests ship to, as the checkout form's fields.
pub(crate) const ADDRESS: [(&str, &str); 4] = [
    ("line1", "12 St James's Square"),
    ("city", "London"),
    ("postal_code", "SW1Y 4JH"),
    ("country", "GB"),
];

/// The checkout form of Ada, at [`ADDRESS`].
pub(crate) fn ada_details() -> String {
    let mut pairs = vec![("name", "Ada"), ("email", "ada@example.com")];
    pairs.extend(ADDRESS);
    form(&pairs)
}

pub(crate) fn form(pairs: &[(&str, &str)]) -> String {
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
    // A hold to confirm with bad details.
    let res = app
        .client
        .post(app.url("/api/v1/holds"))
        .header("Idempotency-Key", "setup")
        .json(&serde_json::json!({"lines": [{"sku": "GOOD-1", "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let hold: serde_json::Value = res.json().await.unwrap();
    let hold_id = hold["id"].as_str().unwrap().to_string();
    let confirm = format!("/checkout/{hold_id}/confirm");
    let api_confirm = format!("/api/v1/holds/{hold_id}/confirm");
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
            Body::Form(vec![("lines", "GOOD-1~1")]),
            400,
            "form could not be read",
        ),
        (
            "/checkout",
            "damaged key",
            None,
            Body::Form(vec![("key", ""), ("lines", "GOOD-1~1")]),
            400,
            "damaged",
        ),
        (
            "/checkout",
            "no products",
            None,
            Body::Form(vec![("key", "p1"), ("lines", "")]),
            422,
            "no products",
        ),
        (
            "/checkout",
            "above the order cap",
            None,
            Body::Form(vec![("key", "p2"), ("lines", "GOOD-1~11")]),
            422,
            "at most 10",
        ),
        (
            "/checkout",
            "above the hold cap",
            None,
            Body::Form(vec![("key", "p3"), ("lines", "GOOD-1~6")]),
            422,
            "at most 5 of GOOD-1",
        ),
        (
            "/checkout",
            "unknown SKU",
            None,
            Body::Form(vec![("key", "p4"), ("lines", "NOPE-1~1")]),
            422,
            "NOPE-1",
        ),
        (
            &confirm,
            "no name",
            None,
            Body::Form(vec![("name", " "), ("email", "a@b.co")]),
            422,
            "your name",
        ),
        (
            &confirm,
            "no email",
            None,
            Body::Form(vec![("name", "A")]),
            422,
            "email address",
        ),
        (
            &confirm,
            "bad email",
            None,
            Body::Form(vec![("name", "A"), ("email", "a@")]),
            422,
            "email address",
        ),
        (
            &confirm,
            "no street",
            None,
            Body::Form(vec![
                ("name", "A"),
                ("email", "a@b.co"),
                ("city", "X"),
                ("country", "GB"),
            ]),
            422,
            "street and number",
        ),
        (
            &confirm,
            "no country",
            None,
            Body::Form(vec![
                ("name", "A"),
                ("email", "a@b.co"),
                ("line1", "1 Road"),
                ("city", "X"),
            ]),
            422,
            "choose the country",
        ),
        (
            &confirm,
            "unknown country",
            None,
            Body::Form(vec![
                ("name", "A"),
                ("email", "a@b.co"),
                ("line1", "1 Road"),
                ("city", "X"),
                ("country", "XX"),
            ]),
            422,
            "must be a country code",
        ),
        (
            "/checkout/not-a-hold/confirm",
            "malformed hold",
            None,
            Body::Form(vec![("name", "A"), ("email", "a@b.co")]),
            404,
            "no checkout",
        ),
        (
            "/checkout/6f1c0d9e-0000-4000-8000-000000000000/confirm",
            "unknown hold",
            None,
            Body::Form(vec![("name", "A"), ("email", "a@b.co")]),
            404,
            "no checkout",
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
        // Holds API
        (
            "/api/v1/holds",
            "no key",
            None,
            Body::Json(ok_lines),
            400,
            "Idempotency-Key header is required",
        ),
        (
            "/api/v1/holds",
            "above the hold cap",
            Some("h1"),
            Body::Json(r#"{"lines":[{"sku":"GOOD-1","quantity":6}]}"#),
            422,
            "at most 5 of GOOD-1",
        ),
        (
            &api_confirm,
            "confirm with a broken body",
            None,
            Body::Raw("application/json", "{oops"),
            400,
            "not valid JSON",
        ),
        (
            &api_confirm,
            "confirm with a bad email",
            None,
            Body::Json(r#"{"email":"x"}"#),
            422,
            "email",
        ),
        (
            "/api/v1/holds/6f1c0d9e-0000-4000-8000-000000000000/confirm",
            "confirm an unknown hold",
            None,
            Body::Json("{}"),
            404,
            "No such reservation",
        ),
    ];
    let csrf = app.csrf().await;
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
            Body::Form(mut pairs) => {
                pairs.push(("csrf", csrf.as_str()));
                req.header("content-type", "application/x-www-form-urlencoded")
                    .body(form(&pairs))
            }
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
pub(crate) async fn add_to_cart(app: &TestApp, sku: &str, quantity: &str) -> reqwest::Response {
    let csrf = app.csrf().await;
    app.client
        .post(app.url("/cart/add"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[
            ("sku", sku),
            ("quantity", quantity),
            ("csrf", &csrf),
        ]))
        .send()
        .await
        .unwrap()
}

/// POSTs a form (with this client's CSRF token); returns status and `Location`.
pub(crate) async fn post_form(app: &TestApp, path: &str, body: &str) -> (u16, String) {
    let csrf = app.csrf().await;
    let body = match body {
        "" => form(&[("csrf", &csrf)]),
        _ => format!("{body}&{}", form(&[("csrf", &csrf)])),
    };
    let res = app
        .client
        .post(app.url(path))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap();
    let location = res
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_string())
        .unwrap_or_default();
    (res.status().as_u16(), location)
}

#[tokio::test]
async fn checkout_pressed_twice_holds_once_and_placing_the_order_twice_orders_once() {
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

    // "Checkout", pressed five times at once: one hold.
    let start = form(&[
        ("key", &hidden(&cart, "key")),
        ("lines", &hidden(&cart, "lines")),
    ]);
    let answers = join_all((0..5).map(|_| post_form(&app, "/checkout", &start))).await;
    let hold_page = &answers[0].1;
    assert!(hold_page.starts_with("/checkout/"), "{answers:?}");
    assert!(
        answers.iter().all(|a| a == &(303, hold_page.clone())),
        "{answers:?}"
    );
    assert_eq!(app.count("select count(*) from holds").await, 1);
    assert_eq!(app.stock("MG-STONE-350").await, (80, 2), "two mugs held");

    let (status, page) = app.get_text(hold_page).await;
    assert_eq!(status, 200);
    assert!(page.contains("Held for you for"), "{page}");

    // "Place order", sent five times at once, and once more later (a refreshed POST).
    let details = ada_details();
    let confirm = format!("{hold_page}/confirm");
    let answers = join_all((0..5).map(|_| post_form(&app, &confirm, &details))).await;
    let order_page = &answers[0].1;
    assert!(order_page.starts_with("/orders/"), "{answers:?}");
    assert!(
        answers.iter().all(|a| a == &(303, order_page.clone())),
        "{answers:?}"
    );
    assert_eq!(
        post_form(&app, &confirm, &details).await,
        (303, order_page.clone())
    );
    assert_eq!(app.count("select count(*) from orders").await, 1);

    let (status, page) = app.get_text(order_page).await;
    assert_eq!(status, 200);
    assert!(page.contains("Thank you, Ada!"), "{page}");
    assert!(page.contains("$72.50"));
    // Shipped where the form said, and stored on the order.
    assert!(
        page.contains("Ada<br>12 St James&#39;s Square<br>SW1Y 4JH London<br>United Kingdom")
            || page
                .contains("Ada<br>12 St James&#x27;s Square<br>SW1Y 4JH London<br>United Kingdom"),
        "{page}"
    );
    let country: String = sqlx::query_scalar("select shipping_address->>'country' from orders")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(country, "GB");
    assert_eq!(app.stock("MG-STONE-350").await, (78, 0));
    // The hold page now leads to the order.
    assert_eq!(
        app.get(hold_page).await.headers()["location"],
        order_page.as_str()
    );
    app.assert_invariants().await;
}

#[tokio::test]
async fn checkout_tells_the_shopper_what_is_left_before_they_type_anything() {
    let app = spawn_app().await;
    app.add_product("LAST-1", "Last one", 5_000, 2).await;
    add_to_cart(&app, "LAST-1", "2").await;
    let (_, cart) = app.get_text("/cart").await;
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
            ("key", &hidden(&cart, "key")),
            ("lines", &hidden(&cart, "lines")),
            ("csrf", &hidden(&cart, "csrf")),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 409);
    let html = res.text().await.unwrap();
    assert!(html.contains("only 1 left"), "{html}");
    assert!(
        html.contains("Only 1 left — please lower the quantity"),
        "{html}"
    );
    assert_eq!(app.count("select count(*) from holds").await, 0);
    assert_eq!(app.stock("LAST-1").await, (1, 0));
}

#[tokio::test]
async fn cancelling_checkout_puts_the_items_back_on_sale() {
    let app = spawn_app().await;
    app.add_product("CXL-1", "Cancellable", 5_000, 1).await;
    add_to_cart(&app, "CXL-1", "1").await;
    let (_, cart) = app.get_text("/cart").await;
    let start = form(&[
        ("key", &hidden(&cart, "key")),
        ("lines", &hidden(&cart, "lines")),
    ]);
    let (_, hold_page) = post_form(&app, "/checkout", &start).await;
    let (_, product) = app.get_text("/products/CXL-1").await;
    assert!(product.contains("Sold out"), "held by this shopper");

    assert_eq!(
        post_form(&app, &format!("{hold_page}/cancel"), "").await,
        (303, "/cart".into())
    );
    let (_, product) = app.get_text("/products/CXL-1").await;
    assert!(product.contains("Only 1 left"), "{product}");
    // Cancelling again is a no-op; placing the cancelled order is refused.
    assert_eq!(
        post_form(&app, &format!("{hold_page}/cancel"), "").await.0,
        303
    );
    let details = ada_details();
    assert_eq!(
        post_form(&app, &format!("{hold_page}/confirm"), &details)
            .await
            .0,
        409
    );
    assert_eq!(app.count("select count(*) from orders").await, 0);
    app.assert_invariants().await;
}

#[tokio::test]
async fn storefront_forms_refuse_a_missing_wrong_or_foreign_csrf_token() {
    let app = spawn_app().await;
    app.add_product("TOK-1", "Tokened", 1_000, 5).await;
    let mine = app.csrf().await;
    let theirs = {
        let other = crate::helpers::client();
        let html = other
            .get(app.url("/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let m = r#"<meta name="csrf-token" content=""#;
        html[html.find(m).unwrap() + m.len()..][..64].to_string()
    };
    assert_ne!(mine, theirs);
    let zeros = "0".repeat(64);
    for (name, token) in [
        ("no", None),
        ("a wrong", Some(zeros.as_str())),
        ("another browser's", Some(theirs.as_str())),
    ] {
        let mut pairs = vec![("sku", "TOK-1"), ("quantity", "1")];
        if let Some(token) = token {
            pairs.push(("csrf", token));
        }
        let res = app
            .client
            .post(app.url("/cart/add"))
            .form(&pairs)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 403, "{name} token");
        assert!(
            res.headers()
                .get("set-cookie")
                .is_none_or(|c| !c.to_str().unwrap().starts_with("cart="))
        );
        let mut pairs = vec![("key", "k-1"), ("lines", "TOK-1~1")];
        if let Some(token) = token {
            pairs.push(("csrf", token));
        }
        let res = app
            .client
            .post(app.url("/checkout"))
            .form(&pairs)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 403, "{name} token at checkout");
    }
    assert_eq!(app.count("select count(*) from holds").await, 0);
    assert_eq!(app.stock("TOK-1").await, (5, 0));
    // With this browser's own token it works.
    let res = app
        .client
        .post(app.url("/cart/add"))
        .form(&[("sku", "TOK-1"), ("quantity", "1"), ("csrf", mine.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 303);
}

#[tokio::test]
async fn an_expired_checkout_short_of_stock_says_so_once_and_offers_no_order_button() {
    let app = spawn_app().await;
    app.add_product("EXP-1", "Enamel mug 350 ml", 1_200, 2)
        .await;
    assert_eq!(add_to_cart(&app, "EXP-1", "2").await.status().as_u16(), 303);
    let (_, cart) = app.get_text("/cart").await;
    let start = form(&[
        ("key", &hidden(&cart, "key")),
        ("lines", &hidden(&cart, "lines")),
    ]);
    let (status, hold_page) = post_form(&app, "/checkout", &start).await;
    assert_eq!(status, 303, "{hold_page}");
    // The hold runs out, and one of its two units is sold to someone else meanwhile.
    sqlx::query("update holds set expires_at = now() - interval '1 second'")
        .execute(&app.db)
        .await
        .unwrap();
    app.sweep_holds().await;
    assert_eq!(
        app.post_order("other", &[("EXP-1", 1)])
            .await
            .status()
            .as_u16(),
        201
    );
    let (status, _) = post_form(&app, &format!("{hold_page}/confirm"), &ada_details()).await;
    assert_eq!(status, 409);
    let res = app
        .client
        .post(app.url(&format!("{hold_page}/confirm")))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "{}&{}",
            ada_details(),
            form(&[("csrf", &app.csrf().await)])
        ))
        .send()
        .await
        .unwrap();
    let page = res.text().await.unwrap();
    // One account of what happened, naming the product by its name, and no button to
    // place an order the stock cannot fill: the way on is the cart.
    assert!(page.contains("no longer enough stock"), "{page}");
    assert!(!page.contains("You can still place the order"), "{page}");
    assert!(!page.contains("sold out"), "{page}");
    assert!(page.contains("Enamel mug"), "{page}");
    assert!(page.contains("you asked for 2, only 1 left"), "{page}");
    assert!(!page.contains("<code>EXP-1</code>"), "{page}");
    assert!(!page.contains("id=\"place-order\""), "{page}");
    assert!(page.contains("href=\"/cart\""), "{page}");
    assert_eq!(app.count("select count(*) from orders").await, 1);
    app.assert_invariants().await;
}
