//! `stockade loadtest --scenario drop`: a drop through its waiting room, once per queueing
//! method. The tool schedules the drop itself (on `DATABASE_URL`), gives each shopper an
//! API key of their own (one identity, one place), and sends them in: some during the
//! pre-queue, spread over it, the rest after the opening at `--join-rate`. Each waits its
//! turn polling as the queue page does and orders one unit with its pass; a
//! `--misbehave-share` of them also join several times, order without a pass, borrow
//! another's pass, or poll ten times a second ([`shopper::Conduct`]).
//!
//! The report's `drop` section says who joined, who was let in and how fast, whether
//! anyone held two places or bought without a pass (also I8, from the database), and how
//! fair the order was ([`fairness`]): for `fifo`, Kendall's τ between arrival and
//! admission (expected 1); for a lottery, whether the pre-queue's admission order is
//! independent of when each joined (a chi-square test of deciles, with its p-value).

pub mod fairness;
mod shopper;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use futures_util::StreamExt as _;
use hdrhistogram::Histogram;
use serde::Serialize;
use sqlx::PgPool;

use self::fairness::{Concordance, Independence};
use self::shopper::{Conduct, Outcome, Shared, Shopper};
use super::LoadtestArgs;
use super::check::RedisTarget;
use super::run::{Live, Plan};
use super::summary::{Percentiles, RunResult};
use crate::drops::{NewDrop, Queueing};

/// The product the drop scenario sells.
pub const DROP_SKU: &str = "DROP-LT";

/// The drop scenario's own options (the shared ones: `--stock`, `--duration`, targets).
#[derive(Debug, Clone, Args, serde::Serialize)]
pub struct DropArgs {
    /// Drop scenario: how places are given, one run each: fifo, lottery, or both.
    #[arg(
        long = "queueing",
        value_delimiter = ',',
        default_value = "fifo,lottery"
    )]
    pub queueing: Vec<String>,
    /// Drop scenario: seconds the queue is open before the opening.
    #[arg(long, default_value_t = 5)]
    pub prequeue_seconds: u32,
    /// Drop scenario: shoppers who join during the pre-queue, spread over it.
    #[arg(long, default_value_t = 800)]
    pub prequeue_shoppers: u64,
    /// Drop scenario: shoppers who join after the opening, at --join-rate a second.
    #[arg(long, default_value_t = 200)]
    pub later_shoppers: u64,
    /// Drop scenario: later shoppers arriving per second.
    #[arg(long, default_value_t = 100.0)]
    pub join_rate: f64,
    /// Drop scenario: shoppers the drop lets in per minute.
    #[arg(long, default_value_t = 12_000)]
    pub admit_per_minute: i32,
    /// Drop scenario: how long an admission lasts, in seconds.
    #[arg(long, default_value_t = 120)]
    pub session_seconds: i32,
    /// Drop scenario: share of shoppers who misbehave (the four ways in turn).
    #[arg(long, default_value_t = 0.1)]
    pub misbehave_share: f64,
}

impl DropArgs {
    pub fn validate(&self) -> anyhow::Result<Vec<Queueing>> {
        if !(0.0..=1.0).contains(&self.misbehave_share) {
            bail!("--misbehave-share must be between 0 and 1");
        }
        if !(self.join_rate > 0.0 && self.join_rate.is_finite()) {
            bail!("--join-rate must be a positive number of shoppers per second");
        }
        if self.prequeue_shoppers > 0 && self.prequeue_seconds == 0 {
            bail!("--prequeue-shoppers needs a pre-queue: give --prequeue-seconds");
        }
        if self.prequeue_shoppers + self.later_shoppers == 0 {
            bail!("the drop needs shoppers: --prequeue-shoppers or --later-shoppers");
        }
        self.queueing
            .iter()
            .map(|q| {
                Queueing::parse(q)
                    .with_context(|| format!("--queueing takes fifo and lottery, not {q:?}"))
            })
            .collect()
    }
}

