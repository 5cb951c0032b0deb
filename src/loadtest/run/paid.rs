//! A paying buyer (`stockade loadtest --payments`): a hold, its payment through the
//! provider, then its confirmation. A share of buyers has a card declined first (then
//! pays with another), a share meets 3-D Secure (and completes it, as Stripe.js would), and
//! the run's double-submit and retry shares press Pay and Place order twice, or give up
//! on the first answer and retry.

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::{Answer, Behaviour, Buyer};

/// Where the buyers' browsers reach the provider (for card tokens and 3-D Secure), and
/// how often each case comes up.
#[derive(Debug, Clone)]
pub struct PayPlan {
    /// The provider's base URL (localstripe's, or a Stripe-compatible one).
    pub provider: String,
    pub publishable_key: String,
    /// Share of paying buyers whose first card is declined.
    pub declined_share: f64,
    /// Share of paying buyers whose card asks for 3-D Secure.
    pub action_share: f64,
}

/// A card the provider authorizes; one it declines; one that asks for 3-D Secure.
const GOOD: &str = "pm_card_visa";
const DECLINED: &str = "pm_card_chargeCustomerFail";
const THREE_D_SECURE: &str = "4000000000003220";

impl Buyer<'_> {
    pub(super) async fn paid_checkout(
        &self,
        behaviour: Behaviour,
        pay: &PayPlan,
        key: &str,
        order: &Value,
        rng: &mut StdRng,
    ) {
        let wait = self.plan.timeout;
        let hold = self
            .post(behaviour, "hold", "/api/v1/holds", key, order, wait, true)
            .await;
        let Some(hold) = hold.id else {
            return;
        };
        let path = format!("/api/v1/holds/{hold}/payment");
        let x: f64 = rng.random();
        if x < pay.declined_share {
            let declined = json!({ "payment_method": DECLINED });
            self.post(behaviour, "pay", &path, &hold, &declined, wait, false)
                .await;
        }
        let three_d = (pay.declined_share..pay.declined_share + pay.action_share).contains(&x);
        let method = match three_d {
            true => match self.card(pay, THREE_D_SECURE).await {
                Some(card) => card,
                None => return,
            },
            false => GOOD.to_string(),
        };
        let body = json!({ "payment_method": method });
        let paid = self
            .twice_if_asked(behaviour, "pay", &path, &hold, &body)
            .await;
        match paid
            .payment
            .as_ref()
            .map(|(s, secret)| (s.as_str(), secret))
        {
            Some(("requires_capture" | "succeeded", _)) => {}
            Some(("requires_action", Some(secret))) => {
                if !self.authenticate(pay, secret).await {
                    return;
                }
            }
            _ => return,
        }
        let confirm = format!("/api/v1/holds/{hold}/confirm");
        self.twice_if_asked(behaviour, "confirm", &confirm, &hold, &json!({}))
            .await;
    }

    /// POSTs once, or (a double submit) twice at once, or (a retrying buyer) first with a
    /// timeout too short to wait for; the answer that says most.
    async fn twice_if_asked(
        &self,
        behaviour: Behaviour,
        kind: &str,
        path: &str,
        key: &str,
        body: &Value,
    ) -> Answer {
        let wait = self.plan.timeout;
        match behaviour {
            Behaviour::DoubleSubmit => {
                let one = self.post(behaviour, kind, path, key, body, wait, false);
                let two = self.post(behaviour, kind, path, key, body, wait, false);
                let (one, two) = tokio::join!(one, two);
                if one.payment.is_some() || one.status == 201 {
                    one
                } else {
                    two
                }
            }
            Behaviour::RetryAfterTimeout => {
                let short = Duration::from_millis(2);
                self.post(behaviour, kind, path, key, body, short, false)
                    .await
            }
            _ => {
                self.post(behaviour, kind, path, key, body, wait, false)
                    .await
            }
        }
    }

    /// A card token for `number`, made as Stripe.js makes one in a browser; its card's id.
    async fn card(&self, pay: &PayPlan, number: &str) -> Option<String> {
        let token: Value = self
            .client
            .post(format!("{}/v1/tokens", pay.provider))
            .header(reqwest::header::AUTHORIZATION, "")
            .form(&[
                ("key", pay.publishable_key.as_str()),
                ("card[number]", number),
                ("card[exp_month]", "12"),
                ("card[exp_year]", "2034"),
                ("card[cvc]", "123"),
            ])
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        token["card"]["id"].as_str().map(str::to_string)
    }

    /// Completes 3-D Secure for the intent whose client secret is `secret`, as the
    /// shopper does in Stripe.js's dialog (localstripe's `_authenticate`).
    async fn authenticate(&self, pay: &PayPlan, secret: &str) -> bool {
        let Some((intent, _)) = secret.split_once("_secret_") else {
            return false;
        };
        self.client
            .post(format!(
                "{}/v1/payment_intents/{intent}/_authenticate",
                pay.provider
            ))
            .header(reqwest::header::AUTHORIZATION, "")
            .form(&[
                ("key", pay.publishable_key.as_str()),
                ("client_secret", secret),
                ("success", "true"),
            ])
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }
}
