//! A flash sale driven through faults: buyers arrive one after another, each with its own
//! idempotency key, and retry that key (on the next server) until they get a definite
//! answer, as a careful client would. Every answer is kept, so a test can check that each
//! key got one answer, that every answer came within the budget, and that the database
//! agrees with what the buyers were told.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use crate::helpers::TestApp;

/// One response (or its absence) to one attempt.
#[derive(Debug, Clone)]
pub struct Answer {
    /// `None`: no answer within the client's timeout, or the connection failed.
    pub status: Option<u16>,
    /// The order id of a 201.
    pub order: Option<String>,
    /// A 409 that decided "not enough stock" (rather than "still in flight").
    pub short: bool,
    pub retry_after: Option<u64>,
    pub latency: Duration,
    /// Which of the sale's targets answered.
    pub target: usize,
    /// When the answer (or the failure) arrived.
    pub at: Instant,
}

impl Answer {
    /// An answer a client may act on: the order exists, or it never will.
    pub fn is_definite(&self) -> bool {
        self.status == Some(201) || self.short
    }
}

/// Every answer one key got, in order.
#[derive(Debug, Clone)]
pub struct KeyLog {
    pub key: String,
    pub answers: Vec<Answer>,
}

/// How a sale of [`SKU`], one unit per buyer, is run.
pub struct Sale<'a> {
    pub targets: &'a [String],
    pub buyers: usize,
    /// Time between two buyers' arrivals.
    pub pace: Duration,
    /// A buyer stops retrying after this.
    pub give_up: Duration,
    /// The client's timeout per attempt.
    pub timeout: Duration,
}

impl Sale<'_> {
    pub async fn run(&self) -> SaleReport {
        let client = reqwest::Client::builder()
            .timeout(self.timeout)
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let logs = join_all((0..self.buyers).map(|i| {
            let client = client.clone();
            async move {
                tokio::time::sleep(self.pace * i as u32).await;
                let key = format!("buyer-{i}-{}", uuid::Uuid::new_v4().simple());
                let started = Instant::now();
                let mut answers = Vec::new();
                for attempt in 0.. {
                    let target = (i + attempt) % self.targets.len();
                    let mut answer = attempt_order(&client, &self.targets[target], &key).await;
                    answer.target = target;
                    let pause = answer
                        .retry_after
                        .map_or(Duration::from_millis(100), |_| Duration::from_millis(200));
                    let done = answer.is_definite();
                    answers.push(answer);
                    if done || started.elapsed() > self.give_up {
                        break;
                    }
                    tokio::time::sleep(pause).await;
                }
                KeyLog { key, answers }
            }
        }))
        .await;
        SaleReport { logs }
    }
}

async fn attempt_order(client: &reqwest::Client, base: &str, key: &str) -> Answer {
    let started = Instant::now();
    let sent = client
        .post(format!("{base}/api/v1/orders"))
        .header("Idempotency-Key", key)
        .json(&serde_json::json!({"lines": [{"sku": SKU, "quantity": 1}]}))
        .send()
        .await;
    let Ok(res) = sent else {
        return Answer {
            status: None,
            order: None,
            short: false,
            retry_after: None,
            latency: started.elapsed(),
            target: 0,
            at: Instant::now(),
        };
    };
    let status = res.status().as_u16();
    let retry_after = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let body: serde_json::Value = res.json().await.unwrap_or_default();
    Answer {
        status: Some(status),
        order: body["id"].as_str().map(str::to_string),
        short: status == 409 && body.get("shortages").is_some(),
        retry_after,
        latency: started.elapsed(),
        target: 0,
        at: Instant::now(),
    }
}

/// What a sale's buyers were told.
pub struct SaleReport {
    pub logs: Vec<KeyLog>,
}

impl SaleReport {
    /// Keys with their order id, for keys told 201.
    pub fn placed(&self) -> BTreeMap<&str, &str> {
        self.logs
            .iter()
            .filter_map(|log| {
                let order = log.answers.iter().find_map(|a| a.order.as_deref())?;
                Some((log.key.as_str(), order))
            })
            .collect()
    }

    /// The slowest answer (or give-up of the client) of the whole sale.
    pub fn worst_latency(&self) -> Duration {
        self.answers().map(|a| a.latency).max().unwrap_or_default()
    }

    pub fn answers(&self) -> impl Iterator<Item = &Answer> {
        self.logs.iter().flat_map(|l| &l.answers)
    }

    /// How many attempts got each status (`None` as 0).
    pub fn statuses(&self) -> BTreeMap<u16, usize> {
        let mut counts = BTreeMap::new();
        for answer in self.answers() {
            *counts.entry(answer.status.unwrap_or(0)).or_default() += 1;
        }
        counts
    }

    /// Each key got one answer: its definite answers agree (one order id, never both an
    /// order and "not enough stock"); nothing but 201, 409 and 503 was ever said; every
    /// 409 in flight and every 503 said when to retry; and every key was decided.
    pub fn assert_one_answer_per_key(&self) {
        for log in &self.logs {
            let mut orders: Vec<&str> = log
                .answers
                .iter()
                .filter_map(|a| a.order.as_deref())
                .collect();
            orders.dedup();
            let short = log.answers.iter().any(|a| a.short);
            assert!(
                orders.len() <= 1 && (orders.is_empty() || !short),
                "key {} got contradicting answers: {:?}",
                log.key,
                log.answers
            );
            for answer in &log.answers {
                match answer.status {
                    Some(201) | None => {}
                    Some(409 | 503) => assert!(
                        answer.short || answer.retry_after.is_some(),
                        "key {}: a {} without Retry-After: {answer:?}",
                        log.key,
                        answer.status.unwrap()
                    ),
                    Some(other) => panic!("key {}: answered {other}: {:?}", log.key, log.answers),
                }
            }
            assert!(
                log.answers.last().is_some_and(Answer::is_definite),
                "key {} was never decided: {:?}",
                log.key,
                log.answers
            );
        }
    }

    /// The database holds exactly the orders the buyers were told about, and its stock
    /// and ledger agree with them.
    pub async fn assert_matches(&self, app: &TestApp, initial: i32) {
        let placed = self.placed();
        let in_db: Vec<(String, String)> =
            // Anonymous API keys are stored in the anonymous caller's key space.
            sqlx::query!(r#"select substr(idempotency_key, 6) as "key!", id::text as "id!" from orders"#)
                .fetch_all(&app.db)
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.key, r.id))
                .collect();
        let in_db: BTreeMap<&str, &str> = in_db
            .iter()
            .map(|(k, id)| (k.as_str(), id.as_str()))
            .collect();
        assert_eq!(
            placed, in_db,
            "every order told 201 exists, and no other was made"
        );
        let sold: i64 = app
            .count("select coalesce(sum(quantity), 0)::bigint from order_lines")
            .await;
        let (on_hand, _) = app.stock(SKU).await;
        assert_eq!(
            i64::from(on_hand) + sold,
            i64::from(initial),
            "stock adds up"
        );
        app.assert_invariants().await;
    }
}

/// The one product every sale sells.
pub const SKU: &str = "DROP-1";