/// The report's `drop` section.
#[derive(Debug, Clone, Serialize)]
pub struct DropSection {
    pub drop_id: uuid::Uuid,
    pub queueing: Queueing,
    pub shoppers: u64,
    pub prequeued: u64,
    pub misbehaving: u64,
    pub joined: u64,
    /// Let in (by the queue in Redis, when the tool could read it; else as recorded).
    pub admitted: u64,
    /// Admissions recorded in PostgreSQL: those whose shopper came back to see the pass.
    pub recorded: u64,
    /// Identities let in more than once, or given a second place (must be 0).
    pub admitted_twice: u64,
    /// Orders of admitted shoppers with their own pass: accepted, and refused as sold out.
    pub orders: u64,
    pub sold_out: u64,
    /// Orders tried without a pass or with another's, and how many were accepted (must
    /// be 0; the database's side of it is I8).
    pub misuse_tried: u64,
    pub misuse_accepted: u64,
    /// Shoppers still waiting when the queue closed (sold out) or the run ended.
    pub never_admitted: u64,
    /// From joining (or the opening, if later) to the poll that saw the admission.
    pub time_to_admission_ms: Percentiles,
    /// The order of each admitted shopper, from its send.
    pub shop_latency_ms: Percentiles,
    /// Admissions per second, from the first to the last.
    pub admission_rate_per_s: f64,
    pub fairness: Fairness,
}

/// How fair the order of admission was.
#[derive(Debug, Clone, Serialize)]
pub struct Fairness {
    /// What the numbers are over: `fifo`: every admitted shopper, arrival against
    /// admission; `lottery`: the admitted shoppers it drew places for.
    pub over: String,
    pub n: usize,
    /// Join order against admission order: FIFO expects τ near 1 and no pair out of
    /// order (beyond joins answered within moments of each other); a lottery's pre-queue
    /// τ about 0.
    pub kendall: Option<Concordance>,
    /// A lottery's pre-queue: admission rank deciles against join-time deciles.
    pub independence: Option<Independence>,
    /// Of the admitted shoppers who saw their pass, the share who bought: those polling
    /// ten times a second, and the fair ones. Their place is the queue's, not theirs to
    /// improve; seeing the pass sooner is an edge only while units last.
    pub fast_pollers_bought: Option<f64>,
    pub fair_bought: Option<f64>,
}

