//! Local mode: PostgreSQL and Redis started from the system's binaries as child processes,
//! with their data under one folder, so `stockade serve` needs nothing set up beforehand.
//!
//! The same code starts the throwaway servers of the integration tests.
//!
//! PostgreSQL refuses to run as root. When this process is root, the cluster runs as the
//! `postgres` user (or `nobody`); if that user cannot reach the data folder (say it sits
//! under `/root`), the cluster lives in `/var/lib/stockade/<hash>` instead and the log says
//! where. Children get their own process group, so Ctrl-C reaches Stockade only, which then
//! stops the servers in order. Servers left behind by a killed run are stopped at the next
//! start, which reuses their data.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, User};
use sha2::{Digest, Sha256};

/// The superuser `initdb` creates; local mode and tests connect as this role.
pub const PG_USER: &str = "stockade";
/// The database local mode creates for the application.
pub const PG_DATABASE: &str = "stockade";

pub mod backups;
mod postgres;
mod redis;
mod stripe;

pub use postgres::LocalPostgres;
pub use redis::LocalRedis;
pub use stripe::LocalStripe;

/// Local mode's `max_connections`. A restored copy must allow at least as many as the
/// server its WAL came from, or its recovery stops.
pub(crate) const MAX_CONNECTIONS: u32 = 500;

/// Options for starting the servers.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    /// Fixed PostgreSQL port; a free one when `None`.
    pub pg_port: Option<u16>,
    /// Fixed Redis port; a free one when `None`.
    pub redis_port: Option<u16>,
    /// Trade durability for speed (fsync off): for tests only.
    pub ephemeral: bool,
    /// Archive PostgreSQL's WAL to, and keep backups in, this pgBackRest repository.
    pub backups: Option<PathBuf>,
}

/// Both servers of local mode.
#[derive(Debug)]
pub struct LocalServices {
    pub postgres: LocalPostgres,
    pub redis: LocalRedis,
}

impl LocalServices {
    /// Starts PostgreSQL and Redis under `data_dir` and creates the application database.
    pub async fn start(data_dir: &Path, options: &LocalOptions) -> anyhow::Result<Self> {
        fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create data folder {}", data_dir.display()))?;
        let data_dir = data_dir.canonicalize()?;
        let (pg_dir, redis_dir) = (data_dir.join("postgres"), data_dir.join("redis"));
        let (pg_port, ephemeral) = (options.pg_port, options.ephemeral);
        let backups = options.backups.clone();
        let postgres = tokio::task::spawn_blocking(move || {
            let repo = backups.as_deref().map(backups::Repo::open).transpose()?;
            LocalPostgres::start(&pg_dir, pg_port, ephemeral, repo.as_ref())
        })
        .await??;
        let redis_port = options.redis_port;
        let redis = tokio::task::spawn_blocking(move || LocalRedis::start(&redis_dir, redis_port))
            .await??;
        create_database(&postgres.url("postgres"), PG_DATABASE).await?;
        Ok(Self { postgres, redis })
    }

    pub fn database_url(&self) -> String {
        self.postgres.url(PG_DATABASE)
    }

    pub fn redis_url(&self) -> String {
        self.redis.url()
    }

    /// Stops Redis, then PostgreSQL; blocks until both have exited.
    pub fn stop(mut self) {
        self.redis.stop();
        self.postgres.stop();
    }
}

/// Creates `name` unless it exists.
pub async fn create_database(maintenance_url: &str, name: &str) -> anyhow::Result<()> {
    use sqlx::Connection;
    let mut conn = crate::pg::connect(maintenance_url).await?;
    let exists: bool = sqlx::query_scalar!(
        r#"select exists (select 1 from pg_database where datname = $1) as "exists!""#,
        name,
    )
    .fetch_one(&mut conn)
    .await?;
    if !exists {
        // Identifiers cannot be bound (so this stays a runtime string, not `query!`);
        // callers pass fixed names or generated ones.
        let sql = format!(r#"create database "{}""#, name.replace('"', ""));
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await?;
    }
    conn.close().await?;
    Ok(())
}

/// The port a server whose files are in `wanted` used last time (kept beside the folder,
/// `<name>.port`) if it is free now, else a free one, remembered for next time: so the
/// URLs local mode prints (`DATABASE_URL` for `stockade admin …`) stay valid across
/// restarts.
fn remembered_port(wanted: &Path, name: &str) -> anyhow::Result<u16> {
    let stem = wanted.file_name().and_then(|n| n.to_str()).unwrap_or(name);
    let file = wanted.with_file_name(format!("{stem}.port"));
    if let Some(port) = fs::read_to_string(&file)
        .ok()
        .and_then(|s| s.trim().parse::<u16>().ok())
        && crate::children::ports::claim_port(port)
    {
        return Ok(port);
    }
    let port = free_port()?;
    // Only a convenience: a folder that cannot take the file gets a new port next time.
    let _ = fs::write(&file, port.to_string());
    Ok(port)
}

pub use crate::children::free_port;

/// Looks for `name` on `PATH`.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The folder holding `postgres` and `initdb`: `PATH` first, then Debian's versioned folders.
pub(crate) fn postgres_bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(p) = find_binary("postgres").and_then(|p| fs::canonicalize(p).ok())
        && let Some(dir) = p.parent()
        && dir.join("initdb").is_file()
    {
        return Ok(dir.to_path_buf());
    }
    let mut versions: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("postgres").is_file() && bin.join("initdb").is_file())
        .collect();
    versions.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions.pop().context(
        "PostgreSQL server binaries (postgres, initdb) not found: install PostgreSQL \
         (Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; \
         macOS: brew install postgresql) or set DATABASE_URL",
    )
}

