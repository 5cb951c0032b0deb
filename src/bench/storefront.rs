//! The `storefront` workload: shoppers in a hot drop, through the shop's own pages and forms
//! as a browser sends them, with cookies and CSRF tokens; measured in completed checkouts.
//!
//! Each virtual shopper keeps one keep-alive connection (as a browser keeps one to the
//! shop), and starts every checkout with no cookies: the product page gives it a CSRF
//! cookie, adding to the cart a cart cookie, and each form it posts carries the values the
//! page before it showed (the token, the checkout's idempotency key and lines), with the
//! `Origin` a browser sends. A checkout is six requests, each sent when the answer before
//! it came (no think time):
//!
//! 1. `product`: `GET /products/{sku}` → 200, the add-to-cart form;
//! 2. `add-to-cart`: `POST /cart/add` → 303 to `/cart`, with the cart cookie;
//! 3. `cart`: `GET /cart` → 200, the "Checkout" form;
//! 4. `checkout`: `POST /checkout` → 303 to `/checkout/{hold}`: a hold of one unit;
//! 5. `checkout-page`: `GET /checkout/{hold}` → 200, the "Place order" form;
//! 6. `place-order`: `POST /checkout/{hold}/confirm`, a name, an email and an address → 303 to
//!    `/orders/{id}`: the checkout is complete.
//!
//! A step answered with anything else ends its checkout, which counts with that status (1:
//! the right status without the form or link the next step needs; 0: no answer). Every
//! shopper buys the hot SKU, whose stock (10 million) outlasts any run, so the rate is that
//! of checkouts that sell, not diluted by sold-out pages.
//!
//! Closed loop: `--connections` shoppers, each starting its next checkout when its last
//! ended. Open loop: checkouts due at a fixed rate, checkout *i* on shopper *i* mod *n*, as
//! [`super::load`] schedules requests; the first step's latency counts from when its
//! checkout was due, every later step's from when the answer before it came (when the
//! shopper clicks), and a checkout's from when it was due.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderMap};
use hyper::{Method, Request};
use sqlx::PgPool;

use super::db::per_request;
use super::load::{Connection, Live, Measured};
use super::phases::Phases;
use super::rows::{Row, Step};
use super::{Bench, HOT_SKU, OPEN_LOOP_CONNECTIONS, Workload};

/// The steps of a checkout, in order, with the status each should answer.
pub const STEPS: [(&str, u16); 6] = [
    ("product", 200),
    ("add-to-cart", 303),
    ("cart", 200),
    ("checkout", 303),
    ("checkout-page", 200),
    ("place-order", 303),
];

/// What a checkout ends with when a step's answer has the right status but not the form or
/// link the next step needs.
const NOT_AS_EXPECTED: u16 = 1;

/// How long a step may take before it counts as unanswered (as every workload's requests).
const TIMEOUT: Duration = Duration::from_secs(10);

/// The storefront under one strategy: a warm-up and the closed loop, then a warm-up and the
/// open loop at 80 % of the closed loop's rate (none when no checkout completed). Returns
/// the rows and the checkouts begun in every phase (the server's whole run, over which
/// commits are counted).
pub(super) async fn measure(
    bench: &Bench<'_>,
    admin: &PgPool,
    targets: &[String],
    strategy: &str,
) -> (Row, Option<Row>, u64) {
    let plan = bench.plan;
    let label = format!("storefront · {strategy}");
    let closed = phases(bench, admin, targets, plan.connections, None, label).await;
    let closed_row = closed.row(strategy, None);
    let mut checkouts = closed.checkouts();
    let rate = 0.8 * closed_row.rate;
    if rate <= 0.0 {
        return (closed_row, None, checkouts);
    }
    let label = format!("storefront · {strategy} · open loop {rate:.0}/s");
    let open = phases(
        bench,
        admin,
        targets,
        OPEN_LOOP_CONNECTIONS,
        Some(rate),
        label,
    )
    .await;
    checkouts += open.checkouts();
    (closed_row, Some(open.row(strategy, Some(rate))), checkouts)
}

/// A warm-up, then the measured phase, on `shoppers` shoppers kept from one to the other
/// (closed loop, or open at `rate` checkouts/s); the WAL written during the measured phase.
async fn phases(
    bench: &Bench<'_>,
    admin: &PgPool,
    targets: &[String],
    shoppers: usize,
    rate: Option<f64>,
    label: String,
) -> Phases<Shopped> {
    let mut shoppers: Vec<Shopper> = (0..shoppers.max(1))
        .map(|i| Shopper::new(&targets[i % targets.len()]))
        .collect();
    bench
        .warm_then_measure(admin, label, async |duration, _, live| {
            run(&mut shoppers, rate, duration, live).await
        })
        .await
}

