//! Who is calling the API, and the rate limit on placing orders and holds.
//!
//! - [`caller`]: the API client named by `Authorization: Bearer sk_…`; without the header,
//!   anonymous when `STOCKADE_API_ANONYMOUS_ORDERS` allows it, else 401. A wrong or revoked
//!   key is 401 whatever that setting says (a client that thinks it sends a key should
//!   learn that it does not work). Wrong keys are counted per client address
//!   ([`super::client_addr`]); past `STOCKADE_API_KEY_MAX_FAILURES` in
//!   `STOCKADE_API_KEY_FAILURE_WINDOW_SECONDS` the address is answered 429 with
//!   `Retry-After` before any key is looked up, so guessing keys costs the database
//!   nothing. A key this process found live lately is still let through.
//! - [`limit_placement`]: every order or hold (API or checkout form) counts against its
//!   caller's bucket: the API client's, or else the address's ([`super::client_addr`]).
//!   Past the limit: 429 with `Retry-After`. The rule itself is in [`crate::ratelimit`].

use std::time::Duration;

use actix_web::HttpRequest;
use actix_web::http::header;

use super::AppState;
use crate::clients::{Caller, KEY_PREFIX, Limit};
use crate::error::AppError;
use crate::ratelimit::{Decision, Failures, Quota, Store, retry_after_secs};

/// The caller of an API request that places or reads orders and holds.
pub async fn caller(req: &HttpRequest, state: &AppState) -> Result<Caller, AppError> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        if state.settings.api_anonymous_orders {
            return Ok(Caller::Anonymous);
        }
        return Err(AppError::ApiKey {
            message: "Orders and holds need an API key: send it as \
                      `Authorization: Bearer sk_…`. The shop's admin can make you one."
                .into(),
            invalid: false,
        });
    };
    let invalid = || AppError::ApiKey {
        message: "This API key is not valid: it is unknown, mistyped or revoked. \
                  Send it as `Authorization: Bearer sk_…`."
            .into(),
        invalid: true,
    };
    let key = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim())
        .filter(|key| key.starts_with(KEY_PREFIX) && key.len() <= 128);
    let cached = key.and_then(|key| state.api_keys.cached(key));
    if let Some(Some(client)) = cached {
        return Ok(Caller::Client(client));
    }
    let failures = KeyFailures::of(req, state);
    failures.refuse_if_throttled(state).await?;
    let client = match (key, cached) {
        (Some(_), Some(known)) => known,
        (Some(key), None) => state.api_keys.client(&state.db, key).await?,
        (None, _) => None,
    };
    match client {
        Some(client) => Ok(Caller::Client(client)),
        None => {
            failures.count(state).await;
            Err(invalid())
        }
    }
}

/// The wrong API keys of one client address.
struct KeyFailures {
    subject: String,
    allowance: Failures,
}

impl KeyFailures {
    fn of(req: &HttpRequest, state: &AppState) -> Self {
        Self {
            subject: format!("keyfail:{}", super::client_addr(req, &state.settings)),
            allowance: Failures {
                max: state.settings.api_key_max_failures,
                window: state.settings.api_key_failure_window,
            },
        }
    }

    /// 429 while this address is past its allowance (nothing is counted: a refused
    /// request does not extend the wait).
    async fn refuse_if_throttled(&self, state: &AppState) -> Result<(), AppError> {
        let (decision, store) = state
            .limiter
            .peek_failures(&self.subject, self.allowance)
            .await;
        let Decision::Limited { retry_after } = decision else {
            return Ok(());
        };
        let secs = counted_refusal(state, store, retry_after);
        tracing::info!(
            subject = self.subject,
            retry_after_s = secs,
            "wrong API keys throttled"
        );
        Err(AppError::TooManyRequests {
            message: format!(
                "Too many wrong API keys from your address: at most {} in {} s. \
                 Please wait {secs} s, and check the key you send.",
                self.allowance.max,
                self.allowance.window.as_secs()
            ),
            retry_after: secs,
        })
    }

    async fn count(&self, state: &AppState) {
        state
            .limiter
            .count_failure(&self.subject, self.allowance)
            .await;
    }
}

/// Counts a 429 in the metrics under the store that decided it; answers its `Retry-After`
/// in whole seconds.
fn counted_refusal(state: &AppState, store: Store, retry_after: Duration) -> u64 {
    state
        .metrics
        .rate_limited
        .with_label_values(&[store.as_str()])
        .inc();
    retry_after_secs(retry_after)
}

/// Counts one order or hold against the caller's rate limit (`None`: a checkout form,
/// counted by address); 429 past it.
pub async fn limit_placement(
    req: &HttpRequest,
    state: &AppState,
    caller: Option<&Caller>,
) -> Result<(), AppError> {
    let settings = &state.settings;
    let default = Quota {
        per_minute: settings.rate_limit_per_minute,
        burst: settings.rate_limit_burst,
    };
    let (subject, quota) = match caller {
        Some(Caller::Client(client)) => {
            let subject = format!("client:{}", client.id);
            match client.limit {
                Limit::Unlimited => return Ok(()),
                Limit::Default => (subject, default),
                // Bursts of ten seconds' worth, or the shop's burst if that is more.
                Limit::PerMinute(n) => (
                    subject,
                    Quota {
                        per_minute: n,
                        burst: default.burst.max(n / 6),
                    },
                ),
            }
        }
        Some(Caller::Anonymous) | None => (
            format!("addr:{}", super::client_addr(req, &state.settings)),
            default,
        ),
    };
    let (decision, store) = state.limiter.check(&subject, quota).await;
    match decision {
        Decision::Allowed => Ok(()),
        Decision::Limited { retry_after } => {
            let secs = counted_refusal(state, store, retry_after);
            tracing::info!(subject, retry_after_s = secs, "rate limited");
            Err(AppError::TooManyRequests {
                message: format!(
                    "Too many orders from you: at most {} a minute, {} at once. \
                     Please wait {secs} s before the next one.",
                    quota.per_minute, quota.burst
                ),
                retry_after: secs,
            })
        }
    }
}
