//! The load generator: virtual buyers over HTTP, spread over the targets, closed-loop (a
//! fixed number of buyers at a time) or open-loop (a fixed arrival rate, with latency
//! measured from each buyer's intended start, so a slow server cannot hide its queue —
//! no coordinated omission).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::Scenario;
pub use paid::PayPlan;

mod paid;

/// What one run does.
#[derive(Debug, Clone)]
pub struct Plan {
    pub targets: Vec<String>,
    pub scenario: Scenario,
    /// The hot SKU (flash-sale) and the catalogue SKUs.
    pub hot_sku: String,
    pub catalogue: Vec<String>,
    pub buyers: u64,
    pub concurrency: usize,
    /// Arrivals per second; `None` runs closed-loop.
    pub rate: Option<f64>,
    pub duration: Duration,
    pub quantity: i64,
    pub retry_share: f64,
    pub double_submit_share: f64,
    pub changed_body_share: f64,
    pub hold_share: f64,
    pub timeout: Duration,
    pub seed: u64,
    /// A run label that keeps idempotency keys unique across runs.
    pub run_id: String,
    /// Sent as `Authorization: Bearer` with every request.
    pub api_key: Option<String>,
    /// Every buyer pays through the provider (`--payments`).
    pub payments: Option<PayPlan>,
}

/// How a buyer behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Behaviour {
    /// One request with a fresh key.
    Normal,
    /// Gives up on the first answer after a very short client timeout, then retries with
    /// the same key.
    RetryAfterTimeout,
    /// Two requests with one key at the same moment (a double click).
    DoubleSubmit,
    /// The same key again with a changed body (a buggy client); expects 422.
    ChangedBody,
    /// Reserves through a hold, then confirms it.
    Hold,
}

/// One request as the client saw it; the run's log, also used by the checker (I4, I5).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LogEntry {
    /// Milliseconds since the run started, when the request was sent.
    pub at_ms: f64,
    pub buyer: u64,
    pub behaviour: String,
    /// `order`, `hold` or `confirm`.
    pub kind: String,
    /// The idempotency key (for `confirm`, the hold id).
    pub key: String,
    /// HTTP status, or 0 when no answer came (timeout, connection error).
    pub status: u16,
    /// `created`, `sold-out`, `in-flight`, `rejected`, `busy`, `no-answer`, `error`.
    pub outcome: String,
    /// The order (or hold) id in a 201 answer.
    pub id: Option<String>,
    /// From the intended start of the buyer (open loop) or the send (closed loop).
    pub latency_ms: f64,
    pub target: usize,
}

/// Live numbers for the progress bar.
#[derive(Debug, Default)]
pub struct Live {
    pub requests: AtomicU64,
    pub created: AtomicU64,
    pub sold_out: AtomicU64,
    pub other: AtomicU64,
    pub available: AtomicU64,
}

struct Recorder {
    started: Instant,
    log: Mutex<Vec<LogEntry>>,
    live: Arc<Live>,
}

impl Recorder {
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        sent: Instant,
        intended: Instant,
        buyer: u64,
        behaviour: Behaviour,
        kind: &str,
        key: &str,
        answer: &Answer,
        target: usize,
    ) {
        let live = &self.live;
        live.requests.fetch_add(1, Ordering::Relaxed);
        match answer.outcome {
            "created" => live.created.fetch_add(1, Ordering::Relaxed),
            "sold-out" => live.sold_out.fetch_add(1, Ordering::Relaxed),
            _ => live.other.fetch_add(1, Ordering::Relaxed),
        };
        let behaviour = serde_json::to_value(behaviour)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        self.log.lock().expect("log lock").push(LogEntry {
            at_ms: sent.duration_since(self.started).as_secs_f64() * 1e3,
            buyer,
            behaviour,
            kind: kind.to_string(),
            key: key.to_string(),
            status: answer.status,
            outcome: answer.outcome.to_string(),
            id: answer.id.clone(),
            latency_ms: intended.elapsed().as_secs_f64() * 1e3,
            target,
        });
    }
}

/// An answer, classified.
#[derive(Debug, Clone)]
pub(super) struct Answer {
    pub status: u16,
    pub outcome: &'static str,
    pub id: Option<String>,
    /// A payment's answer (200): its status, and the client secret for 3-D Secure.
    pub payment: Option<(String, Option<String>)>,
}

