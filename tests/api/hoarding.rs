//! Hoarding across holds: a shopper's live holds of a product count together against the
//! cap per SKU (by API client, browser, email), and a network's against a larger cap per
//! address; counted under the stock row's lock, so holds sent at once are counted too.

use futures_util::future::join_all;
use stockade::clients::{self, Limit};
use stockade::config::{OrderStrategy, Settings};

use crate::helpers::*;

const SKU: &str = "HOARD-1";

async fn app_with(strategy: OrderStrategy, per_address: i32) -> TestApp {
    let app = spawn_app_with(Settings {
        order_strategy: strategy,
        api_anonymous_orders: false,
        hold_max_per_sku: 5,
        hold_max_per_sku_per_address: per_address,
        ..test_settings().await
    })
    .await;
    app.add_product(SKU, "Hoard", 1_000, 40).await;
    app
}

async fn new_key(app: &TestApp, name: &str, limit: Limit) -> String {
    clients::create(&app.db, name, limit).await.unwrap().1
}

/// POSTs a hold of `quantity` of [`SKU`] as `api_key`, with `email` if given.
async fn hold(
    app: &TestApp,
    api_key: &str,
    quantity: i64,
    email: Option<&str>,
) -> reqwest::Response {
    let mut body = serde_json::json!({"lines": [{"sku": SKU, "quantity": quantity}]});
    if let Some(email) = email {
        body["email"] = email.into();
    }
    client()
        .post(app.url("/api/v1/holds"))
        .bearer_auth(api_key)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn detail(res: reqwest::Response) -> String {
    let body: serde_json::Value = res.json().await.unwrap();
    body["detail"].as_str().unwrap_or_default().to_string()
}

async fn holds_by_one_client_count_together(strategy: OrderStrategy) {
    let app = app_with(strategy, 20).await;
    let key = new_key(&app, "hoarder", Limit::Default).await;

    // Eight holds of five, sent at once: one is placed, the rest are refused.
    let answers = join_all((0..8).map(|_| hold(&app, &key, 5, None))).await;
    let statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{strategy:?}: {statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        7,
        "{strategy:?}: {statuses:?}"
    );
    assert_eq!(app.stock(SKU).await, (40, 5), "{strategy:?}");

    // One more unit is refused in words, and changes nothing.
    let res = hold(&app, &key, 1, None).await;
    assert_eq!(res.status().as_u16(), 409);
    let said = detail(res).await;
    assert_eq!(
        said,
        "You already hold 5 of Hoard in checkouts not yet placed, and one shopper may hold at \
         most 5 at a time. Place or cancel them first, or wait for them to expire.",
        "{strategy:?}"
    );
    assert_eq!(app.stock(SKU).await, (40, 5), "{strategy:?}");
    assert_eq!(app.count("select count(*) from holds").await, 1);

    // The same email from another client is the same shopper.
    let other = new_key(&app, "other", Limit::Default).await;
    let res = hold(&app, &other, 2, Some("ada@example.com")).await;
    assert_eq!(res.status().as_u16(), 201, "{strategy:?}");
    let third = new_key(&app, "third", Limit::Default).await;
    let res = hold(&app, &third, 4, Some("Ada+drop@example.com")).await;
    assert_eq!(res.status().as_u16(), 409, "{strategy:?}");
    assert!(detail(res).await.starts_with("You already hold 2 of Hoard"));

    // A released hold no longer counts.
    let id: String =
        sqlx::query_scalar("select id::text from holds where email is null and state = 'active'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    let res = client()
        .delete(app.url(&format!("/api/v1/holds/{id}")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let res = hold(&app, &key, 5, None).await;
    assert_eq!(res.status().as_u16(), 201, "{strategy:?}");
    assert_eq!(app.stock(SKU).await, (40, 7), "{strategy:?}");
    app.assert_invariants().await;
}

#[tokio::test]
async fn holds_by_one_client_count_together_under_redis_lock() {
    holds_by_one_client_count_together(OrderStrategy::RedisLock).await;
}

#[tokio::test]
async fn holds_by_one_client_count_together_under_batched() {
    holds_by_one_client_count_together(OrderStrategy::Batched).await;
}

async fn one_network_shares_a_larger_cap(strategy: OrderStrategy) {
    let app = app_with(strategy, 8).await;
    // Three shoppers behind one address (every test client is 127.0.0.1).
    let (a, b, c) = (
        new_key(&app, "a", Limit::Default).await,
        new_key(&app, "b", Limit::Default).await,
        new_key(&app, "c", Limit::Default).await,
    );
    assert_eq!(hold(&app, &a, 5, None).await.status().as_u16(), 201);
    assert_eq!(hold(&app, &b, 3, None).await.status().as_u16(), 201);
    let res = hold(&app, &c, 1, None).await;
    assert_eq!(res.status().as_u16(), 409, "{strategy:?}");
    assert_eq!(
        detail(res).await,
        "Checkouts from your network already hold 8 of Hoard, and at most 8 may be held from \
         one network at a time. Please try again in a few minutes.",
    );
    assert_eq!(app.stock(SKU).await, (40, 8), "{strategy:?}");

    // A client with no rate limit (a load tool, a trusted backend) stands for many
    // shoppers: its holds are capped one by one, not counted together.
    let tool = new_key(&app, "tool", Limit::Unlimited).await;
    for _ in 0..3 {
        assert_eq!(hold(&app, &tool, 5, None).await.status().as_u16(), 201);
    }
    assert_eq!(app.stock(SKU).await, (40, 23), "{strategy:?}");
    app.assert_invariants().await;
}

#[tokio::test]
async fn one_network_shares_a_larger_cap_under_redis_lock() {
    one_network_shares_a_larger_cap(OrderStrategy::RedisLock).await;
}

#[tokio::test]
async fn one_network_shares_a_larger_cap_under_batched() {
    one_network_shares_a_larger_cap(OrderStrategy::Batched).await;
}