impl Phases<Shopped> {
    fn checkouts(&self) -> u64 {
        self.warm.checkouts.requests() + self.measured.checkouts.requests()
    }

    /// The measured phase's row: completed checkouts/s, the whole checkout's latency, and
    /// each step's (`rate`: the open loop's, `None` for closed).
    fn row(&self, strategy: &str, rate: Option<f64>) -> Row {
        let mode = if rate.is_some() { "open" } else { "closed" };
        let m = &self.measured;
        let mut row = Row::of(Workload::Storefront, strategy, mode, rate, &m.checkouts);
        row.wal_per_request = per_request(self.wal, m.checkouts.requests());
        row.steps = STEPS
            .iter()
            .zip(&m.steps)
            .map(|(&(name, expected), measured)| Step::of(name, expected, measured))
            .collect();
        row
    }
}

/// What one phase of shoppers measured: whole checkouts (by the status of the last step
/// each reached: 303 is a completed one), and each step of [`STEPS`].
pub(super) struct Shopped {
    pub checkouts: Measured,
    pub steps: Vec<Measured>,
}

impl Default for Shopped {
    fn default() -> Self {
        Self {
            checkouts: Measured::empty(),
            steps: STEPS.iter().map(|_| Measured::empty()).collect(),
        }
    }
}

/// Checkouts for `duration`: back to back on every shopper (`rate` `None`), or due at
/// `rate` a second. Every shopper's connection is opened first, so no handshake is timed.
async fn run(
    kept: &mut Vec<Shopper>,
    rate: Option<f64>,
    duration: Duration,
    live: Arc<Live>,
) -> Shopped {
    let mut shoppers = std::mem::take(kept);
    futures_util::future::join_all(shoppers.iter_mut().map(|s| s.connection.open())).await;
    let n = shoppers.len() as u64;
    // One record for all shoppers, made before the clock starts (seven histograms per
    // shopper would be thousands of allocations at the start of an open loop).
    let shopped = Arc::new(Mutex::new(Shopped::default()));
    let started = Instant::now();
    let loops: Vec<_> = shoppers
        .into_iter()
        .enumerate()
        .map(|(i, mut shopper)| {
            let (shopped, live) = (shopped.clone(), live.clone());
            tokio::spawn(async move {
                match rate {
                    None => {
                        while started.elapsed() < duration {
                            shopper.checkout(&shopped, &live, Instant::now()).await;
                        }
                    }
                    Some(rate) => {
                        // Checkout j (of all shoppers) is due at j / rate.
                        let due = |j: u64| Duration::from_secs_f64(j as f64 / rate);
                        let mut j = i as u64;
                        while due(j) < duration {
                            let due = started + due(j);
                            tokio::time::sleep_until(due.into()).await;
                            shopper.checkout(&shopped, &live, due).await;
                            j += n;
                        }
                    }
                }
                shopper
            })
        })
        .collect();
    for task in loops {
        if let Ok(shopper) = task.await {
            kept.push(shopper);
        }
    }
    let mut all = Arc::into_inner(shopped)
        .expect("every shopper's task has ended")
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    all.checkouts.seconds = match rate {
        // The schedule's window, not the time the last checkouts took to end.
        Some(_) => duration.as_secs_f64(),
        None => started.elapsed().as_secs_f64(),
    };
    all
}

/// One virtual shopper: a keep-alive connection, and the cookies of its current checkout.
struct Shopper {
    connection: Connection,
    /// `Origin` of its forms: the shop's own, as a browser sends it.
    origin: String,
    /// Cookies the shop set in this checkout, `(name, value)`.
    cookies: Vec<(String, String)>,
    checkouts: u64,
}

/// A step's answer: where it redirects, and its page.
struct Answer {
    location: String,
    body: String,
}

impl Shopper {
    fn new(base: &str) -> Self {
        let url = reqwest::Url::parse(base).expect("bench targets are valid URLs");
        let connection = Connection::to(&url);
        let origin = format!("http://{}", connection.authority());
        Self {
            connection,
            origin,
            cookies: Vec::new(),
            checkouts: 0,
        }
    }

