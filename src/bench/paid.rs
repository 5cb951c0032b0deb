//! The `paid-checkout` workload: a checkout paid by card through the provider, over the
//! JSON API, measured in completed checkouts. Three requests, each sent when the answer
//! before it came:
//!
//! 1. `hold`: `POST /api/v1/holds`, one unit of the hot SKU → 201;
//! 2. `pay`: `POST /api/v1/holds/{id}/payment` with a card the provider authorizes → 200
//!    (the app makes the intent, sets the card and confirms it: three provider calls);
//! 3. `confirm`: `POST /api/v1/holds/{id}/confirm` → 201 (the order, then the capture: one
//!    provider call).
//!
//! Beside it, in the same run and from as many clients, the provider's own rate for the
//! same four calls (create, update, confirm, capture) with nothing in front of it: the
//! ceiling a paid checkout cannot pass. Each side gets a fresh localstripe, which slows as
//! its store fills (it writes the whole store after every POST), so both start empty and
//! go through the same store sizes: the provider alone is warmed with as many checkouts as
//! the app's warm-up made, then measured over as many as the app's measured run made. The
//! rows show each step's latency beside the provider's for its calls; the difference is
//! the app's own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::load::{Live, Measured};
use super::rows::{Row, Step};
use super::{Bench, HOT_SKU, Workload};
use crate::local::LocalStripe;
use crate::payments::{CallError, Stripe};

/// The app's steps, with the status each should answer.
pub const STEPS: [(&str, u16); 3] = [("hold", 201), ("pay", 200), ("confirm", 201)];

/// The provider's calls, grouped as the app's steps make them.
const PROVIDER_STEPS: [&str; 2] = ["provider: create, card, confirm", "provider: capture"];

/// Keys of the bench's own provider.
const SECRET: &str = "sk_test_bench";
const PUBLISHABLE: &str = "pk_test_bench";
const WEBHOOK_SECRET: &str = "whsec_bench";

