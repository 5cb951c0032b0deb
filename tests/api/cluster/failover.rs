//! The cluster's PostgreSQL leader lost mid-sale, three ways: its postmaster killed (its
//! Patroni lives), the whole node killed (Patroni too), and the node cut off from etcd and
//! the other nodes. Each time an open-loop sale goes on through HAProxy, and afterwards
//! every order acknowledged exists (I4), nothing is oversold (I1, I2), orders resumed
//! within a bound, and the old leader is back as a replica without help.

use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::future::join_all;
use stockade::cluster::Cluster;
use stockade::loadtest::report::StrategyRun;
use stockade::loadtest::{LoadtestArgs, run_report};

use super::Cli;

/// How the leader is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL to its postmaster alone: Patroni restarts it in place, or fails over
    /// should that take longer than `master_start_timeout`.
    Postmaster,
    /// SIGKILL to its Patroni and its PostgreSQL, as a machine dying would: the leader
    /// key must expire (`ttl`) before another node may lead.
    Node,
    /// Its network to etcd and the other nodes cut: it must stop taking writes before
    /// another node leads.
    Partition,
}

impl Fault {
    /// From the fault to the first order acknowledged after it, at most.
    fn resume_bound(self) -> Duration {
        match self {
            Self::Postmaster => Duration::from_secs(15),
            Self::Node | Self::Partition => Duration::from_secs(30),
        }
    }
}

/// An open-loop sale through HAProxy: 150 buyers a second for `seconds`, on stock that
/// does not sell out.
fn open_sale(cluster: &Cluster, redis_port: u16, seconds: u64, seed: u64) -> LoadtestArgs {
    let out = std::env::temp_dir().join(format!("stockade-lt-{}", uuid::Uuid::new_v4().simple()));
    let (buyers, seconds) = ((150 * seconds).to_string(), seconds.to_string());
    let argv = [
        "loadtest",
        "--target",
        &cluster.url(),
        "--database-url",
        &cluster.primary_url(),
        "--redis-url",
        &cluster.redis_url(redis_port),
        "--out",
        &out.display().to_string(),
        "--quiet",
        "--stock",
        "100000",
        "--buyers",
        &buyers,
        "--rate",
        "150",
        "--duration",
        &seconds,
        "--hold-share",
        "0",
        "--seed",
        &seed.to_string(),
    ]
    .map(str::to_string);
    Cli::parse_from(argv).args
}

/// Seconds from `fault` (since the sale started) to the first order acknowledged after
/// it; orders must have been acknowledged before it too.
fn first_order_after(run: &StrategyRun, fault: Duration, what: Fault) -> f64 {
    let fault_ms = fault.as_secs_f64() * 1e3;
    let created: Vec<f64> = run
        .result
        .log
        .iter()
        .filter(|e| e.status == 201)
        .map(|e| e.at_ms)
        .collect();
    assert!(
        created.iter().any(|&t| t < fault_ms),
        "{what:?}: orders before the fault"
    );
    let resumed = created
        .iter()
        .copied()
        .filter(|&t| t > fault_ms)
        .fold(f64::INFINITY, f64::min);
    assert!(
        resumed.is_finite(),
        "{what:?}: orders after the fault: {:?}",
        run.result.outcomes
    );
    (resumed - fault_ms) / 1e3
}

