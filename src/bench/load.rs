//! The bench's HTTP load: the same request over and over, as fast as the servers answer
//! (closed loop: a fixed number of connections, each sending its next request when the
//! last is answered) or at a fixed rate (open loop: requests start on schedule whatever
//! the servers do, and latency counts from the scheduled start, so a queue cannot hide).
//!
//! Unlike `loadtest`, no buyer retries or misbehaves: every order has a fresh key and is
//! sent once, so the numbers are the cost of one request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What each request is.
#[derive(Debug, Clone)]
pub enum Work {
    /// POST `path` (`/api/v1/orders` or `/api/v1/holds`, which take the same body) for
    /// `quantity` units of a SKU picked uniformly from these.
    Order {
        path: &'static str,
        skus: Arc<Vec<String>>,
        quantity: i32,
    },
    /// POST /api/v1/orders of a cart: one unit of `hot` and one of a SKU picked uniformly
    /// from `skus`.
    Cart { hot: String, skus: Arc<Vec<String>> },
    /// POST `/api/v1/holds/{id}/confirm` of the holds in turn (`paths`), from `next`.
    Confirm {
        paths: Arc<Vec<String>>,
        next: Arc<std::sync::atomic::AtomicUsize>,
    },
    /// GET one of these paths, picked at random per request.
    Page { paths: Arc<Vec<String>> },
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
    pub(super) fn empty() -> Self {
        Self {
            seconds: 0.0,
            statuses: BTreeMap::new(),
            latency: histogram(),
        }
    }

    pub(super) fn record(&mut self, status: u16, took: Duration) {
        *self.statuses.entry(status).or_insert(0) += 1;
        self.latency
            .saturating_record(took.as_micros().max(1) as u64);
    }

