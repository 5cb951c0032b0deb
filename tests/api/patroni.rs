//! PostgreSQL under Patroni (etcd as its consensus store, synchronous replication, HAProxy
//! routing to whichever node leads) losing its leader in the middle of a flash sale.

use std::time::{Duration, Instant};

use clap::Parser;
use stockade::cluster::patroni::{Options, Patroni, TTL};
use stockade::loadtest::{LoadtestArgs, run_report};

use crate::helpers::{ServerProcess, servers};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: LoadtestArgs,
}

/// An open-loop flash sale through `apps`: 150 buyers a second for `seconds`, on stock that
/// does not sell out.
fn sale(
    apps: &[ServerProcess],
    database_url: &str,
    redis_url: &str,
    prefix: &str,
    seconds: u64,
) -> LoadtestArgs {
    let out = std::env::temp_dir().join(format!("stockade-lt-{}", uuid::Uuid::new_v4().simple()));
    let mut argv = vec!["loadtest".to_string()];
    for app in apps {
        argv.extend(["--target".into(), app.address.clone()]);
    }
    let (buyers, seconds) = ((150 * seconds).to_string(), seconds.to_string());
    let out = out.display().to_string();
    argv.extend(
        [
            "--database-url",
            database_url,
            "--redis-url",
            redis_url,
            "--redis-prefix",
            prefix,
            "--out",
            &out,
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
        ]
        .map(str::to_string),
    );
    Cli::parse_from(argv).args
}

/// Seconds from `killed` (since the sale started) to the first order acknowledged after
/// it; orders must have been acknowledged before it too.
fn first_order_after(run: &stockade::loadtest::report::StrategyRun, killed: Duration) -> f64 {
    let kill_ms = killed.as_secs_f64() * 1e3;
    let created: Vec<f64> = run
        .result
        .log
        .iter()
        .filter(|e| e.status == 201)
        .map(|e| e.at_ms)
        .collect();
    assert!(
        created.iter().any(|&t| t < kill_ms),
        "orders before the kill"
    );
    let resumed = created
        .iter()
        .copied()
        .filter(|&t| t > kill_ms)
        .fold(f64::INFINITY, f64::min);
    assert!(
        resumed.is_finite(),
        "orders after the kill: {:?}",
        run.result.outcomes
    );
    (resumed - kill_ms) / 1e3
}

#[tokio::test]
async fn killing_the_patroni_leader_mid_sale_loses_no_acknowledged_order_and_it_rejoins_as_a_replica()
 {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("stockade-patroni-{}", uuid::Uuid::new_v4()));
    let options = Options {
        ephemeral: true,
        ..Options::default()
    };
    let mut pg = Patroni::start(&dir, options).await.expect("Patroni starts");
    eprintln!(
        "Patroni: two nodes, a leader and a synchronous standby, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let database_url = pg.database_url();
    stockade::startup::migrate(&stockade::config::Settings {
        database_url: Some(database_url.clone().into()),
        ..stockade::config::Settings::default()
    })
    .await
    .unwrap();
    // Two app servers reaching PostgreSQL only through HAProxy's write port.
    let redis_url = servers().await.redis_url.clone();
    let prefix = format!("patroni-{}:", uuid::Uuid::new_v4().simple());
    let env = [
        ("DATABASE_URL", database_url.clone()),
        ("REDIS_URL", redis_url.clone()),
        ("STOCKADE_REDIS_PREFIX", prefix.clone()),
        ("STOCKADE_LISTEN", "127.0.0.1:0".to_string()),
        ("STOCKADE_LOG", "warn".to_string()),
        ("STOCKADE_WORKERS", "2".to_string()),
        ("STOCKADE_API_ANONYMOUS_ORDERS", "true".to_string()),
        ("STOCKADE_RATE_LIMIT_PER_MINUTE", "1000000".to_string()),
        ("STOCKADE_RATE_LIMIT_BURST", "1000000".to_string()),
    ];
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_stockade"));
    let mut apps = vec![
        ServerProcess::start(&exe, &env, &[]).await.unwrap(),
        ServerProcess::start(&exe, &env, &[]).await.unwrap(),
    ];
    // An open-loop sale that outlasts the failover: 150 buyers a second for 45 s, never
    // selling out.
    let args = sale(&apps, &database_url, &redis_url, &prefix, 45);
    let sale_started = Instant::now();
    let (report, (killed, killed_at, elected_after)) = tokio::join!(run_report(&args), async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let leader = pg.leader().await.expect("a leader before the kill");
        let killed_at = Instant::now();
        pg.nodes[leader].kill9();
        let elected = pg
            .wait_for_leader(TTL + Duration::from_secs(25))
            .await
            .expect("a new leader");
        assert_ne!(elected, leader, "the other node leads");
        (leader, killed_at, killed_at.elapsed())
    });
    let report = report.unwrap();
    let run = &report.runs[0];
    // Every order acknowledged exists on the new leader (I4), nothing oversold (I1, I2),
    // one order per key (I3), and the rest of I5–I8.
    assert!(run.passed(), "{:#?}", run.verdicts);
    let resumed_after = first_order_after(run, killed_at.duration_since(sale_started));
    eprintln!(
        "leader killed at {:.1} s: new leader after {:.1} s, first order after {resumed_after:.1} s; \
         {} orders acknowledged, answers {:?}",
        killed_at.duration_since(sale_started).as_secs_f64(),
        elected_after.as_secs_f64(),
        run.result.orders_acknowledged,
        run.result.outcomes
    );
    // The whole node died (Patroni too): the leader key had to expire first.
    assert!(
        resumed_after <= 30.0,
        "orders resumed {resumed_after:.1} s after the kill"
    );

    // The old leader comes back and rejoins as a replica, rewound, without help.
    let back = Instant::now();
    pg.nodes[killed]
        .daemon
        .restart()
        .expect("Patroni starts again");
    while !pg.nodes[killed].answers("/replica").await {
        assert!(
            back.elapsed() < Duration::from_secs(60),
            "not a replica within a minute"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "old leader back as a replica {:.1} s after its restart",
        back.elapsed().as_secs_f64()
    );
    // Back at full strength: a synchronous standby again.
    pg.wait_for(Duration::from_secs(60), "/sync")
        .await
        .expect("a synchronous standby again");

    for app in &mut apps {
        app.stop();
    }
    tokio::task::spawn_blocking(move || pg.stop())
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
