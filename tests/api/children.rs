//! What Stockade starts: a start whose daemon dies fails at once, naming it; and nothing it
//! started outlives it when it is killed with SIGKILL (`stockade cluster`, `stockade
//! serve` in local mode, and this very test binary in the middle of a cluster test).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stockade::cluster::patroni::{Options, Patroni};

use crate::helpers::processes::{self, stockade_command};
use crate::helpers::servers;

/// Two daemons of one start given one port, forced through the seam (draws cannot do it):
/// node 1's link takes its own Patroni's REST port. The start fails, naming that Patroni
/// and quoting its log, long before any of its deadlines (the leader wait's is 60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_start_whose_daemon_cannot_bind_its_port_fails_naming_it() {
    let dir = servers().await.fresh_dir("clash");
    let started = Instant::now();
    let options = Options {
        nodes: 1,
        ephemeral: true,
        synchronous: false,
        links: true,
        clash: true,
        ..Options::default()
    };
    let outcome = tokio::time::timeout(Duration::from_secs(120), Patroni::start(&dir, options))
        .await
        .expect("the start neither failed nor finished within 120 s: a hang");
    let error = match outcome {
        Ok(_) => panic!("a start whose Patroni could not bind its REST port succeeded"),
        Err(e) => format!("{e:#}"),
    };
    let took = started.elapsed();
    println!("after {took:?}: {error}");
    assert!(error.contains("Patroni of pg1"), "{error}");
    // Its log's last lines are quoted (each behind "  | ").
    assert!(error.contains("  | "), "{error}");
    assert!(
        took < Duration::from_secs(50),
        "the start failed only after {took:?}, as a deadline would: {error}"
    );
}

/// `stockade cluster`, SIGKILLed once it serves: within 15 s nothing it started runs.
#[tokio::test]
async fn nothing_stockade_cluster_started_outlives_its_sigkill() {
    let dir = servers().await.fresh_dir("orphans-cluster");
    let mut command = stockade_command();
    command.args([
        "cluster",
        "--apps",
        "1",
        "--postgres-nodes",
        "2",
        "--pgbouncer-pool",
        "4",
    ]);
    command.arg("--data-dir").arg(&dir);
    kill_once_serving(command, "stockade cluster").await;
}

/// `stockade serve` in local mode (its own PostgreSQL and Redis), SIGKILLed once it
/// serves: within 15 s nothing it started runs.
#[tokio::test]
async fn nothing_local_mode_started_outlives_its_sigkill() {
    let dir = servers().await.fresh_dir("orphans-local");
    let mut command = stockade_command();
    command
        .arg("serve")
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env("STOCKADE_DATA_DIR", &dir)
        .env("STOCKADE_LISTEN", "127.0.0.1:0");
    kill_once_serving(command, "stockade serve").await;
}

/// This test binary, SIGKILLed in the middle of the cluster test (once a Patroni of its
/// runs): within 15 s nothing it started runs.
#[tokio::test]
async fn nothing_a_test_binary_started_outlives_its_sigkill_mid_cluster_test() {
    let probe = format!("orphan-probe-{}", uuid::Uuid::new_v4().simple());
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "--nocapture"])
        .arg(CLUSTER_TEST)
        .env(processes::MARK, &probe)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // Not marked as this binary's: the probe is what finds its processes, and this
    // binary's own warden must not be the one that ends them.
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let patroni = marked_with(&probe)
            .into_iter()
            .any(|(_, command)| command.contains("patroni"));
        if patroni {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the cluster test ended ({status}) before a Patroni of its ran");
        }
        assert!(
            Instant::now() < deadline,
            "no Patroni of the cluster test ran within 240 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A moment more, so the start is in full swing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tree = descendants(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_none_left(&probe, &tree, "the test binary");
}

const CLUSTER_TEST: &str = "cluster::a_flash_sale_through_haproxy_survives_losing_a_redis_master_an_app_the_replicas_pgbouncer_and_the_database_leader";

/// Runs `command` (a `stockade` that prints "Press Ctrl-C" once it serves) with a probe
/// of its own, SIGKILLs it once it serves, and asserts nothing it started is left.
async fn kill_once_serving(mut command: Command, what: &str) {
    let probe = format!("orphan-probe-{}", uuid::Uuid::new_v4().simple());
    let log = servers().await.root.join(format!("{probe}.log"));
    command
        .env(processes::MARK, &probe)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut child = command.spawn().unwrap();
    let serving = wait_until_serving(&mut child, Duration::from_secs(240)).await;
    if let Err(why) = serving {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{what} {why}; the end of what it said:\n{}",
            stockade::children::log_tail(&log, 30)
        );
    }
    let tree = descendants(child.id());
    assert!(
        tree.len() > 2,
        "{what} started too little to test: {tree:?}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_none_left(&probe, &tree, what);
}

/// Reads `child`'s output until it says it serves, for up to `within`.
async fn wait_until_serving(child: &mut Child, within: Duration) -> Result<(), String> {
    let stdout = child.stdout.take().unwrap();
    let reading = tokio::task::spawn_blocking(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if line.starts_with("Press Ctrl-C") {
                // Keep draining, so the process never blocks on a full pipe.
                std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
                return true;
            }
            line.clear();
        }
        false
    });
    match tokio::time::timeout(within, reading).await {
        Ok(Ok(true)) => Ok(()),
        Ok(_) => Err("ended before it served".into()),
        Err(_) => Err(format!("did not serve within {within:?}")),
    }
}

/// Asserts that within 15 s no process carries `probe` and none of `tree` (the killed
/// process's descendants when it was killed) runs; stops and names any that do.
fn assert_none_left(probe: &str, tree: &HashSet<u32>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut left = marked_with(probe);
        let live: HashSet<u32> = running().into_keys().collect();
        for pid in tree.intersection(&live) {
            if !left.iter().any(|(p, _)| p == pid) {
                left.push((*pid, command_line(*pid)));
            }
        }
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for (pid, _) in &left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let names: Vec<String> = left.iter().map(|(p, c)| format!("{p} {c}")).collect();
            panic!(
                "15 s after {what} was killed, {} processes it started still ran (now \
                 killed):\n  {}",
                left.len(),
                names.join("\n  ")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Live processes (not zombies) and their parents.
fn running() -> HashMap<u32, u32> {
    let mut found = HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let mut fields = stat[close + 1..].split_whitespace();
        let (Some(state), Some(parent)) = (fields.next(), fields.next()) else {
            continue;
        };
        if state != "Z" && state != "X" {
            found.insert(pid, parent.parse().unwrap_or(0));
        }
    }
    found
}

/// `root` and every live process below it.
fn descendants(root: u32) -> HashSet<u32> {
    let parents = running();
    let mut tree = HashSet::from([root]);
    loop {
        let before = tree.len();
        for (pid, parent) in &parents {
            if tree.contains(parent) {
                tree.insert(*pid);
            }
        }
        if tree.len() == before {
            return tree;
        }
    }
}

/// Live processes whose environment holds `SUITE_RUN_ID=probe`, with their command lines.
fn marked_with(probe: &str) -> Vec<(u32, String)> {
    let needle = format!("{}={probe}", processes::MARK);
    running()
        .into_keys()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
                .unwrap_or(false)
        })
        .map(|pid| (pid, command_line(pid)))
        .collect()
}

fn command_line(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
        .trim()
        .chars()
        .take(160)
        .collect()
}
