//! The dispatcher: a task in every process that routes new events to deliveries and
//! sends due deliveries, up to 64 at once, looking every `STOCKADE_DISPATCH_INTERVAL_MS`
//! (at once again while there is more to do).
//!
//! A delivery is claimed with `for update skip locked` and a lease (the send timeout plus
//! a margin): no two dispatchers send it at the same time, and one that dies mid-send
//! leaves it due again when the lease runs out. A failed attempt is retried after an
//! exponential backoff with full jitter (`STOCKADE_DELIVERY_BACKOFF_MS` × 2^attempt, at
//! most an hour), and after `STOCKADE_DELIVERY_MAX_ATTEMPTS` the delivery is marked
//! failed; the admin can send it again. Deliveries to one endpoint are not ordered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::Semaphore;

use super::db::{self, Attempt, Claimed};
use super::mail::{MailError, Mailer};
use super::target::{self, Lookup, Refused, Resolver};
use crate::config::Settings;
use crate::metrics::Metrics;

/// Events routed per statement.
const ROUTE_BATCH: i64 = 500;
/// Deliveries one process sends at the same time.
const SENDS_AT_ONCE: usize = 64;
/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(3_600);
/// How much of a receiver's answer is kept.
const RESPONSE_EXCERPT: usize = 300;
/// Kept instead of the answer of a receiver on a private address.
pub const PRIVATE_ANSWER: &str =
    "(not kept: the receiver is on a private address, whose answers are not shown)";

/// What a dispatcher needs; cheap to clone into each send.
#[derive(Clone)]
pub struct Dispatcher {
    db: PgPool,
    http: reqwest::Client,
    mailer: Option<Arc<Mailer>>,
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
}

impl Dispatcher {
    pub fn new(
        db: PgPool,
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        mailer: Option<Arc<Mailer>>,
    ) -> anyhow::Result<Self> {
        let resolver = Resolver::system(settings.webhook_allow_private);
        Ok(Self {
            db,
            http: resolver.client(settings.webhook_timeout)?,
            mailer,
            settings,
            metrics,
        })
    }

    /// This dispatcher with webhook hosts looked up by `lookup` (and checked as ever); a
    /// test plays a name server with it.
    pub fn looking_up_with(mut self, lookup: Lookup) -> anyhow::Result<Self> {
        let resolver = Resolver::with_lookup(lookup, self.settings.webhook_allow_private);
        self.http = resolver.client(self.settings.webhook_timeout)?;
        Ok(self)
    }

