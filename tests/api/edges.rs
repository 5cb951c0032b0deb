//! The edges an outside audit found: forwarding headers believed from anyone, cookies on
//! shared-cacheable answers, ambiguous JSON, Rust's debug text in messages, one rule for
//! bodies and query strings, one number grammar, HEAD, the upload limit, revoking nobody.

use stockade::config::Settings;

use crate::helpers::*;

const SKU: &str = "EDGE-1";

async fn app_with_product() -> TestApp {
    let app = spawn_app().await;
    app.add_product(SKU, "Edge", 1_000, 100).await;
    app
}

/// The `detail` of a problem+json answer.
async fn detail(res: reqwest::Response) -> String {
    let body: serde_json::Value = res.json().await.unwrap();
    body["detail"].as_str().unwrap_or_default().to_string()
}

/// POSTs `body` as JSON text (reqwest's `.json` could not repeat a member).
async fn post_raw(app: &TestApp, path: &str, body: &str) -> reqwest::Response {
    app.client
        .post(app.url(path))
        .header("Content-Type", "application/json")
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// The `Set-Cookie` headers of `res`.
fn cookies(res: &reqwest::Response) -> Vec<String> {
    res.headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_clients_own_x_forwarded_proto_does_not_make_its_cookies_secure() {
    let app = spawn_app().await;
    let res = client()
        .get(app.url("/"))
        .header("X-Forwarded-Proto", "https")
        .send()
        .await
        .unwrap();
    let csrf = cookies(&res).into_iter().find(|c| c.starts_with("csrf="));
    let csrf = csrf.expect("the page sets the CSRF cookie");
    assert!(
        !csrf.to_ascii_lowercase().contains("secure"),
        "an untrusted peer's X-Forwarded-Proto made the cookie Secure: {csrf}"
    );

    // From a trusted proxy the header is believed, as it must be behind TLS termination.
    let proxied = spawn_app_with(Settings {
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..test_settings().await
    })
    .await;
    let res = client()
        .get(proxied.url("/"))
        .header("X-Forwarded-Proto", "https")
        .send()
        .await
        .unwrap();
    let csrf = cookies(&res).into_iter().find(|c| c.starts_with("csrf="));
    assert!(csrf.unwrap().to_ascii_lowercase().contains("secure"));
}

#[tokio::test]
async fn an_origin_vouched_for_only_by_the_clients_own_forwarded_host_is_refused() {
    let app = app_with_product().await;
    let res = client()
        .post(app.url("/api/v1/orders"))
        .header("Idempotency-Key", "evil-1")
        .header("Origin", "https://evil.example")
        .header("X-Forwarded-Host", "evil.example")
        .header("X-Forwarded-Proto", "https")
        .json(&serde_json::json!({"lines": [{"sku": SKU, "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 403);
    assert_eq!(app.count("select count(*) from orders").await, 0);

    // A trusted proxy's word for the host the browser asked for is taken.
    let proxied = spawn_app_with(Settings {
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..test_settings().await
    })
    .await;
    proxied.add_product(SKU, "Edge", 1_000, 100).await;
    let res = client()
        .post(proxied.url("/api/v1/orders"))
        .header("Idempotency-Key", "proxied-1")
        .header("Origin", "https://shop.example")
        .header("X-Forwarded-Host", "shop.example")
        .header("X-Forwarded-Proto", "https")
        .json(&serde_json::json!({"lines": [{"sku": SKU, "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
}

#[tokio::test]
async fn answers_shared_caches_may_keep_set_no_cookie() {
    let app = spawn_app().await;
    app.seed_demo().await;
    for path in ["/static/style.css", "/products/NB-DOT-A5/image"] {
        // A new browser each time: it has no CSRF cookie yet, so a page would set one.
        let res = client().get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status().as_u16(), 200, "{path}");
        assert!(
            res.headers()["cache-control"]
                .to_str()
                .unwrap()
                .contains("public"),
            "{path}"
        );
        assert_eq!(cookies(&res), Vec::<String>::new(), "{path} set a cookie");
    }
    let page = client().get(app.url("/")).send().await.unwrap();
    assert!(cookies(&page).iter().any(|c| c.starts_with("csrf=")));
}

#[tokio::test]
async fn a_static_file_that_is_not_there_is_404_in_words() {
    let app = spawn_app().await;
    for path in [
        "/static/nope.css",
        "/static/style.css.bak",
        "/static/%2e%2e%2fCargo.toml",
    ] {
        let res = client().get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status().as_u16(), 404, "{path}");
        let body = res.text().await.unwrap();
        assert!(body.contains("No such file."), "{path}: {body}");
    }
}

#[tokio::test]
async fn a_body_naming_a_member_twice_is_refused_and_changes_nothing() {
    let app = app_with_product().await;
    let twice = format!(
        r#"{{"lines":[{{"sku":"NOPE!","quantity":0}}],"lines":[{{"sku":"{SKU}","quantity":1}}]}}"#
    );
    for path in ["/api/v1/orders", "/api/v1/holds"] {
        let res = post_raw(&app, path, &twice).await;
        assert_eq!(res.status().as_u16(), 400, "{path}");
        let detail = detail(res).await;
        assert!(
            detail.starts_with("The body names \"lines\" twice"),
            "{path}: {detail}"
        );
    }
    // Deeper down too.
    let deep = format!(r#"{{"lines":[{{"sku":"{SKU}","quantity":1,"quantity":2}}]}}"#);
    let res = post_raw(&app, "/api/v1/orders", &deep).await;
    assert_eq!(res.status().as_u16(), 400);
    assert!(detail(res).await.contains("\"quantity\" twice"));
    assert_eq!(app.count("select count(*) from orders").await, 0);
    assert_eq!(app.count("select count(*) from holds").await, 0);

    // The confirmation's optional body.
    let hold = post_lines(&app.client, &app.url("/api/v1/holds"), "h1", &[(SKU, 1)]).await;
    assert_eq!(hold.status().as_u16(), 201);
    let hold: serde_json::Value = hold.json().await.unwrap();
    let confirm = format!("/api/v1/holds/{}/confirm", hold["id"].as_str().unwrap());
    let res = post_raw(&app, &confirm, r#"{"email":"a@b.co","email":"c@d.co"}"#).await;
    assert_eq!(res.status().as_u16(), 400);
    assert!(detail(res).await.contains("\"email\" twice"));
    assert_eq!(app.count("select count(*) from orders").await, 0);

    // The admin API's bodies.
    let csrf = app.login_admin().await;
    let admin_post = |path: &'static str, body: &'static str| {
        app.client
            .post(app.url(path))
            .header("Content-Type", "application/json")
            .header("X-CSRF-Token", csrf.clone())
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .body(body)
            .send()
    };
    let res = admin_post(
        "/api/v1/admin/stock/EDGE-1/restock",
        r#"{"units":1,"reason":"count","units":9000}"#,
    )
    .await
    .unwrap();
    assert_eq!(res.status().as_u16(), 400);
    assert!(detail(res).await.contains("\"units\" twice"));
    assert_eq!(app.stock(SKU).await.0, 100, "nothing restocked");
    let res = admin_post(
        "/api/v1/admin/webhooks",
        r#"{"url":"https://a.example/","url":"https://b.example/","event_types":["order.placed"]}"#,
    )
    .await
    .unwrap();
    assert_eq!(res.status().as_u16(), 400);
    assert_eq!(app.count("select count(*) from webhook_endpoints").await, 0);
}

#[tokio::test]
async fn messages_quote_what_was_asked_for_without_rust_debug_text() {
    let app = spawn_app().await;
    let res = app.get("/api/v1/products/xx%20yy").await;
    assert_eq!(res.status().as_u16(), 404);
    assert_eq!(detail(res).await, r#"No product with SKU "xx yy"."#);

    let (status, page) = app.get_text("/products/xx%20yy").await;
    assert_eq!(status, 404);
    assert!(
        page.contains("No product with SKU &#34;xx yy&#34;."),
        "{page}"
    );

    let id = uuid::Uuid::new_v4();
    for path in [
        format!("/api/v1/orders/{id}"),
        format!("/api/v1/holds/{id}"),
    ] {
        let res = app.get(&path).await;
        assert_eq!(res.status().as_u16(), 404, "{path}");
        let detail = detail(res).await;
        assert!(
            !detail.contains("Path(") && !detail.contains(&id.to_string()),
            "{path}: {detail}"
        );
    }
}

#[tokio::test]
async fn a_confirmation_body_that_is_not_json_is_415_and_confirms_nothing() {
    let app = app_with_product().await;
    let hold = post_lines(&app.client, &app.url("/api/v1/holds"), "h1", &[(SKU, 1)]).await;
    let hold: serde_json::Value = hold.json().await.unwrap();
    let confirm = app.url(&format!(
        "/api/v1/holds/{}/confirm",
        hold["id"].as_str().unwrap()
    ));
    let res = app
        .client
        .post(&confirm)
        .header("Content-Type", "text/plain")
        .body(r#"{"email":"a@b.co"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 415);
    assert!(detail(res).await.contains("application/json"));
    assert_eq!(app.count("select count(*) from orders").await, 0);
    // An empty body needs no type: the body is optional.
    let res = app.client.post(&confirm).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 201);
}

#[tokio::test]
async fn a_missing_field_is_422_and_malformed_json_400_in_the_admin_api() {
    let app = app_with_product().await;
    let csrf = app.login_admin().await;
    let restock = |body: &'static str| admin_restock(&app, &csrf, body);
    let res = restock(r#"{"units": 5}"#).await.unwrap();
    assert_eq!(res.status().as_u16(), 422);
    assert_eq!(
        detail(res).await,
        "The body does not fit this request: missing field \"reason\"."
    );
    let res = restock(r#"{"units": "5", "reason": "count"}"#)
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 422);
    let res = restock(r#"{"units": 5, "reason": "#).await.unwrap();
    assert_eq!(res.status().as_u16(), 400);
    assert!(detail(res).await.starts_with("The body is not valid JSON"));
    assert_eq!(app.stock(SKU).await.0, 100, "nothing restocked");
}

#[tokio::test]
async fn a_repeated_query_parameter_is_answered_in_a_sentence() {
    let app = spawn_app().await;
    let res = app.get("/api/v1/products?q=a&q=b").await;
    assert_eq!(res.status().as_u16(), 400);
    assert_eq!(
        detail(res).await,
        "The search may be given once (q appears twice in the address)."
    );
    let (status, page) = app.get_text("/?page=1&page=2").await;
    assert_eq!(status, 400);
    assert!(page.contains("The page may be given once"), "{page}");
    assert!(!page.contains("deserialize"), "{page}");
}

#[tokio::test]
async fn the_cart_and_the_catalogue_take_numbers_in_digits_only() {
    let app = app_with_product().await;
    let csrf = app.csrf().await;
    for quantity in ["+1", "1.0", "1e0"] {
        let res = app
            .client
            .post(app.url("/cart/add"))
            .form(&[
                ("csrf", csrf.as_str()),
                ("sku", SKU),
                ("quantity", quantity),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 422, "{quantity}");
        assert!(
            !cookies(&res).iter().any(|c| c.starts_with("cart=")),
            "{quantity} wrote the cart"
        );
        let page = res.text().await.unwrap();
        assert!(page.contains("whole number written in digits"), "{page}");
    }
    let res = app.get("/api/v1/products?page=%2B1").await;
    assert_eq!(res.status().as_u16(), 422);
    assert!(detail(res).await.contains("is not a page"));
    let (status, _) = app.get_text("/?page=+2").await;
    // `+` in a query is a space: " 2" is page 2.
    assert_eq!(status, 200);
}

#[tokio::test]
async fn every_admin_address_that_answers_get_answers_head() {
    let app = spawn_app().await;
    app.login_admin().await;
    let gets = stockade::http::admin::inventory()
        .into_iter()
        .filter(|(m, p)| *m == actix_web::http::Method::GET && !p.contains('{'));
    for (_, path) in gets {
        let get = app.get(path).await.status().as_u16();
        let head = app
            .client
            .head(app.url(path))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        assert_eq!((path, head), (path, get), "HEAD differs from GET");
    }
}

#[tokio::test]
async fn a_picture_one_byte_over_the_limit_is_413() {
    let app = app_with_product().await;
    let csrf = app.login_admin().await;
    const BOUNDARY: &str = "----edge-boundary";
    let mut body = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\n{csrf}\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"p.png\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend(std::iter::repeat_n(
        0u8,
        stockade::catalog::images::MAX_UPLOAD_BYTES + 1,
    ));
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    let res = app
        .client
        .post(app.url(&format!("/admin/products/{SKU}/image")))
        .header(
            "Content-Type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 413);
    assert!(res.text().await.unwrap().contains("larger than 5 MB"));
    assert_eq!(app.count("select count(*) from product_images").await, 0);
}

#[tokio::test]
async fn revoking_a_client_that_does_not_exist_is_404_and_changes_nothing() {
    let app = spawn_app().await;
    let csrf = app.login_admin().await;
    let (live, _) = stockade::clients::create(&app.db, "live", stockade::clients::Limit::Default)
        .await
        .unwrap();
    let missing = live.id + 1000;
    let res = app
        .admin_post(
            &format!("/admin/api-clients/{missing}/revoke"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(res.status().as_u16(), 404);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("no API client with this id")
    );
    assert_eq!(
        app.count("select count(*) from api_clients where revoked_at is not null")
            .await,
        0
    );
    // Revoking a real one twice still answers as before.
    for _ in 0..2 {
        let res = app
            .admin_post(
                &format!("/admin/api-clients/{}/revoke", live.id),
                &[("csrf", &csrf)],
            )
            .await;
        assert_eq!(res.status().as_u16(), 303);
    }
}

#[tokio::test]
async fn wrong_api_keys_from_one_address_are_throttled_before_any_lookup() {
    let app = spawn_app_with(Settings {
        api_anonymous_orders: false,
        api_key_max_failures: 3,
        api_key_failure_window: std::time::Duration::from_secs(60),
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..test_settings().await
    })
    .await;
    app.add_product(SKU, "Edge", 1_000, 100).await;
    let (_, good) = stockade::clients::create(&app.db, "good", stockade::clients::Limit::Default)
        .await
        .unwrap();
    let client = client();
    let get = |key: String, from: &'static str| {
        client
            .get(app.url("/api/v1/orders/00000000-0000-0000-0000-000000000000"))
            .bearer_auth(key)
            .header("X-Forwarded-For", from)
            .send()
    };
    let guesser = "198.51.100.7";
    // The good key, used from the guesser's address between its wrong guesses, is known to
    // this process (for the key cache's two seconds: the checks on it follow closely).
    for i in 0..3 {
        if i == 2 {
            assert_eq!(get(good.clone(), guesser).await.unwrap().status(), 404);
        }
        let res = get(format!("sk_wrong{i}"), guesser).await.unwrap();
        assert_eq!(res.status().as_u16(), 401, "guess {i}");
    }
    // The known good key is not held up.
    assert_eq!(get(good, guesser).await.unwrap().status(), 404);
    // A key never seen would need a lookup to be called wrong: it is refused first.
    let res = get("sk_never_seen".into(), guesser).await.unwrap();
    assert_eq!(res.status().as_u16(), 429);
    let wait: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=20).contains(&wait), "Retry-After: {wait}");
    assert!(detail(res).await.contains("Too many wrong API keys"));
    // Another address is not held up.
    let res = get("sk_other".into(), "203.0.113.9").await.unwrap();
    assert_eq!(res.status().as_u16(), 401);
}

/// A whole number is written as one: `2.0` and `1e0` are refused where a quantity or a
/// count goes, as a fraction is, in a sentence, and nothing is taken. (JSON Schema's
/// `integer` would take them; the document says in words that the API does not.)
#[tokio::test]
async fn a_whole_number_written_with_a_decimal_point_or_a_fraction_is_refused() {
    let app = app_with_product().await;
    for (path, body, said) in [
        (
            "/api/v1/orders",
            r#"{"lines": [{"sku": "EDGE-1", "quantity": 2.0}]}"#,
            "without a decimal point or exponent (got 2.0)",
        ),
        (
            "/api/v1/holds",
            r#"{"lines": [{"sku": "EDGE-1", "quantity": 1e0}]}"#,
            "without a decimal point or exponent (got 1.0)",
        ),
        (
            "/api/v1/orders",
            r#"{"lines": [{"sku": "EDGE-1", "quantity": 1.5}]}"#,
            "quantity must be a whole number (got 1.5)",
        ),
    ] {
        let res = post_raw(&app, path, body).await;
        assert_eq!(res.status().as_u16(), 422, "{body}");
        let detail = detail(res).await;
        assert!(detail.contains(said), "{body}: {detail}");
    }
    assert_eq!(app.stock(SKU).await, (100, 0));
    let doc: serde_json::Value = app.get("/api/v1/openapi.json").await.json().await.unwrap();
    let told = doc["info"]["description"].as_str().unwrap();
    assert!(told.contains("`1.0` and `1e0` are refused"), "{told}");

    // The admin's numbers read the same way.
    let csrf = app.login_admin().await;
    let restock = |body: &'static str| admin_restock(&app, &csrf, body);
    for body in [
        r#"{"units": 5.0, "reason": "count"}"#,
        r#"{"units": 5.5, "reason": "count"}"#,
    ] {
        let res = restock(body).await.unwrap();
        assert_eq!(res.status().as_u16(), 422, "{body}");
        let said = detail(res).await;
        assert!(said.contains("expected a whole number"), "{said}");
        assert!(!said.contains("f64") && !said.contains("i32"), "{said}");
    }
    let res = restock(r#"{"units": 5, "reason": "count"}"#).await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(app.stock(SKU).await, (105, 0));
}

/// POSTs `body` as a JSON restock of EDGE-1 through the admin API, with a fresh key.
fn admin_restock(
    app: &TestApp,
    csrf: &str,
    body: &'static str,
) -> impl Future<Output = reqwest::Result<reqwest::Response>> {
    app.client
        .post(app.url("/api/v1/admin/stock/EDGE-1/restock"))
        .header("Content-Type", "application/json")
        .header("X-CSRF-Token", csrf)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .body(body)
        .send()
}
