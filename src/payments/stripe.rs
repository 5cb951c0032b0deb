//! A small typed client for the Stripe calls checkout makes: PaymentIntents (create,
//! update, confirm, capture, cancel, retrieve) and Refunds. Form-encoded requests on the
//! process's reqwest, as Stripe's API takes them; every POST carries an `Idempotency-Key`
//! derived from what it is for, so a retry reuses it (Stripe then answers the first
//! request's result; a provider that ignores the key is still safe, see `super`).

use std::time::Duration;

use serde::Deserialize;

use super::Status;
use crate::config::Secret;

/// The provider's API.
#[derive(Clone)]
pub struct Stripe {
    http: reqwest::Client,
    base: String,
    key: Secret,
}

/// A PaymentIntent, as far as checkout reads one.
#[derive(Debug, Clone, Deserialize)]
pub struct Intent {
    pub id: String,
    pub status: Status,
    pub amount: i64,
    pub currency: String,
    #[serde(default)]
    pub client_secret: Option<String>,
    #[serde(default)]
    pub last_payment_error: Option<ProviderError>,
}

/// A Refund.
#[derive(Debug, Clone, Deserialize)]
pub struct Refund {
    pub id: String,
    pub amount: i64,
    #[serde(default)]
    pub payment_intent: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
}

/// A list page (`GET /v1/…?limit=`).
#[derive(Debug, Deserialize)]
struct Page<T> {
    data: Vec<T>,
    #[serde(default)]
    has_more: bool,
}

/// The `error` member of a provider's error answer.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProviderError {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub decline_code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: ProviderError,
}

/// Why a call did not give what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// 402: the card was declined; the provider's code (its `decline_code` when it gives
    /// one) and its message for the shopper.
    #[error("the card was declined: {message}")]
    Declined { code: String, message: String },
    /// Another 4xx: the provider refused the request as it stands (an intent in another
    /// state, an unknown payment method). Nothing happened.
    #[error("the payment provider refused the request ({status}): {message}")]
    Refused { status: u16, message: String },
    /// No answer in time, or a 5xx or 429: the call may or may not have happened. Ask the
    /// provider before acting on it.
    #[error("the payment provider did not answer: {0}")]
    Unanswered(String),
}

impl CallError {
    /// A refusal because the intent is not in the state the call needs (a second
    /// capture, a confirmation of an intent confirmed already): read it and go on.
    pub fn is_refused(&self) -> bool {
        matches!(self, Self::Refused { status: 400, .. })
    }
}

impl Stripe {
    /// The provider `settings` name, when the shop takes payments.
    pub fn of(settings: &crate::config::Settings) -> anyhow::Result<Option<Self>> {
        if settings.payments == crate::config::PaymentsMode::Off {
            return Ok(None);
        }
        let key = settings.stripe_secret_key.clone().ok_or_else(|| {
            anyhow::anyhow!("STOCKADE_PAYMENTS=stripe needs STOCKADE_STRIPE_SECRET_KEY")
        })?;
        Ok(Some(Self::new(
            &settings.stripe_api_base,
            key,
            settings.stripe_timeout,
        )?))
    }

