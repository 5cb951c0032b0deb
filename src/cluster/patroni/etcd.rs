//! The cluster's one etcd member: Patroni's consensus store, where the leader key lives.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::unistd::User;

use crate::cluster::daemons::{Daemon, log_to};
use crate::local::{find_binary, free_port, private_dir, run_as};

/// Waits until etcd has decided its cluster version: Patroni started before (etcd answers
/// "not_decided" for a moment after it listens) fails to parse it and exits.
pub(super) async fn wait_for_etcd(port: u16, within: Duration) -> anyhow::Result<()> {
    crate::install_tls_provider();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let deadline = Instant::now() + within;
    loop {
        let version = client
            .get(format!("http://127.0.0.1:{port}/version"))
            .send()
            .await;
        if let Ok(res) = version
            && let Ok(body) = res.json::<serde_json::Value>().await
            && body["etcdcluster"]
                .as_str()
                .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("etcd did not decide its cluster version within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) fn start_etcd(dir: &Path, owner: Option<User>) -> anyhow::Result<Daemon> {
    let bin = find_binary("etcd")
        .context("etcd not found: install it (Debian/Ubuntu: apt-get install etcd-server)")?;
    let data = private_dir(&dir.join("etcd"), owner.as_ref())?;
    let (client, peer) = (free_port()?, free_port()?);
    let log = dir.join("etcd.log");
    let out = fs::File::create(&log)?;
    Daemon::start("etcd", client, log, move || {
        let mut cmd = Command::new(&bin);
        cmd.arg("--name")
            .arg("etcd1")
            .arg("--data-dir")
            .arg(data.join("data"))
            .arg("--listen-client-urls")
            .arg(format!("http://127.0.0.1:{client}"))
            .arg("--advertise-client-urls")
            .arg(format!("http://127.0.0.1:{client}"))
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{peer}"))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://127.0.0.1:{peer}"))
            .arg("--initial-cluster")
            .arg(format!("etcd1=http://127.0.0.1:{peer}"));
        run_as(&mut cmd, owner.as_ref());
        log_to(&mut cmd, &out);
        cmd
    })
}

/// The etcd user Patroni reads and writes its keys as.
pub const PATRONI_USER: &str = "patroni";

/// Turns on etcd's authentication, once: a `root` user (which etcd requires before it
/// enables auth) and a `patroni` user whose role may read and write Patroni's keys
/// (`/service/…`) and nothing else. Then nobody else on the machine can read, write or
/// delete the leader key. At a later start of the same cluster (auth already on: `root`
/// logs in) nothing is done.
pub(super) async fn secure_etcd(port: u16, root: &str, patroni: &str) -> anyhow::Result<()> {
    use base64::Engine as _;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let call = |path: &'static str, body: serde_json::Value| {
        let request = client
            .post(format!("http://127.0.0.1:{port}/v3/auth/{path}"))
            .json(&body);
        async move {
            let answer: serde_json::Value = request
                .send()
                .await
                .with_context(|| format!("etcd did not answer /v3/auth/{path}"))?
                .json()
                .await
                .with_context(|| format!("etcd's answer to /v3/auth/{path} is not JSON"))?;
            anyhow::Ok(answer)
        }
    };
    let login = call(
        "authenticate",
        serde_json::json!({"name": "root", "password": root}),
    )
    .await?;
    if login["token"].is_string() {
        return Ok(());
    }
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let steps = [
        (
            "user/add",
            serde_json::json!({"name": "root", "password": root}),
        ),
        (
            "user/grant",
            serde_json::json!({"user": "root", "role": "root"}),
        ),
        ("role/add", serde_json::json!({"name": PATRONI_USER})),
        (
            "role/grant",
            serde_json::json!({"name": PATRONI_USER, "perm": {
                "permType": "READWRITE", "key": b64("/service/"), "range_end": b64("/service0"),
            }}),
        ),
        (
            "user/add",
            serde_json::json!({"name": PATRONI_USER, "password": patroni}),
        ),
        (
            "user/grant",
            serde_json::json!({"user": PATRONI_USER, "role": PATRONI_USER}),
        ),
        ("enable", serde_json::json!({})),
    ];
    for (path, body) in steps {
        let answer = call(path, body).await?;
        // A step a start that stopped half-way already took is not an error.
        let error = answer["error"].as_str().unwrap_or_default();
        if !error.is_empty() && !error.contains("already exists") {
            bail!("etcd refused /v3/auth/{path}: {error}");
        }
    }
    Ok(())
}
