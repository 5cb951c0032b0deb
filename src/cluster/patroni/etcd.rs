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