/// Runs one drop with `queueing` against `plan.targets`; the run's orders as a
/// [`RunResult`] (for the checker) and the drop's section.
pub async fn run(
    args: &LoadtestArgs,
    plan: &Plan,
    db: &PgPool,
    redis: Option<&RedisTarget>,
    queueing: Queueing,
    live: Arc<Live>,
) -> anyhow::Result<(RunResult, DropSection)> {
    let d = &args.drop;
    // An earlier run's drop of this product, if one is still live, ends first.
    for old in crate::drops::db::live(db).await? {
        if old.sku == DROP_SKU {
            crate::drops::db::change(db, old.id, crate::drops::db::Change::End, "loadtest").await?;
        }
    }
    super::setup::reset_sku(
        db,
        redis,
        DROP_SKU,
        "Drop: Load-test Edition",
        24_900,
        args.stock(),
    )
    .await?;
    let total = d.prequeue_shoppers + d.later_shoppers;
    let keys = shopper_keys(db, &plan.run_id, total).await?;
    // The opening leaves time for every server to learn of the drop before it binds.
    let lead = crate::drops::BIND_AFTER + Duration::from_secs(1);
    let prequeue = Duration::from_secs(u64::from(d.prequeue_seconds));
    let drop = crate::drops::db::create(
        db,
        &NewDrop {
            sku: DROP_SKU.into(),
            opens_at: chrono::Utc::now() + lead + prequeue,
            prequeue_seconds: d.prequeue_seconds as i32,
            queueing,
            admit_per_minute: d.admit_per_minute,
            max_active: None,
            session_seconds: d.session_seconds,
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("cannot schedule the drop: {e}"))?;
    let started = Instant::now();
    let opens = started + lead + prequeue;
    let shared = Arc::new(Shared {
        client: reqwest::Client::builder()
            .timeout(plan.timeout)
            .pool_max_idle_per_host(256)
            .build()?,
        targets: plan.targets.clone(),
        drop_id: drop.id,
        sku: DROP_SKU.into(),
        pays: plan.payments.is_some(),
        run_id: plan.run_id.clone(),
        started,
        opens,
        deadline: opens + plan.duration,
        passes: Mutex::new(Vec::new()),
        log: Mutex::new(Vec::new()),
        live,
    });
    // Pre-queue shoppers spread over it (ending half a second before the opening, so
    // none lands after it); later ones from the opening at the join rate.
    let window = prequeue.saturating_sub(Duration::from_millis(500));
    let every = (1.0 / d.misbehave_share.max(1e-9)).round().max(1.0) as u64;
    let shoppers: Vec<Shopper> = keys
        .into_iter()
        .enumerate()
        .map(|(i, key)| {
            let i = i as u64;
            let prequeued = i < d.prequeue_shoppers;
            let join_at = if prequeued {
                opens - prequeue + window.mul_f64(i as f64 / d.prequeue_shoppers as f64)
            } else {
                let j = (i - d.prequeue_shoppers) as f64;
                opens + Duration::from_secs_f64(j / d.join_rate)
            };
            let conduct = if d.misbehave_share > 0.0 && i % every == every - 1 {
                Conduct::misbehaving(i / every)
            } else {
                Conduct::Fair
            };
            Shopper {
                index: i,
                key,
                conduct,
                prequeued,
                join_at,
            }
        })
        .collect();
    let tasks: Vec<_> = shoppers
        .into_iter()
        .map(|s| tokio::spawn(s.run(shared.clone())))
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await?);
    }
    let wall = started.elapsed();
    crate::drops::db::change(db, drop.id, crate::drops::db::Change::End, "loadtest").await?;
    let recorded = crate::drops::db::admissions(db, drop.id).await?;
    // Who was let in, from the queue itself when it can be read: PostgreSQL records only
    // the admissions a shopper came back to see before the queue closed.
    let from_queue = match redis {
        Some(t) => {
            let redis = crate::locking::Redis::connect_lazy(&t.url, &t.prefix)?;
            crate::drops::queue::admitted(&redis, drop.id).await
        }
        None => None,
    };
    let admissions = Admissions {
        recorded: recorded
            .iter()
            .map(|a| (a.ticket, a.admitted_at.timestamp_millis()))
            .collect(),
        from_queue,
        twice: twice(&recorded),
    };
    revoke_shopper_keys(db, &plan.run_id).await?;

    let log = std::mem::take(&mut *shared.log.lock().expect("log lock"));
    let ran = super::run::Ran {
        log,
        stock: Vec::new(),
        wall,
        buyers_started: total,
        dispatch: wall,
    };
    let result = super::summary::summarise(plan, ran);
    let section = section(&drop, &outcomes, &admissions);
    Ok((result, section))
}

/// One unlimited API client per shopper, named after the run (revoked at its end).
async fn shopper_keys(db: &PgPool, run_id: &str, n: u64) -> anyhow::Result<Vec<String>> {
    let made: Vec<anyhow::Result<String>> = futures_util::stream::iter(0..n)
        .map(|i| async move {
            let name = format!("{run_id} drop shopper {i}");
            crate::clients::create(db, &name, crate::clients::Limit::Unlimited)
                .await
                .map(|(_, key)| key)
                .context("cannot make the shoppers' API keys")
        })
        .buffered(16)
        .collect()
        .await;
    made.into_iter().collect()
}

