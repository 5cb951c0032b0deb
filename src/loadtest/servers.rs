//! `stockade serve` processes started by the load tester (and the integration tests):
//! several server processes against one PostgreSQL and Redis, as in production.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;

/// A running `stockade serve` child process.
#[derive(Debug)]
pub struct ServerProcess {
    /// Its storefront URL, without a trailing slash.
    pub address: String,
    /// What it printed at startup.
    pub stdout: Vec<String>,
    child: Option<Child>,
}

/// How long a server may take to say it serves.
const START_WITHIN: Duration = Duration::from_secs(120);

/// The environment variable the test suite marks its processes with.
const SUITE_MARK: &str = "SUITE_RUN_ID";

impl ServerProcess {
    /// Runs `exe serve args…` with exactly `env` (plus `PATH`) and waits until it serves.
    pub async fn start(exe: &Path, env: &[(&str, String)], args: &[&str]) -> anyhow::Result<Self> {
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        // The one variable kept through the cleared environment: the mark the test suite
        // (scripts/test-suite.sh) gives every process a run starts, so a server started by
        // a bench or load test under test is found as that run's if it outlives it.
        if let Some(mark) = std::env::var_os(SUITE_MARK) {
            cmd.env(SUITE_MARK, mark);
        }
        let mut child = crate::children::mark(&mut cmd)
            .spawn()
            .with_context(|| format!("cannot run {}", exe.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let reading = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut lines = Vec::new();
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                lines.push(line.trim_end().to_string());
                if line.starts_with("Press Ctrl-C") {
                    // Keep draining so the child never blocks on a full pipe.
                    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
                    break;
                }
                line.clear();
            }
            lines
        });
        // Local mode may first create and migrate its database: patient, but not forever.
        // A server that exits ends the reading at once (its output closes).
        let lines = match tokio::time::timeout(START_WITHIN, reading).await {
            Ok(lines) => lines?,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "stockade serve did not say it was serving within {} s",
                    START_WITHIN.as_secs()
                );
            }
        };
        let mut server = Self {
            address: String::new(),
            stdout: lines,
            child: Some(child),
        };
        match server.printed("Storefront") {
            Some(url) => server.address = url.trim_end_matches('/').to_string(),
            None => {
                server.stop();
                bail!("stockade serve did not start: {:?}", server.stdout);
            }
        }
        Ok(server)
    }

    /// The value printed after `label:` at startup (e.g. `PostgreSQL`).
    pub fn printed(&self, label: &str) -> Option<String> {
        self.stdout.iter().find_map(|l| {
            let rest = l.trim().strip_prefix(label)?.strip_prefix(':')?;
            Some(rest.trim().to_string())
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Peak resident memory (VmHWM) in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Freezes the process (SIGSTOP) and returns once it has stopped: its sockets stay open
    /// but nothing answers, as when a machine stalls. `ESRCH` once it has been stopped.
    pub fn pause(&self) -> nix::Result<()> {
        let pid = self.signal(Signal::SIGSTOP)?;
        // Signals arrive asynchronously: wait until every thread has stopped (or the
        // process died), without reaping it.
        waitid(
            Id::Pid(pid),
            WaitPidFlag::WSTOPPED | WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
        )?;
        Ok(())
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&self) -> nix::Result<()> {
        self.signal(Signal::SIGCONT).map(drop)
    }

    /// Kills the process at once (SIGKILL), as a crash would, and waits for it: no
    /// shutdown runs. Afterwards the process counts as stopped.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
    }

    /// Sends `signal`; returns the pid it went to.
    fn signal(&self, signal: Signal) -> nix::Result<Pid> {
        let child = self.child.as_ref().ok_or(Errno::ESRCH)?;
        let pid = Pid::from_raw(child.id() as i32);
        kill(pid, signal)?;
        Ok(pid)
    }

    /// SIGTERM, then waits for the exit (killing it after 60 s); true on a clean exit.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let pid = Pid::from_raw(child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        // A paused process would hold the SIGTERM until it runs again.
        let _ = kill(pid, Signal::SIGCONT);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return false;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(_) => return false,
            }
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
