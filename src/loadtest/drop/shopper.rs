//! One shopper in a drop's waiting room, through the API as a client would go: join at
//! their moment, poll the ticket as often as `Retry-After` says (or, misbehaving, far more
//! often), and once let in, order one unit with the pass. The misbehaving ones also try
//! what the waiting room must refuse.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::super::run::{Answer, LogEntry, send};

/// How a shopper behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Conduct {
    /// Joins once, polls as told, buys when let in.
    Fair,
    /// Joins three times at once and once more later (must keep one place).
    JoinsMany,
    /// Tries to order before being let in, without a pass (must be refused).
    NoPass,
    /// Tries to order with a pass another shopper was given (must be refused).
    BorrowsPass,
    /// Polls every 100 ms whatever `Retry-After` says (must gain nothing).
    PollsFast,
}

impl Conduct {
    /// The `i`-th misbehaving shopper's conduct: the four in turn.
    pub fn misbehaving(i: u64) -> Self {
        [
            Self::JoinsMany,
            Self::NoPass,
            Self::BorrowsPass,
            Self::PollsFast,
        ][(i % 4) as usize]
    }
}

/// What a shopper saw.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub index: u64,
    pub conduct: Conduct,
    /// Joined during the pre-queue (by its schedule).
    pub prequeued: bool,
    /// The join's answer hid the place: a lottery draw, made before the opening.
    pub drawn: bool,
    /// When the join was answered, ms since the opening (negative: before it).
    pub joined_ms: Option<f64>,
    pub ticket: Option<String>,
    /// Joining again gave a ticket other than the first (must never happen).
    pub second_place: bool,
    /// When a poll first answered `admitted`, ms since the opening.
    pub admitted_ms: Option<f64>,
    /// The last state seen: `admitted`, `closed`, `expired`, `waiting` (gave up at the
    /// run's end), or why joining failed (`join-<status>`).
    pub last_state: String,
    pub polls: u64,
    /// The order placed with its own pass: status and latency.
    pub order_status: Option<u16>,
    pub order_ms: Option<f64>,
    /// Orders tried without a pass or with another's, and how many were accepted (must be 0).
    pub misuse_tried: u64,
    pub misuse_accepted: u64,
}

/// What every shopper of one run shares.
pub struct Shared {
    pub client: reqwest::Client,
    pub targets: Vec<String>,
    pub drop_id: uuid::Uuid,
    pub sku: String,
    /// The shop takes payments: a shopper holds, pays by card, then confirms.
    pub pays: bool,
    pub run_id: String,
    /// The run's clock starts here; the drop opens at `opens`.
    pub started: Instant,
    pub opens: Instant,
    pub deadline: Instant,
    /// Passes shoppers were given, for the ones who borrow.
    pub passes: Mutex<Vec<String>>,
    pub log: Mutex<Vec<LogEntry>>,
    pub live: Arc<super::super::run::Live>,
}

impl Shared {
    fn ms_since_opening(&self, at: Instant) -> f64 {
        if at >= self.opens {
            at.duration_since(self.opens).as_secs_f64() * 1e3
        } else {
            -(self.opens.duration_since(at).as_secs_f64() * 1e3)
        }
    }
}

pub struct Shopper {
    pub index: u64,
    /// This shopper's own API key: one identity, one place.
    pub key: String,
    pub conduct: Conduct,
    pub prequeued: bool,
    pub join_at: Instant,
}

