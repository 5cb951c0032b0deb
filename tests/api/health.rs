use crate::helpers::{spawn_app, spawn_app_with_own_redis};

#[tokio::test]
async fn healthz_answers_while_the_process_lives() {
    let app = spawn_app().await;
    let (status, body) = app.get_text("/healthz").await;
    assert_eq!((status, body.trim()), (200, "ok"));
}

#[tokio::test]
async fn readyz_says_ready_when_postgres_and_redis_answer() {
    let app = spawn_app().await;
    let res = app.get("/readyz").await;
    assert_eq!(res.status().as_u16(), 200);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], "ready");
    assert_eq!(body["postgres"], "ok");
    assert_eq!(body["redis"], "ok");
}

#[tokio::test]
async fn readyz_answers_503_naming_redis_when_redis_is_stopped() {
    let mut app = spawn_app_with_own_redis().await;
    assert_eq!(app.get("/readyz").await.status().as_u16(), 200);

    app.stop_redis();
    let res = app.get("/readyz").await;
    assert_eq!(res.status().as_u16(), 503);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], "unavailable");
    assert_eq!(body["postgres"], "ok");
    assert!(
        body["redis"].as_str().unwrap().starts_with("unreachable"),
        "{body}"
    );

    // The storefront keeps working without Redis.
    assert_eq!(app.get("/").await.status().as_u16(), 200);
}

#[tokio::test]
async fn head_answers_like_get_without_a_body() {
    let app = spawn_app().await;
    app.seed_demo().await;
    for path in [
        "/",
        "/healthz",
        "/readyz",
        "/products/KB-ALPINE-75",
        "/api/v1/products",
    ] {
        let get = app.get(path).await;
        let head = app.client.head(app.url(path)).send().await.unwrap();
        assert_eq!(head.status(), get.status(), "HEAD {path}");
        assert_eq!(
            head.headers().get("content-type"),
            get.headers().get("content-type"),
            "HEAD {path}"
        );
        assert!(
            head.bytes().await.unwrap().is_empty(),
            "HEAD {path} has no body"
        );
    }
    // Not a way around the routes that only take other methods.
    let res = app.client.head(app.url("/cart/add")).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 405);
    assert_eq!(res.headers()["allow"], "POST");
}

#[tokio::test]
async fn a_method_an_address_does_not_take_gets_405_naming_the_ones_it_does() {
    let app = spawn_app().await;
    app.seed_demo().await;
    let cases = [
        (reqwest::Method::PUT, "/api/v1/orders", "POST"),
        (
            reqwest::Method::POST,
            "/api/v1/products/KB-ALPINE-75",
            "GET, HEAD",
        ),
        (
            reqwest::Method::PATCH,
            "/api/v1/holds/abc",
            "GET, HEAD, DELETE",
        ),
        (
            reqwest::Method::DELETE,
            "/products/KB-ALPINE-75",
            "GET, HEAD",
        ),
        (reqwest::Method::PUT, "/admin/login", "GET, HEAD, POST"),
    ];
    for (method, path, allow) in cases {
        let res = app
            .client
            .request(method.clone(), app.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 405, "{method} {path}");
        assert_eq!(res.headers()["allow"], allow, "{method} {path}");
        let api = path.starts_with("/api/");
        let content_type = res.headers()["content-type"].to_str().unwrap().to_string();
        let body = res.text().await.unwrap();
        assert!(
            body.contains(&format!("{method} is not answered here")),
            "{body}"
        );
        if api {
            assert_eq!(content_type, "application/problem+json", "{method} {path}");
        } else {
            assert!(content_type.starts_with("text/html"), "{method} {path}");
        }
    }
    // Every GET answers HEAD, as Allow says, admin pages included.
    let res = app
        .client
        .head(app.url("/admin/login"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    // An address that does not exist at all is still 404, whatever the method.
    let res = app
        .client
        .put(app.url("/api/v1/nothing-here"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 404);
}