    /// Runs rounds for the life of the process.
    pub fn spawn(self) {
        tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(SENDS_AT_ONCE));
            let mut gauges_at = Instant::now();
            loop {
                let busy = match self.round(&slots).await {
                    Ok(busy) => busy,
                    Err(e) => {
                        tracing::warn!(error = %e, "event dispatch failed");
                        false
                    }
                };
                if gauges_at.elapsed() >= self.settings.dispatch_interval {
                    gauges_at = Instant::now();
                    let refreshed =
                        crate::pg::bounded(crate::pg::ROUND_LIMIT, self.refresh_gauges());
                    if let Err(e) = refreshed.await {
                        tracing::warn!(error = %e, "reading the outbox's gauges failed");
                    }
                }
                if !busy {
                    tokio::time::sleep(self.settings.dispatch_interval).await;
                }
            }
        });
    }

    /// One round: route new events, then claim as many due deliveries as there are free
    /// send slots and start sending them. Sends run on their own, so one slow receiver
    /// holds up only its own slot. True when there may be more to do right away.
    async fn round(&self, slots: &Arc<Semaphore>) -> sqlx::Result<bool> {
        // Each database call bounded (not the round, which also waits for send slots as
        // long as a slow receiver takes).
        let limit = crate::pg::ROUND_LIMIT;
        let route = db::route(&self.db, ROUTE_BATCH, self.mailer.is_some());
        let routed = crate::pg::bounded(limit, route).await?;
        let free = slots.available_permits();
        if free == 0 {
            // Every slot is sending: go on when one is free.
            drop(slots.acquire().await);
            return Ok(true);
        }
        let lease = self.settings.webhook_timeout + Duration::from_secs(1);
        let claimed = crate::pg::bounded(limit, db::claim(&self.db, free as i64, lease)).await?;
        let full = claimed.len() == free;
        for delivery in claimed {
            let slot = slots.clone().acquire_owned().await.expect("never closed");
            let me = self.clone();
            tokio::spawn(async move {
                if let Err(e) = me.deliver(delivery).await {
                    tracing::warn!(error = %e, "recording a delivery failed");
                }
                drop(slot);
            });
        }
        Ok(routed == ROUTE_BATCH || full)
    }

    async fn refresh_gauges(&self) -> sqlx::Result<()> {
        let (pending, oldest) = db::pending(&self.db).await?;
        self.metrics.events_pending.set(pending);
        self.metrics.events_oldest_pending.set(oldest);
        Ok(())
    }

    /// Sends one claimed delivery and records what came of it.
    async fn deliver(&self, claimed: Claimed) -> sqlx::Result<()> {
        let (attempt, retry) = match claimed.channel.as_str() {
            "mail" => self.mail(&claimed).await,
            _ => self.post(&claimed).await,
        };
        let recorded = if attempt.error.is_none() {
            let latency = (chrono::Utc::now() - claimed.event_created_at)
                .to_std()
                .unwrap_or_default();
            self.metrics
                .event_delivery_latency
                .observe(latency.as_secs_f64());
            self.metrics.deliveries.with_label_values(&["sent"]).inc();
            db::mark_sent(&self.db, &claimed, &attempt).await?
        } else {
            let max = self.settings.delivery_max_attempts;
            let wait =
                (retry && claimed.attempts < max as i32).then(|| self.backoff(claimed.attempts));
            let outcome = if wait.is_some() { "retry" } else { "failed" };
            self.metrics.deliveries.with_label_values(&[outcome]).inc();
            db::mark_unsent(&self.db, &claimed, &attempt, wait).await?
        };
        if !recorded {
            tracing::info!(
                delivery = claimed.id,
                "a delivery's lease ran out while sending; another dispatcher has it"
            );
        }
        Ok(())
    }

    /// Full jitter: a random wait up to base × 2^(attempts − 1), capped.
    fn backoff(&self, attempts: i32) -> Duration {
        let base = self.settings.delivery_backoff;
        let ceiling = base
            .saturating_mul(1u32 << attempts.clamp(1, 20).saturating_sub(1))
            .min(MAX_BACKOFF);
        let millis = ceiling.as_millis().max(1) as u64;
        Duration::from_millis(rand::random_range(millis / 2..=millis))
    }

    /// POSTs a webhook, signed. Success is any 2xx; the rest is retried.
    async fn post(&self, claimed: &Claimed) -> (Attempt, bool) {
        let (Some(url), Some(secret)) = (&claimed.url, &claimed.secret) else {
            return Attempt::failed("the endpoint is gone".into(), false);
        };
        // A host written as an address is connected to as written; a name is looked up and
        // checked by the client's resolver as it connects (no lookup in between).
        let refused = |e: Refused| {
            let retry = matches!(e, Refused::Unresolved { .. });
            Attempt::failed(e.to_string(), retry)
        };
        let url = match target::parse(url) {
            Ok(url) => url,
            Err(e) => return refused(e),
        };
        if let Err(e) = target::check_literal(&url, self.settings.webhook_allow_private) {
            return refused(e);
        }
        let body = super::body(
            claimed.event_id,
            &claimed.event_type,
            claimed.version,
            claimed.event_created_at,
            &claimed.payload,
        );
        let id = claimed.event_id.to_string();
        let timestamp = chrono::Utc::now().timestamp();
        let Some(signature) = super::sign::signature(secret, &id, timestamp, body.as_bytes())
        else {
            return Attempt::failed("the endpoint's secret is damaged".into(), false);
        };
        let started = Instant::now();
        let sent = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => match target::refusal(&e) {
                Some(e) => return refused(e.clone()),
                None => return Attempt::failed(without_url(e), true),
            },
        };
        let status = response.status();
        // What a receiver on the shop's own network says is not shown to the admin (only
        // allowed by STOCKADE_WEBHOOK_ALLOW_PRIVATE): the deliveries list would read
        // internal services' answers out.
        let private = response
            .remote_addr()
            .is_none_or(|a| !target::is_public(a.ip()));
        let excerpt = if private {
            PRIVATE_ANSWER.to_string()
        } else {
            let text = response.text().await.unwrap_or_default();
            text.chars().take(RESPONSE_EXCERPT).collect()
        };
        tracing::debug!(
            delivery = claimed.id,
            status = status.as_u16(),
            ms = started.elapsed().as_millis() as u64,
            "webhook sent"
        );
        let attempt = Attempt {
            status: Some(status.as_u16()),
            response: Some(excerpt),
            error: (!status.is_success()).then(|| format!("the receiver answered {status}")),
        };
        (attempt, true)
    }

    /// Sends a receipt.
    async fn mail(&self, claimed: &Claimed) -> (Attempt, bool) {
        let Some(mailer) = &self.mailer else {
            return Attempt::failed(
                "mail is not configured in the process that sent this".into(),
                true,
            );
        };
        let order: super::mail::Receipt = match serde_json::from_value(claimed.payload.clone()) {
            Ok(order) => order,
            Err(e) => return Attempt::failed(format!("the event is not an order: {e}"), false),
        };
        match mailer.send_receipt(claimed.event_id, &order).await {
            Ok(said) => (
                Attempt {
                    status: None,
                    response: Some(said.chars().take(RESPONSE_EXCERPT).collect()),
                    error: None,
                },
                true,
            ),
            Err(MailError::Retry(e)) => Attempt::failed(e, true),
            Err(MailError::Permanent(e)) => Attempt::failed(e, false),
        }
    }
}

/// A send error's text without its URL (which the list shows already).
fn without_url(e: reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "the request failed"
    };
    let mut source = std::error::Error::source(&e);
    let mut detail = String::new();
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}: {detail}")
    }
}