/// The unprivileged user PostgreSQL runs as when this process is root.
pub(crate) fn service_user() -> anyhow::Result<Option<User>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        if let Some(user) = User::from_name(name)? {
            return Ok(Some(user));
        }
    }
    bail!("running as root, but neither a `postgres` nor a `nobody` user exists to run PostgreSQL")
}

pub(crate) fn run_as(cmd: &mut Command, user: Option<&User>) {
    if let Some(user) = user {
        cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        cmd.env("HOME", &user.dir);
    }
}

/// Writes `content` to `path`, readable and writable by its owner only.
pub(crate) fn write_private(path: &Path, content: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(content.as_bytes())?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// A server's folder, created with the right owner and mode 0700. As root, falls back to
/// `/var/lib/stockade/<hash>` when `owner` cannot reach `wanted`.
pub(crate) fn private_dir(wanted: &Path, owner: Option<&User>) -> anyhow::Result<PathBuf> {
    fs::create_dir_all(wanted).with_context(|| format!("cannot create {}", wanted.display()))?;
    let wanted = wanted.canonicalize()?;
    let Some(owner) = owner else {
        fs::set_permissions(&wanted, fs::Permissions::from_mode(0o700))?;
        return Ok(wanted);
    };
    let dir = if reachable(&wanted, owner) {
        wanted
    } else {
        let digest = hex::encode(Sha256::digest(wanted.as_os_str().as_encoded_bytes()));
        let fallback = Path::new("/var/lib/stockade").join(&digest[..16]);
        tracing::info!(
            wanted = %wanted.display(),
            using = %fallback.display(),
            user = %owner.name,
            "the PostgreSQL user cannot reach the data folder; keeping the cluster elsewhere"
        );
        fs::create_dir_all(&fallback)?;
        fs::set_permissions("/var/lib/stockade", fs::Permissions::from_mode(0o755))?;
        fs::write(wanted.join("LOCATION"), format!("{}\n", fallback.display()))?;
        fallback
    };
    nix::unistd::chown(&dir, Some(owner.uid), Some(owner.gid))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

/// Whether `user` can traverse every ancestor of `dir`.
pub(crate) fn reachable(dir: &Path, user: &User) -> bool {
    dir.ancestors().skip(1).all(|p| {
        let Ok(meta) = fs::metadata(p) else {
            return false;
        };
        let mode = meta.mode();
        if meta.uid() == user.uid.as_raw() {
            mode & 0o100 != 0
        } else if meta.gid() == user.gid.as_raw() {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        }
    })
}

/// Stops a server an earlier, killed run left behind, found through its pid file. The
/// process must be `command` working in `dir`, so a reused pid is never signalled.
pub(crate) fn stop_leftover(pidfile: &Path, command: &str, dir: &Path) -> anyhow::Result<()> {
    let Ok(text) = fs::read_to_string(pidfile) else {
        return Ok(());
    };
    let Some(pid) = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<i32>().ok())
    else {
        return Ok(());
    };
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let cwd = fs::read_link(format!("/proc/{pid}/cwd")).ok();
    if comm.trim() != command || cwd.as_deref() != Some(dir) {
        return Ok(()); // stale file; the server cleans it up itself
    }
    tracing::warn!(
        pid,
        command,
        "stopping a server left running by an earlier run"
    );
    let pid = Pid::from_raw(pid);
    let _ = kill(pid, Signal::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(30);
    while kill(pid, None).is_ok() && Path::new(&format!("/proc/{pid}")).exists() {
        if Instant::now() > deadline {
            bail!("{command} (pid {pid}) from an earlier run did not stop; stop it by hand");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