impl Answer {
    fn none(error: &reqwest::Error) -> Self {
        Self {
            status: 0,
            outcome: if error.is_timeout() {
                "no-answer"
            } else {
                "error"
            },
            id: None,
            payment: None,
        }
    }
}

pub(super) async fn send(request: reqwest::RequestBuilder) -> Answer {
    let res = match request.send().await {
        Ok(res) => res,
        Err(e) => return Answer::none(&e),
    };
    let status = res.status().as_u16();
    let retry_after = res.headers().contains_key("retry-after");
    let body: serde_json::Value = match res.json().await {
        Ok(body) => body,
        Err(e) => return Answer::none(&e),
    };
    let text = |field: &str| body.get(field).and_then(|v| v.as_str()).map(str::to_string);
    let payment = (status == 200)
        .then(|| text("status").map(|s| (s, text("client_secret"))))
        .flatten();
    let outcome = match status {
        201 => "created",
        // A payment: authorized (or charged), 3-D Secure asked, or neither yet.
        200 => match payment.as_ref().map(|(s, _)| s.as_str()) {
            Some("requires_capture" | "succeeded") => "paid",
            Some("requires_action") => "3ds-asked",
            _ => "unpaid",
        },
        402 if body.get("decline_code").is_some() => "declined",
        402 => "unpaid",
        409 if body.get("shortages").is_some() => "sold-out",
        409 if retry_after => "in-flight",
        409 => "rejected",
        // 403: a drop's product without a valid pass.
        400 | 403 | 404 | 422 => "rejected",
        503 => "busy",
        _ => "error",
    };
    Answer {
        status,
        outcome,
        id: body
            .get("id")
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .filter(|_| status == 201),
        payment,
    }
}

/// One buyer's shopping list: `(sku, quantity)` lines.
pub(super) fn lines_for(plan: &Plan, buyer: u64, rng: &mut StdRng) -> Vec<(String, i64)> {
    let flash = match plan.scenario {
        Scenario::FlashSale | Scenario::Drop => true,
        Scenario::Catalogue => false,
        Scenario::Mixed => buyer.is_multiple_of(2),
    };
    if flash || plan.catalogue.is_empty() {
        return vec![(plan.hot_sku.clone(), plan.quantity)];
    }
    let n = rng.random_range(1..=3.min(plan.catalogue.len()));
    let mut lines: Vec<(String, i64)> = Vec::new();
    while lines.len() < n {
        let sku = &plan.catalogue[rng.random_range(0..plan.catalogue.len())];
        if !lines.iter().any(|(s, _)| s == sku) {
            lines.push((sku.clone(), rng.random_range(1..=plan.quantity.max(1))));
        }
    }
    lines
}

fn body(lines: &[(String, i64)]) -> serde_json::Value {
    let lines: Vec<serde_json::Value> = lines
        .iter()
        .map(|(sku, q)| serde_json::json!({"sku": sku, "quantity": q}))
        .collect();
    serde_json::json!({ "lines": lines })
}

struct Buyer<'a> {
    plan: &'a Plan,
    client: &'a reqwest::Client,
    recorder: &'a Recorder,
    id: u64,
    intended: Instant,
}

