//! Payments against a real Stripe-compatible server: localstripe, one fresh per test,
//! started and stopped like every other real part. Each test ends with I1–I3 and I9
//! (the provider's records against the shop's).

mod crash;
mod faults;
mod flow;
mod load;
mod reconcile;
mod webhook;

use std::time::Duration;

use serde_json::Value;
use stockade::config::{PaymentsMode, Settings};
use stockade::local::LocalStripe;
use uuid::Uuid;

use crate::helpers::{TestApp, servers, spawn_app_with, test_settings};

pub const WEBHOOK_SECRET: &str = "whsec_test_0123456789abcdef";
/// The product every test sells: 12.50 a unit, 10 in stock.
pub const SKU: &str = "PAY-MUG";
pub const PRICE: i64 = 1250;

/// A shop that takes payments through its own localstripe.
pub struct PayingShop {
    pub app: TestApp,
    pub stripe: LocalStripe,
    /// For asking the provider directly, as a shopper's browser or Stripe's dashboard does.
    pub provider: reqwest::Client,
}

/// A paying shop with test settings.
pub async fn paying_shop() -> PayingShop {
    paying_shop_with(|_| {}).await
}

/// A paying shop whose settings `adjust` changes, with `api_base` (when given) in front of
/// its localstripe instead of it.
pub async fn paying_shop_with(adjust: impl FnOnce(&mut Settings)) -> PayingShop {
    paying_shop_on(adjust, false).await
}

/// A paying shop with a Redis of its own, which the test may stop.
pub async fn paying_shop_with_own_redis() -> PayingShop {
    paying_shop_on(|_| {}, true).await
}

async fn paying_shop_on(adjust: impl FnOnce(&mut Settings), own_redis: bool) -> PayingShop {
    let dir = servers().await.fresh_dir("localstripe");
    let stripe = tokio::task::spawn_blocking(move || LocalStripe::start(&dir, None, true))
        .await
        .unwrap()
        .expect("localstripe starts (`make deps-localstripe` installs it)");
    let mut settings = test_settings().await;
    settings.payments = PaymentsMode::Stripe;
    settings.stripe_api_base = stripe.url();
    settings.stripe_secret_key = Some("sk_test_stockade".into());
    settings.stripe_publishable_key = Some("pk_test_stockade".into());
    settings.stripe_webhook_secret = Some(WEBHOOK_SECRET.into());
    adjust(&mut settings);
    let app = match own_redis {
        true => crate::helpers::spawn_app_with_own_redis_and(settings).await,
        false => spawn_app_with(settings).await,
    };
    stripe
        .register_webhook(&app.url("/webhooks/stripe"), WEBHOOK_SECRET)
        .await
        .unwrap();
    app.add_product(SKU, "Enamel mug", PRICE, 10).await;
    PayingShop {
        app,
        stripe,
        provider: reqwest::Client::new(),
    }
}

impl PayingShop {
    /// Places an (anonymous) API hold of `quantity` mugs; its id.
    pub async fn hold(&self, quantity: i64) -> Uuid {
        let hold = self
            .app
            .place_hold(&Uuid::new_v4().to_string(), &[(SKU, quantity)])
            .await;
        hold["id"].as_str().unwrap().parse().unwrap()
    }