    pub(super) fn merge(&mut self, other: &Self) {
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

/// Where one loop sends its requests: the URL parsed once, not per request.
fn url_for(load: &Load, base: &str) -> reqwest::Url {
    let path = match &load.work {
        Work::Order { path, .. } => *path,
        Work::Confirm { .. } => "/",
        Work::Cart { .. } => "/api/v1/orders",
        Work::Page { .. } => "/",
    };
    reqwest::Url::parse(&format!("{base}{path}")).expect("bench targets are valid URLs")
}

/// What one order request carries: a fresh `Idempotency-Key` and its JSON body.
fn order(skus: &[String], quantity: i32, rng: &mut StdRng) -> (String, String) {
    let sku = &skus[rng.random_range(0..skus.len())];
    // SKUs are plain ASCII (letters, digits, dashes): no escaping needed.
    let body = format!(r#"{{"lines":[{{"sku":"{sku}","quantity":{quantity}}}]}}"#);
    (uuid::Uuid::new_v4().simple().to_string(), body)
}

/// One loop's own keep-alive HTTP/1.1 connection, written to directly (as wrk does)
/// rather than through a pool: the client shares the machine with the servers it
/// measures, and this costs it about half as much per request as a pooled client.
/// A connection that fails is dropped and opened again for the next request.
pub struct Connection {
    /// `host:port`, for connecting and as the `Host` header.
    authority: String,
    path: String,
    bearer: Option<HeaderValue>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    fn new(load: &Load, base: &str) -> Self {
        let mut connection = Self::to(&url_for(load, base));
        connection.bearer = load.api_key.as_ref().map(|k| {
            HeaderValue::try_from(format!("Bearer {k}")).expect("API keys are header-safe")
        });
        connection
    }

    /// A connection to `url`'s server (its path the default for [`Work`]'s requests), for
    /// requests made elsewhere too: the storefront's pages ([`Self::fetch`]).
    pub(super) fn to(url: &reqwest::Url) -> Self {
        let authority = format!(
            "{}:{}",
            url.host_str().unwrap_or("127.0.0.1"),
            url.port_or_known_default().unwrap_or(80)
        );
        Self {
            authority,
            path: url.path().to_string(),
            bearer: None,
            sender: None,
        }
    }

    /// `host:port`, as the `Host` header names it.
    pub(super) fn authority(&self) -> &str {
        &self.authority
    }

    /// Sends `request`; its answer's head and whole body, or `None` when none came within
    /// `timeout` (and then the connection is dropped).
    pub(super) async fn fetch(
        &mut self,
        request: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Option<(hyper::http::response::Parts, Bytes)> {
        match tokio::time::timeout(timeout, self.answer(request)).await {
            Ok(Some(answer)) => Some(answer),
            _ => {
                self.sender = None;
                None
            }
        }
    }

    /// Sends one request of `load`; returns its status (0 when none came in time, and
    /// then the connection is dropped).
    async fn send(&mut self, load: &Load, rng: &mut StdRng) -> u16 {
        let request = self.request(&load.work, rng);
        match tokio::time::timeout(load.timeout, self.exchange(request)).await {
            Ok(Some(status)) => status,
            _ => {
                self.sender = None;
                0
            }
        }
    }

    fn request(&self, work: &Work, rng: &mut StdRng) -> Request<Full<Bytes>> {
        let builder = Request::builder()
            .uri(self.path.as_str())
            .header(header::HOST, self.authority.as_str());
        let request = match work {
            Work::Order { skus, quantity, .. } => {
                let (key, body) = order(skus, *quantity, rng);
                self.post_json(builder, key, body)
            }
            Work::Cart { hot, skus } => {
                let side = &skus[rng.random_range(0..skus.len())];
                let body = format!(
                    r#"{{"lines":[{{"sku":"{hot}","quantity":1}},{{"sku":"{side}","quantity":1}}]}}"#
                );
                self.post_json(builder, uuid::Uuid::new_v4().simple().to_string(), body)
            }
            Work::Confirm { paths, next } => {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let builder = builder
                    .uri(paths[i % paths.len()].as_str())
                    .method(Method::POST);
                self.authorised(builder).body(Full::default())
            }
            Work::Page { paths } => builder
                .uri(paths[rng.random_range(0..paths.len())].as_str())
                .method(Method::GET)
                .body(Full::default()),
        };
        request.expect("bench requests are well formed")
    }

    /// A POST of `body` as JSON under the fresh `key`, with the API key.
    fn post_json(
        &self,
        builder: hyper::http::request::Builder,
        key: String,
        body: String,
    ) -> Result<Request<Full<Bytes>>, hyper::http::Error> {
        let builder = builder
            .method(Method::POST)
            .header("idempotency-key", key)
            .header(header::CONTENT_TYPE, "application/json");
        self.authorised(builder).body(Full::new(Bytes::from(body)))
    }

    /// `builder` with the API key, when the bench has one.
    fn authorised(&self, builder: hyper::http::request::Builder) -> hyper::http::request::Builder {
        match &self.bearer {
            Some(bearer) => builder.header(header::AUTHORIZATION, bearer.clone()),
            None => builder,
        }
    }

    /// Opens the connection unless it is open; one the server closed while it was idle
    /// (after its keep-alive timeout: the open loop's connections wait between requests)
    /// is opened again.
    pub(super) async fn open(&mut self) {
        if self.sender.as_ref().is_some_and(|s| s.is_closed()) {
            self.sender = None;
        }
        if self.sender.is_none() {
            self.sender = connect(&self.authority).await;
        }
    }

    /// The status of `request`'s answer, its body read to the end; `None` when the
    /// connection failed (the caller drops it).
    async fn exchange(&mut self, request: Request<Full<Bytes>>) -> Option<u16> {
        let sender = self.ready().await?;
        let response = sender.send_request(request).await.ok()?;
        let status = response.status().as_u16();
        response.into_body().collect().await.ok()?;
        Some(status)
    }

    /// `request`'s answer: its head, and its body read to the end.
    async fn answer(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Option<(hyper::http::response::Parts, Bytes)> {
        let sender = self.ready().await?;
        let (head, body) = sender.send_request(request).await.ok()?.into_parts();
        Some((head, body.collect().await.ok()?.to_bytes()))
    }

    /// The connection, open and ready for a request; `None` when it cannot be opened.
    async fn ready(&mut self) -> Option<&mut SendRequest<Full<Bytes>>> {
        self.open().await;
        let sender = self.sender.as_mut()?;
        if sender.ready().await.is_err() {
            // Closed by the server as it became ready (nothing was sent yet): once more.
            self.sender = connect(&self.authority).await;
            self.sender.as_mut()?.ready().await.ok()?;
        }
        self.sender.as_mut()
    }
}

/// Opens an HTTP/1.1 connection to `authority`; its I/O runs as a task of its own.
async fn connect(authority: &str) -> Option<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(authority).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// How a loop sends: each connection's next request as soon as its last is answered
/// (closed), or on a fixed schedule whatever the servers do (open).
#[derive(Debug, Clone, Copy)]
pub enum Schedule {
    Closed,
    /// `rate` requests a second in all.
    Open {
        rate: f64,
    },
}

/// A loop's keep-alive connections, spread over the servers and kept between its phases:
/// its warm-up opens them and its measurement reuses them, as wrk and wrk2 open theirs
/// before they start the clock.
pub struct Connections(Vec<Connection>);

impl Connections {
    pub fn new(load: &Load, connections: usize) -> Self {
        let connections = (0..connections.max(1))
            .map(|i| Connection::new(load, &load.targets[i % load.targets.len()]))
            .collect();
        Self(connections)
    }

    /// One phase of `duration` on every connection (each opened first, so no handshake is
    /// measured); `seed` varies the SKUs picked between phases.
    pub async fn run(
        &mut self,
        load: &Load,
        schedule: Schedule,
        duration: Duration,
        seed: u64,
        live: Arc<Live>,
    ) -> Measured {
        let mut connections = std::mem::take(&mut self.0);
        futures_util::future::join_all(connections.iter_mut().map(Connection::open)).await;
        let (connections, measured) = match schedule {
            Schedule::Closed => closed(load, connections, duration, seed, live).await,
            Schedule::Open { rate } => open(load, connections, rate, duration, seed, live).await,
        };
        self.0 = connections;
        measured
    }
}

/// Each connection sends its next request as soon as the last is answered, for
/// `duration`; latency counts from each send. Every record is made before the clock
/// starts, so no allocation is measured.
async fn closed(
    load: &Load,
    connections: Vec<Connection>,
    duration: Duration,
    seed: u64,
    live: Arc<Live>,
) -> (Vec<Connection>, Measured) {
    let records: Vec<Measured> = connections.iter().map(|_| Measured::empty()).collect();
    let started = Instant::now();
    let deadline = started + duration;
    let loops: Vec<_> = connections
        .into_iter()
        .zip(records)
        .enumerate()
        .map(|(i, (mut connection, mut measured))| {
            let (load, live) = (load.clone(), live.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64((seed << 32) | i as u64);
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    let status = connection.send(&load, &mut rng).await;
                    measured.record(status, sent.elapsed());
                    live.answers.fetch_add(1, Ordering::Relaxed);
                }
                (connection, measured)
            })
        })
        .collect();
    let mut kept = Vec::new();
    let mut all = Measured::empty();
    for task in loops {
        if let Ok((connection, measured)) = task.await {
            all.merge(&measured);
            kept.push(connection);
        }
    }
    all.seconds = started.elapsed().as_secs_f64();
    (kept, all)
}

/// Requests at `rate` for `duration`, as wrk2 and `pgbench --rate` schedule them:
/// request `i` is due at `i / rate` seconds, on connection `i mod n`; it is sent when
/// due, or as soon as that connection's previous answer came if that was later, and its
/// latency counts from when it was due (so neither a queue nor a slow answer can hide).
/// Enough connections that each one's next request is due after most answers have come,
/// or the schedule of one connection would wait on its own answers.
async fn open(
    load: &Load,
    connections: Vec<Connection>,
    rate: f64,
    duration: Duration,
    seed: u64,
    live: Arc<Live>,
) -> (Vec<Connection>, Measured) {
    let n = connections.len() as u64;
    // One record for all connections, made before the schedule starts: a histogram per
    // connection would be hundreds of allocations at the start of every phase, enough CPU
    // on a small machine to make the first requests late.
    let measured = Arc::new(Mutex::new(Measured::empty()));
    let started = Instant::now();
    let loops: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(i, mut connection)| {
            let (load, live, measured) = (load.clone(), live.clone(), measured.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64((seed << 32) | i as u64);
                // Request j (of all connections) is due at j / rate.
                let due = |j: u64| Duration::from_secs_f64(j as f64 / rate);
                let mut j = i as u64;
                while due(j) < duration {
                    let due = started + due(j);
                    tokio::time::sleep_until(due.into()).await;
                    let status = connection.send(&load, &mut rng).await;
                    let took = due.elapsed();
                    measured
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .record(status, took);
                    live.answers.fetch_add(1, Ordering::Relaxed);
                    j += n;
                }
                connection
            })
        })
        .collect();
    let mut kept = Vec::new();
    for task in loops {
        if let Ok(connection) = task.await {
            kept.push(connection);
        }
    }
    // Every task has ended, so this is the last reference.
    let mut all = Arc::into_inner(measured)
        .expect("every connection's task has ended")
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    // The send window, not the time the last answers took to come back.
    all.seconds = duration.as_secs_f64();
    (kept, all)
}
