//! Shipping addresses over the API: given with an order or a hold's confirmation, stored on
//! the order and answered with it; a bad one refused with its field named, changing nothing.

use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app};

fn address() -> Value {
    json!({
        "name": "Ada Lovelace",
        "line1": "12 St James's Square",
        "city": "London",
        "postal_code": "SW1Y 4JH",
        "country": "GB"
    })
}

async fn post(app: &TestApp, path: &str, key: Option<&str>, body: Value) -> (u16, Value) {
    let mut request = app.client.post(app.url(path)).json(&body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let res = request.send().await.unwrap();
    (
        res.status().as_u16(),
        res.json().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn an_order_keeps_its_shipping_address_and_answers_it() {
    let app = spawn_app().await;
    app.add_product("SHIP-1", "Shipped thing", 1_000, 5).await;
    let body = json!({"lines": [{"sku": "SHIP-1", "quantity": 1}], "shipping_address": address()});
    let (status, order) = post(&app, "/api/v1/orders", Some("ship-1"), body.clone()).await;
    assert_eq!(status, 201, "{order}");
    assert_eq!(order["shipping_address"]["country"], "GB");
    assert_eq!(order["shipping_address"]["line1"], "12 St James's Square");
    // The same from the order's own address, and from a retry under the key.
    let id = order["id"].as_str().unwrap();
    let (status, read) = app.get_text(&format!("/api/v1/orders/{id}")).await;
    assert_eq!(status, 200);
    let read: Value = serde_json::from_str(&read).unwrap();
    assert_eq!(read["shipping_address"], order["shipping_address"]);
    let (status, again) = post(&app, "/api/v1/orders", Some("ship-1"), body).await;
    assert_eq!((status, &again["id"]), (201, &order["id"]));
    // A different address under the same key is a different request.
    let mut moved =
        json!({"lines": [{"sku": "SHIP-1", "quantity": 1}], "shipping_address": address()});
    moved["shipping_address"]["city"] = json!("Paris");
    moved["shipping_address"]["country"] = json!("FR");
    let (status, _) = post(&app, "/api/v1/orders", Some("ship-1"), moved).await;
    assert_eq!(status, 422, "a key reused for another address");
    // An order without one has none.
    let bare = json!({"lines": [{"sku": "SHIP-1", "quantity": 1}]});
    let (status, order) = post(&app, "/api/v1/orders", Some("ship-2"), bare).await;
    assert_eq!(status, 201);
    assert!(order.get("shipping_address").is_none(), "{order}");
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_bad_shipping_address_is_refused_naming_its_field_and_changes_nothing() {
    let app = spawn_app().await;
    app.add_product("SHIP-2", "Shipped thing", 1_000, 5).await;
    let with = |change: &dyn Fn(&mut Value)| {
        let mut a = address();
        change(&mut a);
        json!({"lines": [{"sku": "SHIP-2", "quantity": 1}], "shipping_address": a})
    };
    let cases: [(&str, Value, &str); 6] = [
        (
            "unknown country",
            with(&|a| a["country"] = json!("XX")),
            "In shipping_address, country must be a country code",
        ),
        (
            "lower-case country",
            with(&|a| a["country"] = json!("gb")),
            "In shipping_address, country must be a country code",
        ),
        (
            "no city",
            with(&|a| a["city"] = json!("  ")),
            "In shipping_address, city is required.",
        ),
        (
            "long line",
            with(&|a| a["line1"] = json!("x".repeat(201))),
            "In shipping_address, line1 must be at most 200",
        ),
        ("unknown field", with(&|a| a["floor"] = json!("3")), "floor"),
        (
            "not an object",
            json!({"lines": [{"sku": "SHIP-2", "quantity": 1}], "shipping_address": "London"}),
            "The shipping address must be a JSON object",
        ),
    ];
    for (i, (case, body, says)) in cases.into_iter().enumerate() {
        let (status, problem) = post(&app, "/api/v1/orders", Some(&format!("bad-{i}")), body).await;
        assert_eq!(status, 422, "{case}: {problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(says), "{case}: {detail}");
    }
    assert_eq!(app.count("select count(*) from orders").await, 0);
    assert_eq!(app.stock("SHIP-2").await, (5, 0));
    // A hold takes no address: it is given when the hold is confirmed.
    let body = json!({"lines": [{"sku": "SHIP-2", "quantity": 1}], "shipping_address": address()});
    let (status, problem) = post(&app, "/api/v1/holds", Some("hold-addr"), body).await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("when the hold is confirmed")
    );
    assert_eq!(app.stock("SHIP-2").await, (5, 0));
}

#[tokio::test]
async fn a_hold_confirmed_with_an_address_ships_there() {
    let app = spawn_app().await;
    app.add_product("SHIP-3", "Shipped thing", 1_000, 5).await;
    let hold = app.place_hold("ship-hold", &[("SHIP-3", 2)]).await;
    let confirm = format!("/api/v1/holds/{}/confirm", hold["id"].as_str().unwrap());
    let mut bad = address();
    bad["country"] = json!("ZZ");
    let (status, problem) = post(&app, &confirm, None, json!({"shipping_address": bad})).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(app.count("select count(*) from orders").await, 0);
    let (status, order) = post(&app, &confirm, None, json!({"shipping_address": address()})).await;
    assert_eq!(status, 201, "{order}");
    assert_eq!(order["shipping_address"]["city"], "London");
    let stored: Value = sqlx::query_scalar("select shipping_address from orders")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(stored["postal_code"], "SW1Y 4JH");
    // The order.placed event carries it, for receipts and webhooks.
    let event: Value = sqlx::query_scalar(
        "select payload from events where type = 'order.placed' order by id desc limit 1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(event["shipping_address"]["country"], "GB");
    assert_eq!(event["number"], order["number"]);
}
