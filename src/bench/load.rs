//! The bench's HTTP load: the same request over and over, as fast as the servers answer
//! (closed loop: a fixed number of connections, each sending its next request when the
//! last is answered) or at a fixed rate (open loop: requests start on schedule whatever
//! the servers do, and latency counts from the scheduled start, so a queue cannot hide).
//!
//! Unlike `loadtest`, no buyer retries or misbehaves: every order has a fresh key and is
//! sent once, so the numbers are the cost of one request.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What each request is.
#[derive(Debug, Clone)]
pub enum Work {
    /// POST /api/v1/orders for `quantity` units of a SKU picked uniformly from these.
    Order {
        skus: Arc<Vec<String>>,
        quantity: i32,
    },
    /// GET this path.
    Page { path: String },
}

/// Where and what to send.
#[derive(Debug, Clone)]
pub struct Load {
    /// Server base URLs; connections are spread over them.
    pub targets: Vec<String>,
    pub work: Work,
    pub timeout: Duration,
    /// Sent as `Authorization: Bearer` with every order.
    pub api_key: Option<String>,
}

/// Answers counted while a phase runs (for a progress bar).
#[derive(Debug, Default)]
pub struct Live {
    pub answers: AtomicU64,
}

/// What one phase measured.
#[derive(Debug, Clone)]
pub struct Measured {
    pub seconds: f64,
    /// Answers by HTTP status; 0 for no answer (timeout, connection error).
    pub statuses: BTreeMap<u16, u64>,
    /// Microseconds, from the send (closed loop) or the scheduled start (open loop).
    pub latency: Histogram<u64>,
}

impl Measured {
    fn empty() -> Self {
        Self {
            seconds: 0.0,
            statuses: BTreeMap::new(),
            latency: histogram(),
        }
    }

    fn record(&mut self, status: u16, took: Duration) {
        *self.statuses.entry(status).or_insert(0) += 1;
        self.latency
            .saturating_record(took.as_micros().max(1) as u64);
    }

    fn merge(&mut self, other: &Self) {
        for (status, n) in &other.statuses {
            *self.statuses.entry(*status).or_insert(0) += n;
        }
        self.latency
            .add(&other.latency)
            .expect("histograms with equal bounds");
    }

    /// Every request sent.
    pub fn requests(&self) -> u64 {
        self.statuses.values().sum()
    }

    /// Answers with the `expected` status.
    pub fn expected(&self, expected: u16) -> u64 {
        self.statuses.get(&expected).copied().unwrap_or(0)
    }

    /// Latency at quantile `q`, in milliseconds.
    pub fn ms(&self, q: f64) -> f64 {
        if self.latency.is_empty() {
            return 0.0;
        }
        self.latency.value_at_quantile(q) as f64 / 1000.0
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 10 min, three significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds")
}

/// The HTTP client of one phase, with a pooled connection per loop.
pub fn client(connections: usize, timeout: Duration) -> anyhow::Result<reqwest::Client> {
    crate::install_tls_provider(); // a library caller (a test) may not have
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(connections.max(16))
        .timeout(timeout)
        .build()?)
}

/// Where one loop sends its requests: the URL parsed once, not per request (the client's
/// own cost is part of what the machine spends, so it is kept small).
fn url_for(load: &Load, base: &str) -> reqwest::Url {
    let path = match &load.work {
        Work::Order { .. } => "/api/v1/orders",
        Work::Page { path } => path,
    };
    reqwest::Url::parse(&format!("{base}{path}")).expect("bench targets are valid URLs")
}

/// Sends one request; returns its status (0 when none came). The body is read to the end
/// so the connection is reused.
async fn send(client: &reqwest::Client, load: &Load, url: &reqwest::Url, rng: &mut StdRng) -> u16 {
    let request = match &load.work {
        Work::Order { skus, quantity } => {
            let sku = &skus[rng.random_range(0..skus.len())];
            // SKUs are plain ASCII (letters, digits, dashes): no escaping needed.
            let body = format!(r#"{{"lines":[{{"sku":"{sku}","quantity":{quantity}}}]}}"#);
            let request = client
                .post(url.clone())
                .header("Idempotency-Key", uuid::Uuid::new_v4().simple().to_string())
                .header("Content-Type", "application/json")
                .body(body);
            match &load.api_key {
                Some(key) => request.bearer_auth(key),
                None => request,
            }
        }
        Work::Page { .. } => client.get(url.clone()),
    };
    match request.send().await {
        Ok(res) => {
            let status = res.status().as_u16();
            match res.bytes().await {
                Ok(_) => status,
                Err(_) => 0,
            }
        }
        Err(_) => 0,
    }
}

/// Closed loop: `connections` loops, each sending its next request as soon as the last is
/// answered, for `duration`.
pub async fn closed(
    load: &Load,
    client: &reqwest::Client,
    connections: usize,
    duration: Duration,
    live: Arc<Live>,
) -> Measured {
    let started = Instant::now();
    let deadline = started + duration;
    let loops: Vec<_> = (0..connections.max(1))
        .map(|i| {
            let (load, client, live) = (load.clone(), client.clone(), live.clone());
            tokio::spawn(async move {
                let url = url_for(&load, &load.targets[i % load.targets.len()]);
                let mut rng = StdRng::seed_from_u64(i as u64 ^ 0x5EED_BE4C);
                let mut measured = Measured::empty();
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    let status = send(&client, &load, &url, &mut rng).await;
                    measured.record(status, sent.elapsed());
                    live.answers.fetch_add(1, Ordering::Relaxed);
                }
                measured
            })
        })
        .collect();
    let mut all = Measured::empty();
    for task in loops {
        if let Ok(measured) = task.await {
            all.merge(&measured);
        }
    }
    all.seconds = started.elapsed().as_secs_f64();
    all
}

/// Open loop: request `i` starts at `i / rate` seconds whatever the servers are doing, for
/// `duration`; each latency counts from its scheduled start.
pub async fn open(
    load: &Load,
    client: &reqwest::Client,
    rate: f64,
    duration: Duration,
    live: Arc<Live>,
) -> Measured {
    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let urls: Arc<Vec<reqwest::Url>> =
        Arc::new(load.targets.iter().map(|t| url_for(load, t)).collect());
    let mut tasks = Vec::new();
    for i in 0u64.. {
        let intended = started + interval.mul_f64(i as f64);
        if intended >= started + duration {
            break;
        }
        tokio::time::sleep_until(intended.into()).await;
        let (load, client, live, urls) = (load.clone(), client.clone(), live.clone(), urls.clone());
        tasks.push(tokio::spawn(async move {
            let url = &urls[(i as usize) % urls.len()];
            let mut rng = StdRng::seed_from_u64(i ^ 0x0BE4_C0DE);
            let status = send(&client, &load, url, &mut rng).await;
            live.answers.fetch_add(1, Ordering::Relaxed);
            (status, intended.elapsed())
        }));
    }
    let mut all = Measured::empty();
    for task in tasks {
        if let Ok((status, took)) = task.await {
            all.record(status, took);
        }
    }
    // The send window, not the time the last answers took to come back.
    all.seconds = duration.as_secs_f64();
    all
}