    /// The settings of another `stockade serve` process of this shop, paying through
    /// `api_base` (its localstripe, or a proxy in front of it).
    pub fn process_env(&self, api_base: &str) -> Vec<(&'static str, String)> {
        vec![
            ("STOCKADE_PAYMENTS", "stripe".to_string()),
            ("STOCKADE_STRIPE_SECRET_KEY", "sk_test_stockade".into()),
            ("STOCKADE_STRIPE_PUBLISHABLE_KEY", "pk_test_stockade".into()),
            ("STOCKADE_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET.into()),
            ("STOCKADE_STRIPE_API_BASE", api_base.to_string()),
        ]
    }

    /// `POST /api/v1/holds/{hold}/payment`, with `method` when given.
    pub async fn pay(&self, hold: Uuid, method: Option<&str>) -> reqwest::Response {
        let req = self
            .app
            .client
            .post(self.app.url(&format!("/api/v1/holds/{hold}/payment")));
        match method {
            Some(method) => req.json(&serde_json::json!({ "payment_method": method })),
            None => req,
        }
        .send()
        .await
        .unwrap()
    }

    /// Pays with `method`, expecting 200 (after waiting out another finisher, as a client
    /// does on 409 "being processed"); the answer.
    pub async fn pay_ok(&self, hold: Uuid, method: &str) -> Value {
        let res = patiently(|| async { Ok(self.pay(hold, Some(method)).await) }).await;
        let status = res.status().as_u16();
        let body: Value = res.json().await.unwrap();
        assert_eq!(status, 200, "paying with {method}: {body}");
        body
    }

    /// `POST /api/v1/holds/{hold}/confirm` with an email, sent again while another
    /// finisher holds the payment (409 "being processed", as a client does).
    pub async fn confirm(&self, hold: Uuid) -> reqwest::Response {
        patiently(|| {
            self.app
                .client
                .post(self.app.url(&format!("/api/v1/holds/{hold}/confirm")))
                .json(&serde_json::json!({ "email": "ada@example.com" }))
                .send()
        })
        .await
    }

    /// An intent as the provider has it.
    pub async fn intent(&self, id: &str) -> Value {
        self.provider_get(&format!("/v1/payment_intents/{id}"))
            .await
    }

    /// Every intent on the provider's account.
    pub async fn intents(&self) -> Vec<Value> {
        self.list("/v1/payment_intents").await
    }

    /// Every refund on the provider's account.
    pub async fn refunds(&self) -> Vec<Value> {
        self.list("/v1/refunds").await
    }

    /// The first page (100) of one of the provider's lists.
    async fn list(&self, path: &str) -> Vec<Value> {
        let page = self.provider_get(&format!("{path}?limit=100")).await;
        page["data"].as_array().cloned().unwrap_or_default()
    }

    /// `GET` of `path` at the provider, with the shop's secret key.
    async fn provider_get(&self, path: &str) -> Value {
        self.provider
            .get(format!("{}{path}", self.stripe.url()))
            .bearer_auth("sk_test_stockade")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `GET /api/v1/orders/{id}`'s JSON.
    pub async fn order(&self, id: &str) -> Value {
        self.app
            .client
            .get(self.app.url(&format!("/api/v1/orders/{id}")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Hold `hold` runs out now, and the sweeper ends it.
    pub async fn end_hold(&self, hold: Uuid) {
        sqlx::query("update holds set expires_at = now() - interval '1 second' where id = $1")
            .bind(hold)
            .execute(&self.app.db)
            .await
            .unwrap();
        self.app.sweep_holds().await;
    }

    /// Waits until `sql` counts exactly one row; panics naming `what` after `within`.
    pub async fn wait_for_one(&self, what: &str, sql: &'static str, within: Duration) {
        until(what, within, || async { self.app.count(sql).await == 1 }).await;
    }

    /// Intents the provider captured.
    pub async fn captured(&self) -> Vec<Value> {
        let mut all = self.intents().await;
        all.retain(|i| i["status"] == "succeeded");
        all
    }

    /// Waits until `intent`'s status at the provider is `status`; panics naming it after
    /// `within`.
    pub async fn wait_for_intent(&self, intent: &str, status: &str, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let now = self.intent(intent).await;
            if now["status"] == status {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "intent {intent} did not become {status} within {within:?}: it is {}",
                now["status"]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// I1–I3 on the shop's database, and I9 between it and the provider (a window of
    /// zero: every payment is expected finished).
    pub async fn assert_invariants(&self) {
        self.app.assert_invariants().await;
        let stripe = stockade::payments::Stripe::of(&self.app.settings)
            .unwrap()
            .unwrap();
        let broken = stockade::payments::audit::i9_rows(&self.app.db, &stripe, Duration::ZERO)
            .await
            .unwrap();
        assert!(broken.is_empty(), "I9 broken: {broken:#?}");
    }

    /// A card token for `number` made as Stripe.js makes one in the browser (with the
    /// publishable key); its card's id (`card_…`), which pays like a PaymentMethod.
    pub async fn card(&self, number: &str) -> String {
        let token: Value = self
            .provider
            .post(format!("{}/v1/tokens", self.stripe.url()))
            .form(&[
                ("key", "pk_test_stockade"),
                ("card[number]", number),
                ("card[exp_month]", "12"),
                ("card[exp_year]", "2034"),
                ("card[cvc]", "123"),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        token["card"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("a card token: {token}"))
            .to_string()
    }
}

/// Asserts that `res` is a problem with `status` whose detail says `says`; the problem.
pub async fn assert_problem(res: reqwest::Response, status: u16, says: &str) -> Value {
    assert_eq!(res.status().as_u16(), status);
    let problem: Value = res.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(says), "{status} saying {says:?}: {problem}");
    problem
}

/// Sends `request` until it is not answered 409 "being processed" (another finisher holds
/// the payment's lease: a reconciler's look, the provider's webhook), for up to 15 s.
pub async fn patiently<F>(request: impl Fn() -> F) -> reqwest::Response
where
    F: Future<Output = reqwest::Result<reqwest::Response>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let res = request().await.unwrap();
        let busy = res.status().as_u16() == 409 && res.headers().contains_key("retry-after");
        if !busy || std::time::Instant::now() > deadline {
            return res;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `check` holds, for at most `within`; panics naming `what`.
pub async fn until<F: Future<Output = bool>>(what: &str, within: Duration, check: impl Fn() -> F) {
    let deadline = std::time::Instant::now() + within;
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
