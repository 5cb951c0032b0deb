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
    assert_eq!(res.status().as_u16(), 404);
}
