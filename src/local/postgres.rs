//! Local mode's PostgreSQL: a cluster of its own, created on first start.

use crate::children::Running;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::Signal;
use nix::unistd::User;

use super::backups::Repo;
use super::{
    MAX_CONNECTIONS, PG_USER, postgres_bin_dir, private_dir, remembered_port, run_as, service_user,
    stop_leftover, write_private,
};

/// How [`LocalPostgres::spawn`] starts the server.
struct Spawn {
    ephemeral: bool,
    /// Whether this start created the cluster.
    created: bool,
    /// More `-c name=value` arguments (given later, they win over earlier ones).
    settings: Vec<String>,
}

/// A running PostgreSQL cluster owned by this process.
#[derive(Debug)]
pub struct LocalPostgres {
    /// First, so that it is stopped before anything else of this is dropped.
    process: Running,
    pub port: u16,
    pub data_dir: PathBuf,
    /// True when this start created the cluster (first start).
    pub created: bool,
    /// The superuser's password (clusters created before passwords were used have none).
    password: Option<String>,
}

impl LocalPostgres {
    /// Starts (creating on first use) the cluster whose data lives in `wanted`; with
    /// `backups`, archiving its WAL there (and taking a first full backup if it has none).
    pub fn start(
        wanted: &Path,
        port: Option<u16>,
        ephemeral: bool,
        backups: Option<&Repo>,
    ) -> anyhow::Result<Self> {
        let bin = postgres_bin_dir()?;
        let owner = service_user()?;
        let dir = private_dir(wanted, owner.as_ref())?;
        stop_leftover(&dir.join("postmaster.pid"), "postgres", &dir)?;

        // The password lives beside the data folder, readable by this user only.
        let password_file = wanted.with_file_name(format!(
            "{}.password",
            wanted
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("postgres")
        ));
        let created = !dir.join("PG_VERSION").exists();
        if created {
            tracing::info!(dir = %dir.display(), "creating PostgreSQL cluster");
            let password = uuid::Uuid::new_v4().simple().to_string();
            write_private(&password_file, &password)?;
            // initdb (running as the cluster's owner) reads the password from a file in a
            // private folder beside the cluster; both go as soon as it is done.
            let secret_dir = dir
                .parent()
                .unwrap_or(Path::new("/tmp"))
                .join(format!(".initdb-{}", uuid::Uuid::new_v4().simple()));
            fs::create_dir(&secret_dir)?;
            fs::set_permissions(&secret_dir, fs::Permissions::from_mode(0o700))?;
            let pwfile = secret_dir.join("password");
            write_private(&pwfile, &password)?;
            if let Some(owner) = &owner {
                nix::unistd::chown(&secret_dir, Some(owner.uid), Some(owner.gid))?;
                nix::unistd::chown(&pwfile, Some(owner.uid), Some(owner.gid))?;
            }
            let mut initdb = Command::new(bin.join("initdb"));
            crate::children::mark(&mut initdb)
                .arg("-D")
                .arg(&dir)
                .args([
                    "-U",
                    PG_USER,
                    "--auth=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--no-locale",
                ])
                .arg(format!("--pwfile={}", pwfile.display()));
            if ephemeral {
                initdb.arg("--no-sync");
            }
            run_as(&mut initdb, owner.as_ref());
            let out = initdb.output().context("could not run initdb");
            let _ = fs::remove_dir_all(&secret_dir);
            let out = out?;
            if !out.status.success() {
                bail!(
                    "initdb failed:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }

        let port = port.map_or_else(|| remembered_port(wanted, "postgres"), Ok)?;
        let password = fs::read_to_string(&password_file)
            .ok()
            .map(|p| p.trim().to_string());
        let mut settings = Vec::new();
        if let Some(repo) = backups {
            repo.configure(&dir, port, password.as_deref())?;
            settings = repo.server_settings();
        }
        let pg = Self::spawn(
            &bin,
            owner.as_ref(),
            dir,
            port,
            Spawn {
                ephemeral,
                created,
                settings,
            },
            password,
        )?;
        if let Some(repo) = backups {
            repo.prepare()?;
        }
        Ok(pg)
    }

    /// Starts a streaming replica of the primary on `primary_port` with its data in `wanted`: on first use a
    /// base backup of the primary (`pg_basebackup -R`, which also writes how to follow it).
    /// It takes the primary's password and answers read-only queries.
    pub fn start_replica_of(
        primary_port: u16,
        primary_password: Option<String>,
        wanted: &Path,
        port: Option<u16>,
        ephemeral: bool,
    ) -> anyhow::Result<Self> {
        let bin = postgres_bin_dir()?;
        let owner = service_user()?;
        let dir = private_dir(wanted, owner.as_ref())?;
        stop_leftover(&dir.join("postmaster.pid"), "postgres", &dir)?;
        let created = !dir.join("PG_VERSION").exists();
        if created {
            tracing::info!(dir = %dir.display(), "copying the primary for a streaming replica");
            let mut backup = Command::new(bin.join("pg_basebackup"));
            crate::children::mark(&mut backup)
                .arg("-D")
                .arg(&dir)
                .args(["-h", "127.0.0.1", "-p", &primary_port.to_string()])
                .args(["-U", PG_USER, "-R", "-X", "stream", "--checkpoint=fast"]);
            if ephemeral {
                backup.arg("--no-sync");
            }
            if let Some(pw) = &primary_password {
                backup.env("PGPASSWORD", pw);
            }
            run_as(&mut backup, owner.as_ref());
            let out = backup.output().context("could not run pg_basebackup")?;
            if !out.status.success() {
                bail!(
                    "pg_basebackup failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let port = port.map_or_else(|| remembered_port(wanted, "replica"), Ok)?;
        Self::spawn(
            &bin,
            owner.as_ref(),
            dir,
            port,
            Spawn {
                ephemeral,
                created,
                settings: Vec::new(),
            },
            primary_password,
        )
    }

    fn spawn(
        bin: &Path,
        owner: Option<&User>,
        dir: PathBuf,
        port: u16,
        how: Spawn,
        password: Option<String>,
    ) -> anyhow::Result<Self> {
        let Spawn {
            ephemeral,
            created,
            settings,
        } = how;
        let log = fs::File::create(dir.join("postgres.log")).context("postgres.log")?;
        // The server's own file (it is in the data folder, and so in its backups).
        if let Some(owner) = owner {
            nix::unistd::chown(&dir.join("postgres.log"), Some(owner.uid), Some(owner.gid))?;
        }
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(&dir)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            .args(["-c", &format!("max_connections={MAX_CONNECTIONS}")])
            // A fresh cluster has no old WAL segments to recycle, so each new 16 MB
            // segment would be written full of zeroes, and fsynced, by the commit that
            // needs it: a stall of a tenth of a second or more every second at a flash
            // sale's rate of WAL. A server that has run a while recycles its segments
            // instead. Files created sparse behave like that from the start; durability
            // is the same (fsync and synchronous commit stay on).
            .args(["-c", "wal_init_zero=off"]);
        if !ephemeral {
            cmd.args(lasting_settings());
        }
        cmd.args(settings)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        if ephemeral {
            cmd.args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
                .args(["-c", "full_page_writes=off"]);
        }
        run_as(&mut cmd, owner);
        let child = crate::children::mark(&mut cmd)
            .spawn()
            .context("could not start postgres")?;
        let mut pg = Self {
            process: Running::new(child, "postgres", Signal::SIGINT),
            port,
            data_dir: dir,
            created,
            password,
        };
        pg.wait_until_accepting()?;
        Ok(pg)
    }

    /// URL of `database` on this cluster.
    pub fn url(&self, database: &str) -> String {
        match &self.password {
            Some(pw) => format!(
                "postgres://{PG_USER}:{pw}@127.0.0.1:{}/{database}",
                self.port
            ),
            None => format!("postgres://{PG_USER}@127.0.0.1:{}/{database}", self.port),
        }
    }

    fn wait_until_accepting(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self
                .process
                .child()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log =
                    fs::read_to_string(self.data_dir.join("postgres.log")).unwrap_or_default();
                bail!("postgres exited with {status} while starting:\n{log}");
            }
            // The server answers on TCP before it accepts logins; pg_isready's job, done by
            // reading the startup log line instead of adding a client dependency here.
            let log = fs::read_to_string(self.data_dir.join("postgres.log")).unwrap_or_default();
            // A standby says "ready to accept read-only connections".
            if log.contains("database system is ready to accept") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("postgres did not become ready within 60 s:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The superuser's password, if the cluster has one.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// Fast shutdown (SIGINT): open transactions roll back, data is kept.
    pub fn stop(&mut self) {
        self.process.stop();
    }
}

/// Settings for a server that keeps its data and runs for months (not a test's throwaway
/// one), given on the command line so they win over `postgresql.conf` and `ALTER SYSTEM`.
///
/// PostgreSQL's defaults are sized for a small machine: 128 MB of shared buffers and a
/// checkpoint every ~540 MB of WAL (`max_wal_size` 1 GB ÷ 1.9). A shop at a flash sale's
/// rate writes about 870 MB of WAL a minute and grows two indexes keyed by clients' random
/// idempotency keys, whose pages are touched anywhere. With the defaults those indexes
/// soon outgrow the buffers, and a checkpoint every minute or so writes each page touched
/// since the last one in full to the WAL again (full-page images) and flushes it: p99
/// then rises with the tables. So: a quarter of the memory this process may use for
/// buffers (the usual advice, at most 4 GB, at least the default), and checkpoints at
/// most every 15 minutes and at most every ~8.4 GB of WAL (16 GB ÷ 1.9): about every
/// 10 minutes at a sale's rate. Recovery after a crash replays at most that WAL.
fn lasting_settings() -> Vec<String> {
    let memory = usable_memory(
        fs::read_to_string("/proc/meminfo").ok().as_deref(),
        fs::read_to_string("/sys/fs/cgroup/memory.max")
            .ok()
            .as_deref(),
    );
    [
        format!("shared_buffers={}MB", shared_buffers_mb(memory)),
        "max_wal_size=16GB".to_string(),
        "checkpoint_timeout=15min".to_string(),
    ]
    .into_iter()
    .flat_map(|setting| ["-c".to_string(), setting])
    .collect()
}

/// A quarter of `memory` (bytes), in MB, between PostgreSQL's default and 4 GB.
fn shared_buffers_mb(memory: Option<u64>) -> u64 {
    const MB: u64 = 1024 * 1024;
    memory.map_or(128, |total| (total / 4 / MB).clamp(128, 4096))
}

/// The memory this process may use, in bytes: the machine's (`/proc/meminfo`'s text), or
/// its cgroup's limit (`memory.max`: bytes or `max`) where that is lower.
fn usable_memory(meminfo: Option<&str>, cgroup_max: Option<&str>) -> Option<u64> {
    let total = meminfo.and_then(memory_total);
    let limit = cgroup_max.and_then(|max| max.trim().parse::<u64>().ok());
    [total, limit].into_iter().flatten().min()
}

/// `MemTotal` from `/proc/meminfo`'s text, in bytes.
fn memory_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_total_reads_meminfo() {
        let info = "MemTotal:       24576000 kB\nMemFree:        20000000 kB\n";
        assert_eq!(memory_total(info), Some(24_576_000 * 1024));
        assert_eq!(memory_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn a_lower_cgroup_limit_wins_over_the_machines_memory() {
        let info = "MemTotal:       24576000 kB\n";
        let machine = 24_576_000 * 1024;
        assert_eq!(usable_memory(Some(info), Some("max\n")), Some(machine));
        assert_eq!(usable_memory(Some(info), None), Some(machine));
        assert_eq!(
            usable_memory(Some(info), Some("2147483648\n")),
            Some(2_147_483_648)
        );
        assert_eq!(
            usable_memory(None, Some("2147483648\n")),
            Some(2_147_483_648)
        );
        assert_eq!(usable_memory(None, None), None);
    }

    #[test]
    fn shared_buffers_are_a_quarter_of_memory_within_bounds() {
        const GB: u64 = 1024 * 1024 * 1024;
        assert_eq!(shared_buffers_mb(Some(2 * GB)), 512);
        assert_eq!(shared_buffers_mb(Some(24 * GB)), 4096);
        assert_eq!(shared_buffers_mb(Some(GB / 4)), 128);
        assert_eq!(shared_buffers_mb(None), 128);
    }
}