    /// One checkout from a browser with no cookies, begun at `due`; records it with the
    /// status of the last step it reached, and each step.
    async fn checkout(&mut self, shopped: &Mutex<Shopped>, live: &Live, due: Instant) {
        self.cookies.clear();
        self.checkouts += 1;
        let status = match self.steps(shopped, live, due).await {
            Ok(()) => STEPS[STEPS.len() - 1].1,
            Err(status) => status,
        };
        lock(shopped).checkouts.record(status, due.elapsed());
    }

    /// The six steps; `Err` with the status of the one that went wrong.
    async fn steps(
        &mut self,
        shopped: &Mutex<Shopped>,
        live: &Live,
        due: Instant,
    ) -> Result<(), u16> {
        let product = format!("/products/{HOT_SKU}");
        let page = self
            .step(shopped, live, 0, Some(due), get(&product))
            .await?;
        let csrf = hidden(&page.body, "csrf")?;
        let add = form(&[("csrf", &csrf), ("sku", HOT_SKU), ("quantity", "1")]);
        let added = self
            .step(shopped, live, 1, None, self.post("/cart/add", add))
            .await?;
        if added.location != "/cart" {
            return Err(NOT_AS_EXPECTED);
        }
        let cart = self.step(shopped, live, 2, None, get("/cart")).await?;
        let start = form(&[
            ("csrf", &hidden(&cart.body, "csrf")?),
            ("key", &hidden(&cart.body, "key")?),
            ("lines", &hidden(&cart.body, "lines")?),
        ]);
        let held = self
            .step(shopped, live, 3, None, self.post("/checkout", start))
            .await?;
        if !held.location.starts_with("/checkout/") {
            return Err(NOT_AS_EXPECTED);
        }
        let page = self
            .step(shopped, live, 4, None, get(&held.location))
            .await?;
        let confirm = format!("{}/confirm", held.location);
        if !page.body.contains(&format!(r#"action="{confirm}""#)) {
            return Err(NOT_AS_EXPECTED);
        }
        let email = format!("shopper-{}@example.com", self.checkouts);
        let details = form(&[
            ("csrf", &hidden(&page.body, "csrf")?),
            ("name", "Bench Shopper"),
            ("email", &email),
            ("line1", "1 Bench Street"),
            ("city", "Benchford"),
            ("postal_code", "BE1 1NC"),
            ("country", "GB"),
        ]);
        let placed = self
            .step(shopped, live, 5, None, self.post(&confirm, details))
            .await?;
        if !placed.location.starts_with("/orders/") {
            return Err(NOT_AS_EXPECTED);
        }
        Ok(())
    }

    /// Sends step `step`'s request with this checkout's cookies, keeps the cookies its
    /// answer sets, and records its latency from `since` (or from now); `Err` with its
    /// status unless that is the step's own.
    async fn step(
        &mut self,
        shopped: &Mutex<Shopped>,
        live: &Live,
        step: usize,
        since: Option<Instant>,
        (request, body): (hyper::http::request::Builder, Bytes),
    ) -> Result<Answer, u16> {
        let mut request = request.header(header::HOST, self.connection.authority());
        if !self.cookies.is_empty() {
            request = request.header(header::COOKIE, self.cookie_header());
        }
        let request = request
            .body(Full::new(body))
            .expect("storefront requests are well formed");
        let sent = since.unwrap_or_else(Instant::now);
        let mut answer = self.connection.fetch(request, TIMEOUT).await;
        // A refused form is answered on a page of its own (Post/Redirect/Get), which a
        // browser then loads: the step's answer is that page's.
        if let Some((head, shown)) = answer
            .as_ref()
            .and_then(|(head, _)| Some((head, shown_at(head)?)))
        {
            self.keep_cookies(&head.headers);
            let (request, body) = get(&shown);
            let request = request
                .header(header::HOST, self.connection.authority())
                .header(header::COOKIE, self.cookie_header())
                .body(Full::new(body))
                .expect("storefront requests are well formed");
            answer = self.connection.fetch(request, TIMEOUT).await;
        }
        let took = sent.elapsed();
        let status = answer.as_ref().map_or(0, |(head, _)| head.status.as_u16());
        lock(shopped).steps[step].record(status, took);
        live.answers.fetch_add(1, Ordering::Relaxed);
        let (head, body) = answer.ok_or(0u16)?;
        if status != STEPS[step].1 {
            return Err(status);
        }
        self.keep_cookies(&head.headers);
        let location = head
            .headers
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = String::from_utf8(body.to_vec()).map_err(|_| NOT_AS_EXPECTED)?;
        Ok(Answer { location, body })
    }

    /// The `Cookie` header of this checkout's cookies.
    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// A form POST of `body` as a browser sends it from this shop's page.
    fn post(&self, path: &str, body: String) -> (hyper::http::request::Builder, Bytes) {
        let request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ORIGIN, self.origin.as_str())
            .header("sec-fetch-site", "same-origin");
        (request, Bytes::from(body))
    }