    pub fn new(base: &str, key: Secret, timeout: Duration) -> reqwest::Result<Self> {
        crate::install_tls_provider();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(3)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("Stockade/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            key,
        })
    }

    /// Makes hold `hold`'s intent for its `attempt`-th card (0: the first; a new one
    /// replaces an intent whose card was declined): `amount` in `currency`'s minor unit,
    /// authorized only (captured after the order commits).
    pub async fn create_intent(
        &self,
        hold: uuid::Uuid,
        attempt: i32,
        amount: i64,
        currency: &str,
    ) -> Result<Intent, CallError> {
        let form = [
            ("amount", amount.to_string()),
            ("currency", currency.to_string()),
            ("capture_method", "manual".into()),
            ("payment_method_types[]", "card".into()),
            ("metadata[hold_id]", hold.to_string()),
        ];
        let key = match attempt {
            0 => format!("hold-{hold}-intent"),
            n => format!("hold-{hold}-intent-{n}"),
        };
        self.post("/v1/payment_intents", &form, &key).await
    }

    /// Sets the intent's payment method (`pm_…` or `card_…`); `key` names the attempt.
    pub async fn set_method(
        &self,
        intent: &str,
        method: &str,
        key: &str,
    ) -> Result<Intent, CallError> {
        let form = [("payment_method", method.to_string())];
        self.post(&format!("/v1/payment_intents/{intent}"), &form, key)
            .await
    }

    /// Confirms the intent with the method set on it: `requires_capture` when authorized,
    /// `requires_action` for 3-D Secure, [`CallError::Declined`] when declined.
    pub async fn confirm(&self, intent: &str, key: &str) -> Result<Intent, CallError> {
        self.post(&format!("/v1/payment_intents/{intent}/confirm"), &[], key)
            .await
    }

    pub async fn capture(&self, intent: &str) -> Result<Intent, CallError> {
        let key = format!("{intent}-capture");
        self.post(&format!("/v1/payment_intents/{intent}/capture"), &[], &key)
            .await
    }

    pub async fn cancel(&self, intent: &str) -> Result<Intent, CallError> {
        let key = format!("{intent}-cancel");
        self.post(&format!("/v1/payment_intents/{intent}/cancel"), &[], &key)
            .await
    }

    /// Refunds the whole captured amount of `intent`, keyed by the order it paid for.
    pub async fn refund(&self, intent: &str, order: uuid::Uuid) -> Result<Refund, CallError> {
        let form = [
            ("payment_intent", intent.to_string()),
            ("metadata[order_id]", order.to_string()),
        ];
        self.post("/v1/refunds", &form, &format!("order-{order}-refund"))
            .await
    }

    pub async fn retrieve(&self, intent: &str) -> Result<Intent, CallError> {
        self.get(&format!("/v1/payment_intents/{intent}")).await
    }

    pub async fn retrieve_refund(&self, id: &str) -> Result<Refund, CallError> {
        self.get(&format!("/v1/refunds/{id}")).await
    }

    /// Every refund of `intent`. (A server that cannot filter refunds by intent, as
    /// localstripe cannot, is asked for all of them.)
    pub async fn refunds_of(&self, intent: &str) -> Result<Vec<Refund>, CallError> {
        let filtered = self
            .get::<Page<Refund>>(&format!("/v1/refunds?payment_intent={intent}&limit=100"))
            .await;
        let refunds = match filtered {
            Ok(page) => page.data,
            Err(e) if e.is_refused() => self.all_refunds().await?,
            Err(e) => return Err(e),
        };
        Ok(refunds
            .into_iter()
            .filter(|r| r.payment_intent.as_deref() == Some(intent))
            .collect())
    }

    /// Every intent on the account (for `stockade check`).
    pub async fn all_intents(&self) -> Result<Vec<Intent>, CallError> {
        self.list_all("/v1/payment_intents", |i: &Intent| i.id.clone())
            .await
    }

    /// Every refund on the account (for `stockade check`).
    pub async fn all_refunds(&self) -> Result<Vec<Refund>, CallError> {
        self.list_all("/v1/refunds", |r: &Refund| r.id.clone())
            .await
    }

    /// Every object of a list, page by page.
    async fn list_all<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        id: impl Fn(&T) -> String,
    ) -> Result<Vec<T>, CallError> {
        let mut all: Vec<T> = Vec::new();
        loop {
            let after = all
                .last()
                .map(|last| format!("&starting_after={}", id(last)))
                .unwrap_or_default();
            let page: Page<T> = self.get(&format!("{path}?limit=100{after}")).await?;
            let more = page.has_more && !page.data.is_empty();
            all.extend(page.data);
            if !more {
                return Ok(all);
            }
        }
    }

    async fn post<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        form: &[(&str, String)],
        key: &str,
    ) -> Result<T, CallError> {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&*self.key)
            .header("Idempotency-Key", key)
            .form(form);
        answer(request.send().await).await
    }

    async fn get<T: for<'de> Deserialize<'de>>(&self, path: &str) -> Result<T, CallError> {
        let request = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&*self.key);
        answer(request.send().await).await
    }
}

/// What an answer means: the object, or which [`CallError`].
async fn answer<T: for<'de> Deserialize<'de>>(
    sent: reqwest::Result<reqwest::Response>,
) -> Result<T, CallError> {
    let response = sent.map_err(|e| CallError::Unanswered(without_url(&e)))?;
    let status = response.status().as_u16();
    let body = response
        .bytes()
        .await
        .map_err(|e| CallError::Unanswered(without_url(&e)))?;
    if (200..300).contains(&status) {
        return serde_json::from_slice(&body).map_err(|e| {
            // A 2xx we cannot read: what it did is not known.
            CallError::Unanswered(format!("an answer Stockade cannot read ({e})"))
        });
    }
    if status == 429 || status >= 500 {
        return Err(CallError::Unanswered(format!("HTTP {status}")));
    }
    let error = serde_json::from_slice::<ErrorAnswer>(&body)
        .map(|a| a.error)
        .unwrap_or_default();
    let message = error
        .message
        .clone()
        .unwrap_or_else(|| format!("HTTP {status}"));
    if status == 402 {
        let code = error
            .decline_code
            .or(error.code)
            .unwrap_or_else(|| "card_declined".into());
        return Err(CallError::Declined { code, message });
    }
    Err(CallError::Refused { status, message })
}

/// A transport error's text without the URL (which is the provider's, and not secret, but
/// says nothing more).
fn without_url(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "no answer in time".into()
    } else if e.is_connect() {
        "could not connect".into()
    } else {
        e.to_string()
    }
}