async fn revoke_shopper_keys(db: &PgPool, run_id: &str) -> anyhow::Result<()> {
    let pattern = format!("{run_id} drop shopper %");
    crate::clients::revoke_matching(db, &pattern).await?;
    Ok(())
}

fn percentiles(values: impl Iterator<Item = f64>) -> Percentiles {
    let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
    for v in values {
        h.saturating_record((v * 1e3).max(1.0) as u64);
    }
    Percentiles::of(&h)
}

/// The drop's section, from what the shoppers saw and the admissions PostgreSQL recorded.
/// Who a drop let in: `(ticket, ms since the epoch)`.
struct Admissions {
    /// As PostgreSQL recorded them (a shopper saw the pass).
    recorded: Vec<(uuid::Uuid, i64)>,
    /// As the queue in Redis holds them, when it could be read.
    from_queue: Option<Vec<(uuid::Uuid, i64)>>,
    /// Identities PostgreSQL recorded more than once.
    twice: u64,
}

fn twice(recorded: &[crate::drops::db::AdmissionRow]) -> u64 {
    let mut per_identity: HashMap<&str, u64> = HashMap::new();
    for a in recorded {
        *per_identity.entry(a.identity.as_str()).or_default() += 1;
    }
    per_identity.values().filter(|&&n| n > 1).count() as u64
}

fn section(
    drop: &crate::drops::Drop,
    outcomes: &[Outcome],
    admissions: &Admissions,
) -> DropSection {
    let by_ticket: HashMap<uuid::Uuid, &Outcome> = outcomes
        .iter()
        .filter_map(|o| Some((uuid::Uuid::try_parse(o.ticket.as_deref()?).ok()?, o)))
        .collect();
    let admitted_twice =
        admissions.twice + outcomes.iter().filter(|o| o.second_place).count() as u64;
    let all = admissions
        .from_queue
        .as_ref()
        .unwrap_or(&admissions.recorded);
    // Admitted shoppers with when they joined and when they were let in (Redis's clock,
    // to the millisecond; one script's admissions share it).
    let mut admitted: Vec<(&Outcome, f64)> = all
        .iter()
        .filter_map(|(ticket, at)| Some((*by_ticket.get(ticket)?, *at as f64)))
        .filter(|(o, _)| o.joined_ms.is_some())
        .collect();
    admitted.sort_by(|a, b| a.1.total_cmp(&b.1));
    let lottery = drop.queueing == Queueing::Lottery;
    // A lottery is judged over the shoppers it drew places for (as their join's answer
    // said): one whose join landed after the opening queued by arrival, behind them.
    let judged: Vec<&(&Outcome, f64)> = admitted
        .iter()
        .filter(|(o, _)| !lottery || o.drawn)
        .collect();
    let joined: Vec<f64> = judged.iter().map(|(o, _)| o.joined_ms.unwrap()).collect();
    let let_in: Vec<f64> = judged.iter().map(|(_, at)| *at).collect();
    let independence = lottery
        .then(|| fairness::independence(&fairness::ranks(&joined), &fairness::ranks(&let_in)))
        .flatten();
    // Of the admitted shoppers, the share who bought: polling ten times a second sees the
    // pass sooner, which is an edge only while units last.
    let bought = |polls_fast: bool| {
        let (mut admitted_n, mut bought_n) = (0u32, 0u32);
        for (o, _) in &admitted {
            let counted = match polls_fast {
                true => o.conduct == Conduct::PollsFast,
                false => o.conduct == Conduct::Fair,
            };
            if counted && o.admitted_ms.is_some() {
                admitted_n += 1;
                bought_n += u32::from(o.order_status == Some(201));
            }
        }
        (admitted_n > 0).then(|| f64::from(bought_n) / f64::from(admitted_n))
    };
    let first_last = admitted.first().zip(admitted.last());
    let count = |f: &dyn Fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count() as u64;
    DropSection {
        drop_id: drop.id,
        queueing: drop.queueing,
        shoppers: outcomes.len() as u64,
        prequeued: count(&|o| o.prequeued),
        misbehaving: count(&|o| o.conduct != Conduct::Fair),
        joined: count(&|o| o.ticket.is_some()),
        admitted: all.len() as u64,
        recorded: admissions.recorded.len() as u64,
        admitted_twice,
        orders: count(&|o| o.order_status == Some(201)),
        sold_out: count(&|o| o.order_status == Some(409)),
        misuse_tried: outcomes.iter().map(|o| o.misuse_tried).sum(),
        misuse_accepted: outcomes.iter().map(|o| o.misuse_accepted).sum(),
        never_admitted: count(&|o| o.ticket.is_some() && o.admitted_ms.is_none()),
        time_to_admission_ms: percentiles(
            outcomes
                .iter()
                .filter_map(|o| Some(o.admitted_ms? - o.joined_ms?.max(0.0))),
        ),
        shop_latency_ms: percentiles(outcomes.iter().filter_map(|o| o.order_ms)),
        admission_rate_per_s: first_last.map_or(0.0, |(a, b)| {
            let span = (b.1 - a.1) / 1e3;
            if span > 0.0 {
                (admitted.len() - 1) as f64 / span
            } else {
                admitted.len() as f64
            }
        }),
        fairness: Fairness {
            over: if lottery {
                "the admitted shoppers drawn in the pre-queue: join order against admission order"
                    .into()
            } else {
                "every admitted shopper: arrival order against admission order".into()
            },
            n: judged.len(),
            kendall: fairness::kendall(&joined, &let_in),
            independence,
            fast_pollers_bought: bought(true),
            fair_bought: bought(false),
        },
    }
}

