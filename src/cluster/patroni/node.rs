//! One node of the cluster: its Patroni, the PostgreSQL that Patroni runs, and (for fault
//! tests) the link its traffic passes through; what a test does to a node (kill it, cut it
//! off, heal it) and how its REST API is asked.

use std::fs;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context;

use super::Daemon;

/// One node: its Patroni (REST API on `daemon.port`) and the PostgreSQL it runs.
pub struct Node {
    /// Its Patroni member name.
    pub name: String,
    pub daemon: Daemon,
    pub pg_port: u16,
    pub data_dir: PathBuf,
    /// The folder of its socket (and of its Patroni's files).
    pub home: PathBuf,
    /// With [`Options::links`]: the proxy its traffic with etcd and the other nodes
    /// passes through, which [`Node::partition`] cuts.
    pub(super) link: Option<Daemon>,
}

impl Node {
    /// Its Patroni REST API.
    pub fn patroni_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.daemon.port)
    }

    /// The postmaster's pid, from its pid file.
    pub fn postmaster_pid(&self) -> Option<i32> {
        let pid = fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        pid.lines().next()?.trim().parse().ok()
    }

    /// SIGKILLs the node: its Patroni and its PostgreSQL, as a machine dying would.
    pub fn kill9(&mut self) {
        let postmaster = self.postmaster_pid();
        self.daemon.kill9_group();
        if let Some(pid) = postmaster {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Cuts the node off from etcd and the other nodes (not from HAProxy, nor the apps
    /// from HAProxy), as a network partition would: its link proxy is killed, so what
    /// passed through it is reset and new connections are refused. Needs
    /// [`Options::links`].
    pub fn partition(&mut self) -> anyhow::Result<()> {
        self.link
            .as_mut()
            .context("the cluster was started without links to cut")?
            .kill9_group();
        Ok(())
    }

    /// The link proxy's pid, with [`Options::links`].
    pub fn link_pid(&self) -> Option<u32> {
        self.link.as_ref()?.pid()
    }

    /// Ends [`Node::partition`].
    pub fn heal(&mut self) -> anyhow::Result<()> {
        self.link
            .as_mut()
            .context("the cluster was started without links to cut")?
            .restart()
    }

    /// Whether its REST API answers 200 at `path` (`/primary`, `/replica`, `/sync`)
    /// within 2 s.
    pub async fn answers(&self, path: &str) -> bool {
        self.answers_within(path, Duration::from_secs(2)).await
    }

    /// Whether its REST API answers 200 at `path` within `timeout`.
    pub async fn answers_within(&self, path: &str, timeout: Duration) -> bool {
        // One client for every ask: building one loads the platform's root certificates
        // (13 ms of CPU each in a debug build here), and the failover test asks every node
        // up to ten times a second. No idle connections kept: a
        // kept one belongs to the runtime that made it, and callers come from several.
        static CLIENT: OnceLock<Option<reqwest::Client>> = OnceLock::new();
        let client = CLIENT.get_or_init(|| {
            crate::install_tls_provider(); // a library caller (a test) may not have
            reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .ok()
        });
        let Some(client) = client else {
            return false;
        };
        client
            .get(format!("{}{path}", self.patroni_url()))
            .timeout(timeout)
            .send()
            .await
            .is_ok_and(|r| r.status().as_u16() == 200)
    }
}