/// How long one request may take before it counts as unanswered.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A fresh localstripe in `dir`, and the settings of servers that pay through it.
pub(super) fn provider(
    dir: &std::path::Path,
) -> anyhow::Result<(LocalStripe, Vec<(&'static str, String)>)> {
    let stripe = LocalStripe::start(dir, None, true)?;
    let env = vec![
        ("STOCKADE_PAYMENTS", "stripe".to_string()),
        ("STOCKADE_STRIPE_API_BASE", stripe.url()),
        ("STOCKADE_STRIPE_SECRET_KEY", SECRET.into()),
        ("STOCKADE_STRIPE_PUBLISHABLE_KEY", PUBLISHABLE.into()),
        ("STOCKADE_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET.into()),
    ];
    Ok((stripe, env))
}

/// What one phase measured: whole checkouts (201 when complete), and each step.
struct Paid {
    checkouts: Measured,
    steps: Vec<Measured>,
}

impl Paid {
    fn new(steps: usize) -> Self {
        Self {
            checkouts: Measured::empty(),
            steps: (0..steps).map(|_| Measured::empty()).collect(),
        }
    }
}

/// The paid checkout under one strategy against `targets`, whose provider is `stripe`:
/// the app's row (closed loop), with the provider's ceiling measured on a fresh one in
/// `dir`; and the checkouts begun.
pub(super) async fn measure(
    bench: &Bench<'_>,
    targets: &[String],
    strategy: &str,
    api_key: Option<String>,
    stripe: &LocalStripe,
    dir: &std::path::Path,
) -> anyhow::Result<(Row, u64)> {
    let plan = bench.plan;
    stripe
        .register_webhook(&format!("{}/webhooks/stripe", targets[0]), WEBHOOK_SECRET)
        .await?;
    let client = client(plan.connections, api_key.as_deref())?;
    let warmup = Duration::from_secs_f64(plan.warmup_s);
    let duration = Duration::from_secs(plan.duration_s);
    let shoppers = plan.connections.max(1);
    let app = |length: Duration, live: Arc<Live>| {
        let client = client.clone();
        loops(
            shoppers,
            Until::Elapsed(length),
            STEPS.len(),
            live,
            move |i, paid| {
                let (client, base) = (client.clone(), targets[i % targets.len()].clone());
                async move { checkout(&client, &base, &paid).await }
            },
        )
    };
    let warm = app(warmup, Arc::default()).await;
    let live = Arc::new(Live::default());
    let progress = bench.progress(
        format!("paid-checkout · {strategy}"),
        duration,
        live.clone(),
    );
    let measured = app(duration, live).await;
    progress.finish();

    // The provider alone, fresh, from as many clients, through the same store sizes (the
    // app's warm-up's checkouts, then its measured run's); its events go to the app as in
    // the run above (which answers them: none is one of its payments), so the provider
    // does the same work per checkout.
    let alone = LocalStripe::start(&dir.join("ceiling"), None, true)?;
    alone
        .register_webhook(&format!("{}/webhooks/stripe", targets[0]), WEBHOOK_SECRET)
        .await?;
    let direct = Stripe::new(&alone.url(), SECRET.into(), TIMEOUT)?;
    let provider = |count: u64, live: Arc<Live>| {
        loops(
            shoppers,
            Until::Count(count),
            PROVIDER_STEPS.len(),
            live,
            |_, paid| {
                let stripe = direct.clone();
                async move { provider_checkout(&stripe, &paid).await }
            },
        )
    };
    provider(warm.checkouts.requests(), Arc::default()).await;
    let live = Arc::new(Live::default());
    let progress = bench.progress(
        "paid-checkout · the provider alone".into(),
        duration,
        live.clone(),
    );
    let ceiling = provider(measured.checkouts.requests(), live).await;
    progress.finish();
    drop(alone);

    let mut row = Row::of(
        Workload::PaidCheckout,
        strategy,
        "closed",
        None,
        &measured.checkouts,
    );
    row.steps = STEPS
        .iter()
        .zip(&measured.steps)
        .map(|(&(name, expected), m)| Step::of(name, expected, m))
        .chain(
            PROVIDER_STEPS
                .iter()
                .zip(&ceiling.steps)
                .map(|(name, m)| Step::of(name, 200, m)),
        )
        .collect();
    let provider_rate =
        ceiling.checkouts.expected(200) as f64 / ceiling.checkouts.seconds.max(1e-9);
    row.provider_rate = Some(provider_rate);
    Ok((
        row,
        warm.checkouts.requests() + measured.checkouts.requests(),
    ))
}

fn client(connections: usize, api_key: Option<&str>) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = api_key {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(connections.max(1))
        .timeout(TIMEOUT)
        .default_headers(headers)
        .build()?)
}

/// How long [`loops`] go on.
#[derive(Clone, Copy)]
enum Until {
    /// Checkouts begin until this much time has passed.
    Elapsed(Duration),
    /// This many checkouts are made, all told.
    Count(u64),
}

/// `shoppers` loops of `one` checkout after another, `until`; what they measured.
async fn loops<F, Fut>(shoppers: usize, until: Until, steps: usize, live: Arc<Live>, one: F) -> Paid
where
    F: Fn(usize, Arc<Mutex<Paid>>) -> Fut,
    Fut: Future<Output = ()>,
{
    let paid = Arc::new(Mutex::new(Paid::new(steps)));
    let started = Instant::now();
    let begun = AtomicU64::new(0);
    let go_on = || match until {
        Until::Elapsed(length) => started.elapsed() < length,
        Until::Count(count) => begun.fetch_add(1, Ordering::Relaxed) < count,
    };
    let each = (0..shoppers).map(|i| {
        let (paid, live, one, go_on) = (paid.clone(), live.clone(), &one, &go_on);
        async move {
            while go_on() {
                one(i, paid.clone()).await;
                live.answers.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    futures_util::future::join_all(each).await;
    let mut paid = std::mem::replace(
        &mut *paid.lock().unwrap_or_else(PoisonError::into_inner),
        Paid::new(0),
    );
    let seconds = started.elapsed().as_secs_f64();
    paid.checkouts.seconds = seconds;
    for step in &mut paid.steps {
        step.seconds = seconds;
    }
    paid
}

/// Sends `request`: the status (0: no answer) and the JSON answer.
async fn post(request: reqwest::RequestBuilder) -> (u16, Value) {
    match request.send().await {
        Ok(res) => {
            let status = res.status().as_u16();
            (status, res.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// One paid checkout through the app.
async fn checkout(client: &reqwest::Client, base: &str, paid: &Mutex<Paid>) {
    let began = Instant::now();
    let key = uuid::Uuid::new_v4().to_string();
    let lines = json!({"lines": [{"sku": HOT_SKU, "quantity": 1}]});
    let steps: [&dyn Fn(&str) -> reqwest::RequestBuilder; 3] = [
        &|_| {
            client
                .post(format!("{base}/api/v1/holds"))
                .header("Idempotency-Key", key.as_str())
                .json(&lines)
        },
        &|hold| {
            client
                .post(format!("{base}/api/v1/holds/{hold}/payment"))
                .json(&json!({"payment_method": "pm_card_visa"}))
        },
        &|hold| {
            client
                .post(format!("{base}/api/v1/holds/{hold}/confirm"))
                .json(&json!({}))
        },
    ];
    let mut hold = String::new();
    for (i, (step, &(_, expected))) in steps.iter().zip(&STEPS).enumerate() {
        let sent = Instant::now();
        let (status, body) = post(step(&hold)).await;
        let mut paid = paid.lock().unwrap_or_else(PoisonError::into_inner);
        paid.steps[i].record(status, sent.elapsed());
        let authorized = i != 1 || body["status"] == "requires_capture";
        if status != expected || !authorized {
            paid.checkouts.record(status.min(1), began.elapsed());
            return;
        }
        if i == 0 {
            hold = body["id"].as_str().unwrap_or_default().to_string();
        }
        if i == STEPS.len() - 1 {
            paid.checkouts.record(201, began.elapsed());
        }
    }
}

/// The same four calls straight to the provider, with the client the app uses: create,
/// set the card, confirm, capture.
async fn provider_checkout(stripe: &Stripe, paid: &Mutex<Paid>) {
    let began = Instant::now();
    let paying = async {
        let intent = stripe
            .create_intent(uuid::Uuid::new_v4(), 0, 1000, "usd")
            .await?;
        let key = |step: &str| format!("{}-{step}", intent.id);
        stripe
            .set_method(&intent.id, "pm_card_visa", &key("method"))
            .await?;
        stripe.confirm(&intent.id, &key("confirm")).await?;
        Ok::<_, CallError>(intent.id)
    };
    let paid_for = paying.await;
    let paying = began.elapsed();
    let captured = match &paid_for {
        Ok(intent) => {
            let sent = Instant::now();
            Some((stripe.capture(intent).await.is_ok(), sent.elapsed()))
        }
        Err(_) => None,
    };
    let status = |ok: bool| if ok { 200 } else { 1 };
    let mut paid = paid.lock().unwrap_or_else(PoisonError::into_inner);
    paid.steps[0].record(status(paid_for.is_ok()), paying);
    if let Some((ok, took)) = captured {
        paid.steps[1].record(status(ok), took);
    }
    let done = captured.is_some_and(|(ok, _)| ok);
    paid.checkouts.record(status(done), began.elapsed());
}
