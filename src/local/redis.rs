//! Local mode's Redis: a password-protected server that persists nothing.

use crate::children::Running;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::Signal;

use super::{
    find_binary, private_dir, remembered_port, run_as, service_user, stop_leftover, write_private,
};

/// A running Redis server owned by this process.
#[derive(Debug)]
pub struct LocalRedis {
    process: Running,
    pub port: u16,
    /// Where the files are (may differ from `wanted` when run as root).
    pub dir: PathBuf,
    /// The folder asked for; pass it to `start` again to restart on the same password.
    pub wanted: PathBuf,
    password: String,
}

impl LocalRedis {
    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Starts Redis with its files in `wanted`. Leases are short-lived, so nothing is
    /// persisted. As root it runs as the unprivileged service user; it always requires a
    /// password, kept beside the folder.
    pub fn start(wanted: &Path, port: Option<u16>) -> anyhow::Result<Self> {
        Self::start_with(wanted, port, None, "")
    }

    /// [`LocalRedis::start`] with a given password (instead of the one kept beside the
    /// folder) and more configuration lines, e.g. `replicaof 127.0.0.1 6379`. Its
    /// `masterauth` is its own password, so servers sharing one can replicate each other.
    pub fn start_with(
        wanted: &Path,
        port: Option<u16>,
        password: Option<&str>,
        config_lines: &str,
    ) -> anyhow::Result<Self> {
        let bin = find_binary("redis-server").context(
            "redis-server not found: install Redis (Debian/Ubuntu: apt-get install redis-server)",
        )?;
        let owner = service_user()?;
        let dir = private_dir(wanted, owner.as_ref())?;
        let pidfile = dir.join("redis.pid");
        stop_leftover(&pidfile, "redis-server", &dir)?;
        let password_file = wanted.with_file_name(format!(
            "{}.password",
            wanted
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("redis")
        ));
        let password = match (password, fs::read_to_string(&password_file)) {
            (Some(given), _) => {
                write_private(&password_file, given)?;
                given.to_string()
            }
            (None, Ok(p)) if !p.trim().is_empty() => p.trim().to_string(),
            _ => {
                let p = uuid::Uuid::new_v4().simple().to_string();
                write_private(&password_file, &p)?;
                p
            }
        };
        // The password goes in a config file, not the command line other users can read.
        let config = dir.join("redis.conf");
        write_private(
            &config,
            &format!("requirepass {password}\nmasterauth {password}\n{config_lines}\n"),
        )?;
        if let Some(owner) = &owner {
            nix::unistd::chown(&config, Some(owner.uid), Some(owner.gid))?;
        }
        let port = port.map_or_else(|| remembered_port(wanted, "redis"), Ok)?;
        let mut cmd = Command::new(bin);
        cmd.arg(&config)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            // The process keeps its command line and environment as started (Redis would
            // write its title over them), so tools and test harnesses can tell whose it is.
            .args(["--set-proc-title", "no"])
            .arg("--dir")
            .arg(&dir)
            .arg("--pidfile")
            .arg(&pidfile)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        run_as(&mut cmd, owner.as_ref());
        let child = crate::children::mark(&mut cmd)
            .spawn()
            .context("could not start redis-server")?;
        let mut redis = Self {
            process: Running::new(child, "redis-server", Signal::SIGTERM),
            port,
            dir,
            wanted: wanted.to_path_buf(),
            password,
        };
        redis.wait_until_accepting()?;
        Ok(redis)
    }

    pub fn url(&self) -> String {
        format!("redis://:{}@127.0.0.1:{}", self.password, self.port)
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    /// Kills the server at once (SIGKILL), as a crash would, and waits for it.
    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    fn wait_until_accepting(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self
                .process
                .child()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log = fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                bail!("redis-server exited with {status} while starting:\n{log}");
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("redis-server did not accept connections within 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An error naming this server and quoting its log if it has exited (one stopped on
    /// purpose is not counted): waits on it end at once rather than at their deadline.
    pub fn check(&self) -> anyhow::Result<()> {
        match self.process.pid() {
            Some(pid) => crate::children::check_alive(
                &format!("redis-server on port {}", self.port),
                pid,
                &self.dir.join("redis.log"),
            ),
            None => Ok(()),
        }
    }

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    pub fn stop(&mut self) {
        self.process.stop();
    }
}