impl Buyer<'_> {
    fn target(&self) -> (usize, &str) {
        let i = (self.id % self.plan.targets.len() as u64) as usize;
        (i, &self.plan.targets[i])
    }

    /// POSTs `body` under `key`, retrying like a well-behaved client: after 409 in-flight
    /// (honouring Retry-After, briefly), 503 busy, or no answer, with the same key.
    /// The buyer's `first` request counts its latency from the buyer's intended start (so
    /// an open-loop buyer who waited for a busy client is not flattered); every other
    /// attempt from its own send.
    #[allow(clippy::too_many_arguments)]
    async fn post(
        &self,
        behaviour: Behaviour,
        kind: &str,
        path: &str,
        key: &str,
        body: &serde_json::Value,
        first_timeout: Duration,
        first: bool,
    ) -> Answer {
        let (target, base) = self.target();
        let mut timeout = first_timeout;
        let mut answer = None;
        for attempt in 0..6 {
            let sent = Instant::now();
            let from = if first && attempt == 0 {
                self.intended
            } else {
                sent
            };
            let mut a = send(
                self.client
                    .post(format!("{base}{path}"))
                    .header("Idempotency-Key", key)
                    .timeout(timeout)
                    .json(body),
            )
            .await;
            if a.outcome == "no-answer" && timeout < self.plan.timeout {
                // The client gave up on purpose: not a latency, and not the server's fault.
                a.outcome = "abandoned";
            }
            self.recorder
                .record(sent, from, self.id, behaviour, kind, key, &a, target);
            let again = matches!(
                a.outcome,
                "in-flight" | "busy" | "no-answer" | "abandoned" | "error"
            );
            answer = Some(a);
            if !again || attempt == 5 {
                break;
            }
            timeout = self.plan.timeout;
            tokio::time::sleep(Duration::from_millis(20 << attempt.min(4))).await;
        }
        answer.expect("at least one attempt")
    }

    async fn run(self, behaviour: Behaviour, rng: &mut StdRng) {
        let plan = self.plan;
        let key = format!("{}-{}", plan.run_id, self.id);
        let lines = lines_for(plan, self.id, rng);
        let order = body(&lines);
        if let Some(pay) = &plan.payments {
            return self.paid_checkout(behaviour, pay, &key, &order, rng).await;
        }
        let orders = "/api/v1/orders";
        let wait = plan.timeout;
        match behaviour {
            Behaviour::Normal => {
                self.post(behaviour, "order", orders, &key, &order, wait, true)
                    .await;
            }
            Behaviour::RetryAfterTimeout => {
                // A client that stops waiting almost at once, then retries the same key.
                let short = Duration::from_millis(2);
                self.post(behaviour, "order", orders, &key, &order, short, true)
                    .await;
            }
            Behaviour::DoubleSubmit => {
                let one = self.post(behaviour, "order", orders, &key, &order, wait, true);
                let two = self.post(behaviour, "order", orders, &key, &order, wait, true);
                tokio::join!(one, two);
            }
            Behaviour::ChangedBody => {
                self.post(behaviour, "order", orders, &key, &order, wait, true)
                    .await;
                // Logged as its own kind: a 422 here refuses the changed request, not the
                // order the key already has (the checker's I5 must not confuse the two).
                let changed: Vec<(String, i64)> =
                    lines.iter().map(|(s, q)| (s.clone(), q + 1)).collect();
                let changed = body(&changed);
                self.post(
                    behaviour,
                    "order-changed",
                    orders,
                    &key,
                    &changed,
                    wait,
                    false,
                )
                .await;
            }
            Behaviour::Hold => {
                let holds = "/api/v1/holds";
                let hold = self
                    .post(behaviour, "hold", holds, &key, &order, wait, true)
                    .await;
                if let Some(id) = hold.id {
                    let confirm = format!("/api/v1/holds/{id}/confirm");
                    let empty = serde_json::json!({});
                    self.post(behaviour, "confirm", &confirm, &id, &empty, wait, false)
                        .await;
                }
            }
        }
    }
}