/// Whether node `i`'s PostgreSQL would take a write now, straight to it (not through
/// HAProxy): `Some(true)` when it answers out of recovery, `Some(false)` in recovery,
/// `None` when it does not answer in time (unknown: it may be restarting, or just slow).
async fn takes_writes(cluster: &Cluster, i: usize) -> Option<bool> {
    use sqlx::Connection;
    let url = cluster.postgres.superuser_url(i, "postgres");
    let ask = async {
        let mut conn = sqlx::PgConnection::connect(&url).await?;
        let in_recovery: bool = sqlx::query_scalar("select pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await?;
        let _ = conn.close().await;
        Ok::<_, sqlx::Error>(!in_recovery)
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()?
        .ok()
}

/// What one loss of the leader showed.
struct Timeline {
    leader: usize,
    /// From the fault: the last moment the old leader was seen taking writes (partition
    /// only: the end of the last check that found it so).
    last_writable: Option<Duration>,
    /// From the fault: a node answered `/primary` again (another, unless the postmaster
    /// was restarted in place), as first seen.
    elected: Duration,
    elected_node: usize,
    /// From the fault: another node took writes no earlier than this (partition only: the
    /// start of the last check that found none doing so).
    others_writable_after: Option<Duration>,
}

/// Loses the leader `fault`'s way 5 s into an open-loop sale of `seconds`, and checks
/// the sale; then brings the old leader back (restarting its Patroni, or healing its
/// network) and waits until it is a replica and the cluster has a synchronous standby.
pub async fn lose_the_leader(
    cluster: &mut Cluster,
    fault: Fault,
    redis_port: u16,
    seconds: u64,
    seed: u64,
) {
    let args = open_sale(cluster, redis_port, seconds, seed);
    let sale_started = Instant::now();
    let leader = cluster.postgres.leader().await.expect("a leader before");
    // The sale runs on a thread and runtime of its own: nothing it does (its buyers, its
    // report) can hold up the checks below, which time the failover.
    let (sold, sale) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the sale");
        let _ = sold.send(runtime.block_on(run_report(&args)));
    });
    let (faulted_at, timeline) = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let faulted_at = Instant::now();
        let node = &mut cluster.postgres.nodes[leader];
        let postmaster = node.postmaster_pid().expect("the leader's postmaster runs");
        match fault {
            Fault::Postmaster => {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(postmaster),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
            }
            Fault::Node => node.kill9(),
            Fault::Partition => node.partition().unwrap(),
        }
        // Every tick asks each node's Patroni at once (and, in a partition, the old leader's
        // PostgreSQL), until another node leads; in a partition, also until the old leader
        // is seen in recovery. Times are conservative: a check that found the old leader
        // writable counts at its end, one that found another node leading at its start.
        let mut last_writable = None;
        let mut others_writable_after = None;
        let mut old_demoted = fault != Fault::Partition;
        let mut elected = None;
        let mut previous_tick = Duration::ZERO;
        // What the loop saw, for a failure to tell a loop that did not tick from nodes
        // that did not say yes: ticks, and each node's last answer to `/primary`.
        let mut ticks = 0;
        let mut last_seen = Vec::new();
        let deadline = faulted_at + Duration::from_secs(60);
        while elected.is_none() || !old_demoted || others_writable_after.is_none() {
            if Instant::now() >= deadline {
                // What each node says of itself: the role, state and timeline it had.
                let said = join_all(cluster.postgres.nodes.iter().map(|n| async move {
                    let url = format!("{}/patroni", n.patroni_url());
                    match reqwest::get(&url).await {
                        Ok(res) => format!("{url}: {}", res.text().await.unwrap_or_default()),
                        Err(e) => format!("{url}: {e}"),
                    }
                }))
                .await;
                panic!(
                    "{fault:?}: no leader, or the old one not demoted, within 60 s \
                     (elected: {elected:?}, old demoted: {old_demoted}; {ticks} ticks, the \
                     last at {previous_tick:?} saw /primary, and after how long, \
                     {last_seen:?})\n{}",
                    said.join("\n")
                );
            }
            let asked = faulted_at.elapsed();
            let cluster: &Cluster = cluster;
            let nodes = &cluster.postgres.nodes;
            // In a partition, also whether each node's PostgreSQL takes writes.
            let (answered, writable) = tokio::join!(
                join_all(nodes.iter().map(|n| async move {
                    let asked = Instant::now();
                    // A node that is busy (a promotion, a sale, a loaded machine) may be
                    // slow to say so: a late yes is still a yes.
                    let yes = n.answers_within("/primary", Duration::from_secs(5)).await;
                    (yes, asked.elapsed())
                })),
                join_all((0..nodes.len()).map(|i| async move {
                    match fault {
                        Fault::Partition => takes_writes(cluster, i).await,
                        _ => None,
                    }
                }))
            );
            let primaries: Vec<bool> = answered.iter().map(|&(yes, _)| yes).collect();
            match writable[leader] {
                Some(true) => last_writable = Some(faulted_at.elapsed()),
                Some(false) => old_demoted = true,
                None => {}
            }
            let another_writable =
                (0..nodes.len()).any(|i| i != leader && writable[i] == Some(true));
            if fault != Fault::Partition {
                others_writable_after = Some(Duration::ZERO);
            } else if others_writable_after.is_none() && another_writable {
                // It took writes since the previous tick's checks began, not before.
                others_writable_after = Some(previous_tick);
            }
            // The killed node's REST API is gone; a partitioned node's still answers
            // (HAProxy reaches it), as primary until it demotes itself; a node whose
            // postmaster was killed answers as primary until its Patroni notices. A
            // leader is new when it is another node, or this one with a new postmaster.
            let new_leader = (0..nodes.len()).find(|&i| {
                primaries[i]
                    && (i != leader
                        || (fault == Fault::Postmaster
                            && nodes[i]
                                .postmaster_pid()
                                .is_some_and(|pid| pid != postmaster)))
            });
            if elected.is_none()
                && let Some(i) = new_leader
            {
                elected = Some((i, asked));
            }
            previous_tick = asked;
            ticks += 1;
            last_seen = answered;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (elected_node, elected) = elected.expect("the loop ends with a leader");
        let timeline = Timeline {
            leader,
            last_writable,
            elected,
            elected_node,
            others_writable_after: others_writable_after.filter(|_| fault == Fault::Partition),
        };
        (faulted_at, timeline)
    }
    .await;
    let report = sale.await.expect("the sale's thread answers").unwrap();
    let run = &report.runs[0];
    // Every order acknowledged exists on the leader now (I4), nothing oversold (I1, I2),
    // one order per key (I3), and the rest.
    assert!(run.passed(), "{fault:?}: {:#?}", run.verdicts);
    // While no node led, the apps answered 503 with Retry-After: never another 5xx.
    let failed: Vec<u16> = run
        .result
        .log
        .iter()
        .map(|e| e.status)
        .filter(|&s| s >= 500 && s != 503)
        .collect();
    assert!(failed.is_empty(), "{fault:?}: answered {failed:?}");
    let resumed = first_order_after(run, faulted_at.duration_since(sale_started), fault);
    eprintln!(
        "{fault:?}: leader pg{} lost at {:.1} s into the sale; {}leader pg{} after {:.1} s, \
         first order after {resumed:.1} s; {} orders acknowledged, answers {:?}",
        timeline.leader + 1,
        faulted_at.duration_since(sale_started).as_secs_f64(),
        timeline
            .last_writable
            .map(|d| format!(
                "old leader last seen writable at {:.1} s; ",
                d.as_secs_f64()
            ))
            .unwrap_or_default(),
        timeline.elected_node + 1,
        timeline.elected.as_secs_f64(),
        run.result.orders_acknowledged,
        run.result.outcomes
    );
    assert!(
        resumed <= fault.resume_bound().as_secs_f64(),
        "{fault:?}: orders resumed {resumed:.1} s after the fault (bound {:?})",
        fault.resume_bound()
    );
    if fault == Fault::Partition {
        // Never two nodes taking writes: the cut-off leader was last seen writable before
        // any other node could have been (and it was seen in recovery before the watch
        // ended). Both times err against the assertion: the old leader's at the end of
        // the check that found it writable, the others' at the start of the check before
        // the first that found one so.
        let others = timeline
            .others_writable_after
            .expect("another node took writes");
        assert!(
            timeline.last_writable.is_none_or(|w| w < others),
            "the old leader took writes until {:?}, another node from {others:?} on",
            timeline.last_writable,
        );
    }

    // The old leader comes back as a replica, rewound, without help.
    let back = Instant::now();
    match fault {
        Fault::Postmaster => {}
        Fault::Node => cluster.postgres.nodes[leader]
            .daemon
            .restart()
            .expect("Patroni starts again"),
        Fault::Partition => cluster.postgres.nodes[leader].heal().unwrap(),
    }
    let rejoined = if timeline.elected_node == leader {
        "restarted in place and leads again"
    } else {
        while !cluster.postgres.nodes[leader].answers("/replica").await {
            assert!(
                back.elapsed() < Duration::from_secs(60),
                "{fault:?}: the old leader is not a replica within a minute"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        "is back as a replica"
    };
    eprintln!(
        "{fault:?}: pg{} {rejoined} {:.1} s after it came back",
        leader + 1,
        back.elapsed().as_secs_f64()
    );
    // At full strength again: every node up, one leading, the others streaming from it
    // (the old leader rewound onto the new timeline, not merely running), and a
    // synchronous standby.
    let deadline = Instant::now() + Duration::from_secs(60);
    let leading = loop {
        if let Some(i) = cluster.postgres.leader().await {
            let streaming = streaming_from(cluster, i).await;
            let others = cluster.postgres.nodes.len() - 1;
            if streaming.len() == others {
                break i;
            }
            assert!(
                Instant::now() < deadline,
                "{fault:?}: only {streaming:?} stream from pg{}",
                i + 1
            );
        }
        assert!(Instant::now() < deadline, "{fault:?}: no leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "{fault:?}: pg{} leads, every other node streams from it",
        leading + 1
    );
    cluster
        .postgres
        .wait_for(Duration::from_secs(60), "/sync")
        .await
        .expect("a synchronous standby again");
}

/// The nodes streaming from node `leader`, by their names, as it sees them.
async fn streaming_from(cluster: &Cluster, leader: usize) -> Vec<String> {
    use sqlx::Connection;
    let url = cluster.postgres.superuser_url(leader, "postgres");
    let Ok(mut conn) = sqlx::PgConnection::connect(&url).await else {
        return Vec::new();
    };
    let names = sqlx::query_scalar(
        "select application_name from pg_stat_replication where state = 'streaming'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap_or_default();
    let _ = conn.close().await;
    names
}