impl Shopper {
    fn base<'a>(&self, shared: &'a Shared) -> (usize, &'a str) {
        let i = (self.index % shared.targets.len() as u64) as usize;
        (i, &shared.targets[i])
    }

    fn queue(&self, shared: &Shared) -> String {
        format!(
            "{}/api/v1/drops/{}/queue",
            self.base(shared).1,
            shared.drop_id
        )
    }

    async fn get_json(&self, request: reqwest::RequestBuilder) -> Option<(u16, Value)> {
        let res = request.bearer_auth(&self.key).send().await.ok()?;
        let status = res.status().as_u16();
        Some((status, res.json().await.unwrap_or(Value::Null)))
    }

    /// Joins, asking again (as a careful client) after a busy or lost answer.
    async fn join(&self, shared: &Shared) -> Option<(u16, Value)> {
        let mut answer = None;
        for attempt in 0..4 {
            answer = self.get_json(shared.client.post(self.queue(shared))).await;
            if !matches!(answer, None | Some((503, _))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
        }
        answer
    }

    /// An order of one unit of the drop's product under `key`, with `pass` if any: a plain
    /// order, or (in a shop that takes payments) a hold, its payment by a card the
    /// provider authorizes, and its confirmation. The last answer and the time it all took.
    async fn order(&self, shared: &Shared, key: &str, pass: Option<&str>) -> (Answer, f64) {
        let sent = Instant::now();
        let lines = json!({ "lines": [{ "sku": shared.sku, "quantity": 1 }] });
        let answer = if shared.pays {
            self.paid_order(shared, key, pass, &lines).await
        } else {
            self.send(shared, "order", "/api/v1/orders", key, pass, &lines)
                .await
        };
        if answer.status == 201 {
            shared
                .live
                .created
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        (answer, sent.elapsed().as_secs_f64() * 1e3)
    }

    /// A hold under `key` with `pass`, paid for, then confirmed with `pass`; the first
    /// answer that did not go on.
    async fn paid_order(
        &self,
        shared: &Shared,
        key: &str,
        pass: Option<&str>,
        lines: &Value,
    ) -> Answer {
        let hold = self
            .send(shared, "hold", "/api/v1/holds", key, pass, lines)
            .await;
        let Some(id) = hold.id.clone().filter(|_| hold.status == 201) else {
            return hold;
        };
        let card = json!({ "payment_method": "pm_card_visa" });
        let paid = self
            .send(
                shared,
                "pay",
                &format!("/api/v1/holds/{id}/payment"),
                &id,
                None,
                &card,
            )
            .await;
        if paid.outcome != "paid" {
            return paid;
        }
        let confirm = format!("/api/v1/holds/{id}/confirm");
        self.send(shared, "confirm", &confirm, &id, pass, &json!({}))
            .await
    }

    /// POSTs `body` to `path` under `key`, with `pass` if any; logged for the checker (a
    /// refused order must have left no order: I5).
    async fn send(
        &self,
        shared: &Shared,
        kind: &str,
        path: &str,
        key: &str,
        pass: Option<&str>,
        body: &Value,
    ) -> Answer {
        let (target, base) = self.base(shared);
        let mut request = shared
            .client
            .post(format!("{base}{path}"))
            .bearer_auth(&self.key)
            .header("Idempotency-Key", key)
            .json(body);
        if let Some(pass) = pass {
            request = request.header("Drop-Pass", pass);
        }
        let sent = Instant::now();
        let answer = send(request).await;
        shared
            .live
            .requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shared.log.lock().expect("log lock").push(LogEntry {
            at_ms: sent.duration_since(shared.started).as_secs_f64() * 1e3,
            buyer: self.index,
            behaviour: serde_json::to_value(self.conduct)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            kind: kind.into(),
            key: key.to_string(),
            status: answer.status,
            outcome: answer.outcome.to_string(),
            id: answer.id.clone(),
            latency_ms: sent.elapsed().as_secs_f64() * 1e3,
            target,
        });
        answer
    }

    /// Tries an order the drop must refuse; counts it.
    async fn misuse(&self, shared: &Shared, outcome: &mut Outcome, what: &str, pass: &str) {
        let key = format!("{}-{}-{what}", shared.run_id, self.index);
        let pass = Some(pass).filter(|p| !p.is_empty());
        let (answer, _) = self.order(shared, &key, pass).await;
        outcome.misuse_tried += 1;
        if answer.status == 201 {
            outcome.misuse_accepted += 1;
        }
    }

    pub async fn run(self, shared: Arc<Shared>) -> Outcome {
        let mut outcome = Outcome {
            index: self.index,
            conduct: self.conduct,
            prequeued: self.prequeued,
            drawn: false,
            joined_ms: None,
            ticket: None,
            second_place: false,
            admitted_ms: None,
            last_state: "not-joined".into(),
            polls: 0,
            order_status: None,
            order_ms: None,
            misuse_tried: 0,
            misuse_accepted: 0,
        };
        tokio::time::sleep_until(self.join_at.into()).await;
        let joins = if self.conduct == Conduct::JoinsMany {
            3
        } else {
            1
        };
        let answers = futures_util::future::join_all((0..joins).map(|_| self.join(&shared))).await;
        let joined_at = Instant::now();
        let mut tickets = Vec::new();
        for answer in &answers {
            match answer {
                Some((201, body)) => {
                    tickets.extend(body["ticket"].as_str().map(str::to_string));
                    outcome.drawn |= body["state"] == "waiting" && body["position"].is_null();
                }
                Some((status, _)) => outcome.last_state = format!("join-{status}"),
                None => outcome.last_state = "join-no-answer".into(),
            }
        }
        tickets.sort();
        tickets.dedup();
        outcome.second_place = tickets.len() > 1;
        let Some(ticket) = tickets.first().cloned() else {
            return outcome;
        };
        outcome.joined_ms = Some(shared.ms_since_opening(joined_at));
        outcome.ticket = Some(ticket.clone());
        outcome.last_state = "waiting".into();
        if self.conduct == Conduct::NoPass {
            self.misuse(&shared, &mut outcome, "no-pass", "").await;
        }
        let mut borrowed = false;
        let url = format!("{}/{ticket}", self.queue(&shared));
        let pass = loop {
            if Instant::now() >= shared.deadline {
                return outcome;
            }
            if self.conduct == Conduct::BorrowsPass && !borrowed {
                let theirs = shared.passes.lock().expect("passes").first().cloned();
                if let Some(theirs) = theirs {
                    borrowed = true;
                    self.misuse(&shared, &mut outcome, "borrowed", &theirs)
                        .await;
                }
            }
            let answer = self.get_json(shared.client.get(&url)).await;
            outcome.polls += 1;
            let wait = match &answer {
                Some((200, body)) => {
                    let state = body["state"].as_str().unwrap_or("unknown");
                    outcome.last_state = state.to_string();
                    match state {
                        "admitted" => match body["pass"].as_str() {
                            Some(pass) => break pass.to_string(),
                            None => 1,
                        },
                        "waiting" => body["retry_after_seconds"].as_u64().unwrap_or(2),
                        _ => return outcome,
                    }
                }
                // Unreachable queue (503) or a lost answer: ask again a little later.
                _ => 2,
            };
            if self.conduct == Conduct::JoinsMany && outcome.polls == 2 {
                // Back again, as if from a second tab: the same place, or a defect.
                if let Some((201, body)) = self.join(&shared).await {
                    outcome.second_place |= body["ticket"].as_str() != Some(ticket.as_str());
                }
            }
            let pause = if self.conduct == Conduct::PollsFast {
                Duration::from_millis(100)
            } else {
                Duration::from_secs(wait.max(1))
            };
            tokio::time::sleep(
                pause.min(shared.deadline.saturating_duration_since(Instant::now())),
            )
            .await;
        };
        outcome.admitted_ms = Some(shared.ms_since_opening(Instant::now()));
        shared.passes.lock().expect("passes").push(pass.clone());
        // As a careful client: the same key again after a busy or lost answer.
        let key = format!("{}-{}", shared.run_id, self.index);
        for attempt in 0..4 {
            let (answer, latency) = self.order(&shared, &key, Some(&pass)).await;
            outcome.order_status = Some(answer.status);
            outcome.order_ms = Some(latency);
            if !matches!(answer.outcome, "in-flight" | "busy" | "no-answer" | "error") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
        }
        outcome
    }
}
