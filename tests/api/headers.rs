//! Headers every answer carries: `Cache-Control` on personal pages, cookies (none on the
//! API, the CSRF cookie on pages, `Secure` and `__Host-` when configured), and metrics off
//! the public port.

use crate::helpers::{ADMIN_PASSWORD, ADMIN_USER, spawn_app_with, test_settings};

#[tokio::test]
async fn admin_and_personal_pages_say_no_store() {
    let app = spawn_app_with(test_settings().await).await;
    app.add_product("GOOD-1", "Good", 1_000, 50).await;
    let res = app.post_order("o1", &[("GOOD-1", 1)]).await;
    assert_eq!(res.status().as_u16(), 201);
    assert_eq!(
        res.headers()["cache-control"],
        "no-store",
        "the order API answer"
    );
    let order: serde_json::Value = res.json().await.unwrap();
    let order = order["id"].as_str().unwrap().to_string();
    let res = crate::helpers::post_lines(
        &app.client,
        &app.url("/api/v1/holds"),
        "h1",
        &[("GOOD-1", 1)],
    )
    .await;
    let hold: serde_json::Value = res.json().await.unwrap();
    let hold = hold["id"].as_str().unwrap().to_string();
    app.login_admin().await;
    let personal = [
        "/admin".to_string(),
        "/admin/login".into(),
        "/admin/products".into(),
        "/admin/products/GOOD-1".into(),
        format!("/admin/orders/{order}"),
        "/api/v1/admin/dashboard".into(),
        "/cart".into(),
        format!("/orders/{order}"),
        format!("/checkout/{hold}"),
        format!("/api/v1/orders/{order}"),
        format!("/api/v1/holds/{hold}"),
    ];
    for path in &personal {
        let res = app.get(path).await;
        assert_eq!(res.status().as_u16(), 200, "{path}");
        assert_eq!(
            res.headers()
                .get("cache-control")
                .map(|v| v.to_str().unwrap()),
            Some("no-store"),
            "{path}"
        );
    }
    // Public pages may be kept.
    for path in ["/", "/products/GOOD-1", "/api/v1/products"] {
        let res = app.get(path).await;
        assert!(res.headers().get("cache-control").is_none(), "{path}");
    }
}

#[tokio::test]
async fn api_answers_set_no_cookie_while_pages_get_their_csrf_cookie() {
    let app = spawn_app_with(test_settings().await).await;
    app.add_product("GOOD-1", "Good", 1_000, 50).await;
    let mut answers = vec![
        (
            "order".to_string(),
            app.post_order("o1", &[("GOOD-1", 1)]).await,
        ),
        (
            "refused order".into(),
            app.post_order("o2", &[("NOPE-1", 1)]).await,
        ),
    ];
    for path in [
        "/api/v1/products",
        "/api/v1/products/GOOD-1",
        "/api/v1/nowhere",
    ] {
        answers.push((path.to_string(), app.get(path).await));
    }
    for (what, res) in &answers {
        assert!(
            res.headers().get("set-cookie").is_none(),
            "{what} ({}) set a cookie",
            res.status()
        );
    }
    assert_eq!(answers[0].1.status().as_u16(), 201);
    assert_eq!(answers[1].1.status().as_u16(), 422);
    // A page still gets the storefront's CSRF cookie for its forms.
    let page = app.get("/products/GOOD-1").await;
    let (token, _) = set_cookie(&page, "csrf").expect("a page sets the csrf cookie");
    assert_eq!(token.len(), 64);
}

/// The `name=value` of the Set-Cookie of `res` named `name`, and its attributes.
fn set_cookie(res: &reqwest::Response, name: &str) -> Option<(String, String)> {
    res.headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|c| c.starts_with(&format!("{name}=")))
        .map(|c| {
            let (pair, attrs) = c.split_once(';').unwrap_or((&c, ""));
            let value = pair.split_once('=').unwrap().1.to_string();
            (value, attrs.to_string())
        })
}