    /// Keeps the cookies `headers` set; one set empty or with `Max-Age=0` is removed.
    fn keep_cookies(&mut self, headers: &HeaderMap) {
        for value in headers.get_all(header::SET_COOKIE) {
            let Some((name, rest)) = value.to_str().ok().and_then(|v| v.split_once('=')) else {
                continue;
            };
            let mut attributes = rest.split(';');
            let value = attributes.next().unwrap_or_default().trim();
            let removed =
                value.is_empty() || attributes.any(|a| a.trim().eq_ignore_ascii_case("max-age=0"));
            let name = name.trim();
            self.cookies.retain(|(n, _)| n != name);
            if !removed {
                self.cookies.push((name.to_string(), value.to_string()));
            }
        }
    }
}

fn lock(shopped: &Mutex<Shopped>) -> std::sync::MutexGuard<'_, Shopped> {
    shopped.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A GET of `path`.
fn get(path: &str) -> (hyper::http::request::Builder, Bytes) {
    let request = Request::builder().method(Method::GET).uri(path);
    (request, Bytes::new())
}

/// The value of the hidden field `name` in `page` (the first of that name), as the
/// templates write it: `name="…" value="…"`.
fn hidden(page: &str, name: &str) -> Result<String, u16> {
    let marker = format!(r#"name="{name}" value=""#);
    let start = page.find(&marker).ok_or(NOT_AS_EXPECTED)? + marker.len();
    let len = page[start..].find('"').ok_or(NOT_AS_EXPECTED)?;
    Ok(page[start..start + len].replace("&amp;", "&"))
}

/// `application/x-www-form-urlencoded`, every byte but the unreserved ones escaped.
fn form(pairs: &[(&str, &str)]) -> String {
    let escape = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Where a form's answer was put to be shown, when it was (`/shown/…`).
fn shown_at(head: &hyper::http::response::Parts) -> Option<String> {
    let location = head.headers.get(header::LOCATION)?.to_str().ok()?;
    (head.status == hyper::StatusCode::SEE_OTHER && location.starts_with("/shown/"))
        .then(|| location.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_are_encoded_and_hidden_fields_read_as_a_browser_would() {
        assert_eq!(
            form(&[("email", "a b@example.com"), ("lines", "BENCH-HOT~1|X~2")]),
            "email=a%20b%40example.com&lines=BENCH-HOT~1%7CX~2"
        );
        let page =
            r#"<input type="hidden" name="csrf" value="ab12"><input name="key" value="k&amp;1">"#;
        assert_eq!(hidden(page, "csrf"), Ok("ab12".into()));
        assert_eq!(hidden(page, "key"), Ok("k&1".into()));
        assert_eq!(hidden(page, "lines"), Err(NOT_AS_EXPECTED));
    }

    #[test]
    fn cookies_set_are_kept_and_removals_remove_them() {
        let mut shopper = Shopper::new("http://127.0.0.1:1");
        let mut headers = HeaderMap::new();
        headers.append(
            header::SET_COOKIE,
            "csrf=abc; Path=/; HttpOnly".parse().unwrap(),
        );
        headers.append(
            header::SET_COOKIE,
            "cart=BENCH-HOT~1; Path=/".parse().unwrap(),
        );
        shopper.keep_cookies(&headers);
        assert_eq!(shopper.cookie_header(), "csrf=abc; cart=BENCH-HOT~1");
        let mut headers = HeaderMap::new();
        headers.append(
            header::SET_COOKIE,
            "cart=; Path=/; Max-Age=0; Expires=Thu, 01 Jan 1970 00:00:00 GMT"
                .parse()
                .unwrap(),
        );
        shopper.keep_cookies(&headers);
        assert_eq!(shopper.cookie_header(), "csrf=abc");
    }
}