/// The drop's section as the terminal (and the HTML report) shows it.
pub fn summary(label: &str, d: &DropSection) -> String {
    let f = &d.fairness;
    let opt = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    let mut out = format!(
        "{label}: drop {} ({}): {} shoppers ({} in the pre-queue, {} misbehaving), {} joined, \
         {} admitted ({} came back for their pass) at {:.1}/s, {} never saw a pass\n",
        d.drop_id,
        d.queueing.as_str(),
        d.shoppers,
        d.prequeued,
        d.misbehaving,
        d.joined,
        d.admitted,
        d.recorded,
        d.admission_rate_per_s,
        d.never_admitted,
    );
    out += &format!(
        "{label}:   orders {} (sold out {}); admitted twice {}; orders without their own \
         pass accepted {} of {} tried\n",
        d.orders, d.sold_out, d.admitted_twice, d.misuse_accepted, d.misuse_tried,
    );
    out += &format!(
        "{label}:   time to admission p50 {:.0} ms, p99 {:.0} ms; the shop for admitted \
         shoppers p50 {:.1} ms, p99 {:.1} ms\n",
        d.time_to_admission_ms.p50,
        d.time_to_admission_ms.p99,
        d.shop_latency_ms.p50,
        d.shop_latency_ms.p99,
    );
    out += &format!("{label}:   fairness over {} ({}): ", f.over, f.n);
    match &f.kendall {
        Some(k) => {
            out += &format!(
                "Kendall τ-b {:.3}, {} of {} pairs out of order",
                k.tau_b, k.discordant_pairs, k.pairs
            )
        }
        None => out += "Kendall τ -",
    }
    if let Some(i) = &f.independence {
        out += &format!(
            "; chi-square {:.1} on {} degrees of freedom ({}×{} quantiles), p = {:.3}",
            i.chi_square, i.degrees_of_freedom, i.bins, i.bins, i.p_value
        );
    }
    out += &format!(
        "; bought, of those admitted: fast pollers {}, fair shoppers {}\n",
        opt(f.fast_pollers_bought.map(|v| v * 100.0), 0) + "%",
        opt(f.fair_bought.map(|v| v * 100.0), 0) + "%"
    );
    out
}