#[tokio::test]
async fn with_secure_cookies_every_cookie_is_secure_and_host_prefixed() {
    let mut settings = test_settings().await;
    settings.secure_cookies = true;
    let app = spawn_app_with(settings).await;
    app.add_product("GOOD-1", "Good", 1_000, 50).await;
    app.create_admin().await;
    // Cookies are handled by hand: a cookie store would not send Secure ones over http.
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let host_only = |attrs: &str| {
        let attrs = attrs.to_lowercase();
        attrs.contains("secure") && attrs.contains("path=/") && !attrs.contains("domain")
    };

    let res = plain.get(app.url("/")).send().await.unwrap();
    assert!(set_cookie(&res, "csrf").is_none());
    let (csrf, attrs) = set_cookie(&res, "__Host-csrf").expect("the csrf cookie");
    assert!(host_only(&attrs), "{attrs}");
    let csrf_cookie = format!("__Host-csrf={csrf}");

    // The cart reads and writes __Host-cart.
    let res = plain
        .post(app.url("/cart/add"))
        .header("Cookie", &csrf_cookie)
        .form(&[
            ("csrf", csrf.as_str()),
            ("sku", "GOOD-1"),
            ("quantity", "2"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status().as_u16(),
        303,
        "the csrf cookie is read by its prefixed name"
    );
    let (cart, attrs) = set_cookie(&res, "__Host-cart").expect("the cart cookie");
    assert!(host_only(&attrs), "{attrs}");
    let page = plain
        .get(app.url("/cart"))
        .header("Cookie", format!("{csrf_cookie}; __Host-cart={cart}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("GOOD-1"), "the cart is read back");

    // The admin session.
    let res = plain
        .post(app.url("/admin/login"))
        .header("Cookie", &csrf_cookie)
        .form(&[
            ("csrf", csrf.as_str()),
            ("username", ADMIN_USER),
            ("password", ADMIN_PASSWORD),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 303);
    let (session, attrs) = set_cookie(&res, "__Host-stockade_admin").expect("the session");
    assert!(
        host_only(&attrs) && attrs.to_lowercase().contains("httponly"),
        "{attrs}"
    );
    let admin = |cookie: String| {
        let plain = plain.clone();
        let url = app.url("/admin");
        async move {
            let res = plain
                .get(url)
                .header("Cookie", cookie)
                .send()
                .await
                .unwrap();
            res.status().as_u16()
        }
    };
    assert_eq!(admin(format!("__Host-stockade_admin={session}")).await, 200);
    assert_eq!(
        admin(format!("stockade_admin={session}")).await,
        303,
        "the unprefixed name is not read"
    );
}

#[tokio::test]
async fn metrics_are_off_the_public_port_unless_a_listener_or_token_is_configured() {
    // Nothing configured: no metrics anywhere.
    let mut settings = test_settings().await;
    settings.metrics_token = None;
    let app = spawn_app_with(settings).await;
    assert_eq!(app.get("/metrics").await.status().as_u16(), 404);
    assert!(app.metrics_address.is_none());

    // A listener of its own: metrics there (and nothing else), still none on the public port.
    let mut settings = test_settings().await;
    settings.metrics_token = None;
    settings.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    let app = spawn_app_with(settings).await;
    let metrics = app.metrics_address.clone().expect("a metrics listener");
    let res = app
        .client
        .get(format!("{metrics}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("stockade_lease_layer_degraded")
    );
    for path in ["/", "/admin/login", "/api/v1/products"] {
        let res = app
            .client
            .get(format!("{metrics}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 404, "{path} on the metrics listener");
    }
    assert_eq!(app.get("/metrics").await.status().as_u16(), 404);

    // A token: the public port serves metrics to its bearer only.
    let app = spawn_app_with(test_settings().await).await;
    assert_eq!(app.get("/metrics").await.status().as_u16(), 404, "no token");
    let wrong = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth("test-metrics-token-0123456780")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 404, "a wrong token");
    assert!(
        app.metrics()
            .await
            .contains("stockade_lease_layer_degraded")
    );
}