/// Each buyer's own random choices, the same on every run with the same seed.
pub(super) fn buyer_rng(plan: &Plan, buyer: u64) -> StdRng {
    StdRng::seed_from_u64(plan.seed ^ buyer.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

pub(super) fn behaviour_of(plan: &Plan, rng: &mut StdRng) -> Behaviour {
    let x: f64 = rng.random();
    let mut edge = plan.hold_share;
    if x < edge {
        return Behaviour::Hold;
    }
    edge += plan.retry_share;
    if x < edge {
        return Behaviour::RetryAfterTimeout;
    }
    edge += plan.double_submit_share;
    if x < edge {
        return Behaviour::DoubleSubmit;
    }
    edge += plan.changed_body_share;
    if x < edge {
        return Behaviour::ChangedBody;
    }
    Behaviour::Normal
}

/// Samples the units available of the run's SKUs from the first target's API.
async fn sample_stock(plan: &Plan, client: &reqwest::Client) -> Option<i64> {
    let products: Vec<serde_json::Value> = client
        .get(format!("{}/api/v1/products", plan.targets[0]))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let watched = |sku: &str| match plan.scenario {
        Scenario::FlashSale | Scenario::Drop => sku == plan.hot_sku,
        Scenario::Catalogue => plan.catalogue.iter().any(|s| s == sku),
        Scenario::Mixed => sku == plan.hot_sku || plan.catalogue.iter().any(|s| s == sku),
    };
    Some(
        products
            .iter()
            .filter(|p| p["sku"].as_str().is_some_and(watched))
            .filter_map(|p| p["available"].as_i64())
            .sum(),
    )
}

/// Runs `plan`; `live` is updated as it goes (for a progress bar).
pub async fn run(plan: &Plan, live: Arc<Live>) -> anyhow::Result<Ran> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = &plan.api_key {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| anyhow::anyhow!("the API key has characters a header cannot carry"))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    crate::install_tls_provider(); // a library caller (a test) may not have
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(plan.concurrency.max(16))
        .timeout(plan.timeout)
        .default_headers(headers)
        .build()?;
    let recorder = Arc::new(Recorder {
        started: Instant::now(),
        log: Mutex::new(Vec::new()),
        live: live.clone(),
    });
    let started = recorder.started;
    let deadline = started + plan.duration;
    let next = Arc::new(AtomicU64::new(0));

    let stock_samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let (plan, client, samples, live) = (
            plan.clone(),
            client.clone(),
            stock_samples.clone(),
            live.clone(),
        );
        tokio::spawn(async move {
            loop {
                if let Some(available) = sample_stock(&plan, &client).await {
                    live.available
                        .store(available.max(0) as u64, Ordering::Relaxed);
                    samples
                        .lock()
                        .expect("samples lock")
                        .push((started.elapsed().as_secs_f64(), available));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    let buyer = |id: u64, intended: Instant| {
        let (plan, client, recorder) = (plan.clone(), client.clone(), recorder.clone());
        async move {
            let mut rng = buyer_rng(&plan, id);
            let behaviour = behaviour_of(&plan, &mut rng);
            Buyer {
                plan: &plan,
                client: &client,
                recorder: &recorder,
                id,
                intended,
            }
            .run(behaviour, &mut rng)
            .await;
        }
    };

    // How long sending took: for the open loop, until the last buyer's intended start.
    let mut dispatch = None;
    match plan.rate {
        None => {
            // Closed loop: `concurrency` buyers at a time until all have shopped.
            let workers = (0..plan.concurrency).map(|_| {
                let (next, buyer) = (next.clone(), &buyer);
                async move {
                    loop {
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        if id >= plan.buyers || Instant::now() >= deadline {
                            return;
                        }
                        buyer(id, Instant::now()).await;
                    }
                }
            });
            futures_util::future::join_all(workers).await;
        }
        Some(rate) => {
            // Open loop: buyer i starts at i / rate whatever the server is doing.
            let interval = Duration::from_secs_f64(1.0 / rate);
            let mut tasks = Vec::new();
            let (mut first_sent, mut last_sent) = (None::<Instant>, None::<Instant>);
            for id in 0..plan.buyers {
                let intended = started + interval.mul_f64(id as f64);
                if intended >= deadline {
                    break;
                }
                tokio::time::sleep_until(intended.into()).await;
                let now = Instant::now();
                first_sent.get_or_insert(now);
                last_sent = Some(now);
                next.fetch_add(1, Ordering::Relaxed);
                tasks.push(tokio::spawn(buyer(id, intended)));
            }
            // What was achieved, from when buyers were actually sent: n buyers sent between
            // the first and the last send make n − 1 intervals.
            let n = next.load(Ordering::Relaxed);
            if let (Some(first), Some(last)) = (first_sent, last_sent)
                && n > 1
            {
                dispatch = Some((last - first).mul_f64(n as f64 / (n - 1) as f64));
            }
            for task in tasks {
                task.await?;
            }
        }
    }
    let wall = started.elapsed();
    // One last sample, after the run.
    if let Some(available) = sample_stock(plan, &client).await {
        stock_samples
            .lock()
            .expect("samples lock")
            .push((wall.as_secs_f64(), available));
    }
    sampler.abort();

    let log = std::mem::take(&mut *recorder.log.lock().expect("log lock"));
    let stock = std::mem::take(&mut *stock_samples.lock().expect("samples lock"));
    let started_buyers = next.load(Ordering::Relaxed).min(plan.buyers);
    Ok(Ran {
        log,
        stock,
        wall,
        buyers_started: started_buyers,
        dispatch: dispatch.unwrap_or(wall),
    })
}

/// What a run recorded: every buyer's requests, the stock seen over time, how long it
/// took, how many buyers started, and how long dispatching them took.
pub struct Ran {
    pub log: Vec<LogEntry>,
    /// `(seconds into the run, units available)`.
    pub stock: Vec<(f64, i64)>,
    pub wall: Duration,
    pub buyers_started: u64,
    pub dispatch: Duration,
}
