//! One idempotency key, one order: concurrent sends, another body, a refusal replayed.

use futures_util::future::join_all;

use crate::helpers::spawn_app;

#[tokio::test]
async fn one_key_sent_twenty_times_at_once_makes_one_order() {
    let app = spawn_app().await;
    app.add_product("KEY-1", "Keyed", 2_500, 50).await;
    let answers = join_all((0..20).map(|_| async {
        let res = app.post_order("the-one-key", &[("KEY-1", 2)]).await;
        let status = res.status().as_u16();
        let retry_after = res.headers().contains_key("retry-after");
        let body: serde_json::Value = res.json().await.unwrap();
        (status, retry_after, body)
    }))
    .await;
    let orders = app.count("select count(*) from orders").await;
    assert_eq!(orders, 1);
    let id = sqlx::query_scalar!(r#"select id::text as "id!" from orders"#)
        .fetch_one(&app.db)
        .await
        .unwrap();
    for (status, retry_after, body) in &answers {
        match status {
            201 => assert_eq!(body["id"], id.as_str()),
            409 => assert!(*retry_after, "in-flight answers say when to retry"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(app.stock("KEY-1").await.0, 48, "stock taken once");

    let res = app.post_order("the-one-key", &[("KEY-1", 2)]).await;
    assert_eq!(res.status().as_u16(), 201);
    assert_eq!(res.headers()["idempotency-replayed"], "true");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["id"], id.as_str());
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_same_key_with_another_body_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.add_product("KEY-2", "Keyed", 2_500, 50).await;
    let first = app.post_order("reused", &[("KEY-2", 1)]).await;
    assert_eq!(first.status().as_u16(), 201);
    let first: serde_json::Value = first.json().await.unwrap();

    let res = app.post_order("reused", &[("KEY-2", 3)]).await;
    assert_eq!(res.status().as_u16(), 422);
    let problem: serde_json::Value = res.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("different request")
    );

    assert_eq!(app.count("select count(*) from orders").await, 1);
    assert_eq!(app.stock("KEY-2").await.0, 49);
    let order: serde_json::Value = app
        .get(&format!("/api/v1/orders/{}", first["id"].as_str().unwrap()))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(order, first, "the first order is unchanged");
}

#[tokio::test]
async fn not_enough_stock_is_decided_once_and_replayed() {
    let app = spawn_app().await;
    app.add_product("SHORT-1", "Short", 1_000, 2).await;
    app.add_product("SHORT-2", "Plenty", 1_000, 50).await;
    let res = app
        .post_order("short", &[("SHORT-2", 1), ("SHORT-1", 3)])
        .await;
    assert_eq!(res.status().as_u16(), 409);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        problem["shortages"],
        serde_json::json!([{"sku": "SHORT-1", "requested": 3, "available": 2}])
    );
    assert!(problem["detail"].as_str().unwrap().contains("SHORT-1"));
    assert_eq!(app.stock("SHORT-1").await.0, 2);
    assert_eq!(app.stock("SHORT-2").await.0, 50, "nothing half-written");

    // Stock arrives, but the key's answer was decided: the retry gets the same 409.
    sqlx::query!("update stock set on_hand = 10 where sku = 'SHORT-1'")
        .execute(&app.db)
        .await
        .unwrap();
    let res = app
        .post_order("short", &[("SHORT-2", 1), ("SHORT-1", 3)])
        .await;
    assert_eq!(res.status().as_u16(), 409);
    assert_eq!(res.headers()["idempotency-replayed"], "true");
    assert_eq!(app.count("select count(*) from orders").await, 0);
}
