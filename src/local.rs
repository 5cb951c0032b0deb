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
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, User};
use sha2::{Digest, Sha256};

/// The superuser `initdb` creates; local mode and tests connect as this role.
pub const PG_USER: &str = "stockade";
/// The database local mode creates for the application.
pub const PG_DATABASE: &str = "stockade";

/// Options for starting the servers.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    /// Fixed PostgreSQL port; a free one when `None`.
    pub pg_port: Option<u16>,
    /// Fixed Redis port; a free one when `None`.
    pub redis_port: Option<u16>,
    /// Trade durability for speed (fsync off): for tests only.
    pub ephemeral: bool,
}

/// A running PostgreSQL cluster owned by this process.
#[derive(Debug)]
pub struct LocalPostgres {
    child: Option<Child>,
    pub port: u16,
    pub data_dir: PathBuf,
    /// True when this start created the cluster (first start).
    pub created: bool,
    /// The superuser's password (clusters created before passwords were used have none).
    password: Option<String>,
}

impl LocalPostgres {
    /// Starts (creating on first use) the cluster whose data lives in `wanted`.
    pub fn start(wanted: &Path, port: Option<u16>, ephemeral: bool) -> anyhow::Result<Self> {
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
            initdb
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
        Self::spawn(
            &bin,
            owner.as_ref(),
            dir,
            port,
            ephemeral,
            created,
            password,
        )
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
            backup
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
            ephemeral,
            created,
            primary_password,
        )
    }

    fn spawn(
        bin: &Path,
        owner: Option<&User>,
        dir: PathBuf,
        port: u16,
        ephemeral: bool,
        created: bool,
        password: Option<String>,
    ) -> anyhow::Result<Self> {
        let log = fs::File::create(dir.join("postgres.log")).context("postgres.log")?;
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(&dir)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            .args(["-c", "max_connections=500"])
            // A fresh cluster has no old WAL segments to recycle, so each new 16 MB
            // segment would be written full of zeroes, and fsynced, by the commit that
            // needs it: a stall of a tenth of a second or more every second at a flash
            // sale's rate of WAL. A server that has run a while recycles its segments
            // instead. Files created sparse behave like that from the start; durability
            // is the same (fsync and synchronous commit stay on).
            .args(["-c", "wal_init_zero=off"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        if ephemeral {
            cmd.args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
                .args(["-c", "full_page_writes=off"]);
        }
        run_as(&mut cmd, owner);
        let child = cmd.spawn().context("could not start postgres")?;
        let mut pg = Self {
            child: Some(child),
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
                .child
                .as_mut()
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
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Fast shutdown (SIGINT): open transactions roll back, data is kept.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_child(child, Signal::SIGINT, "postgres");
        }
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running Redis server owned by this process.
#[derive(Debug)]
pub struct LocalRedis {
    child: Option<Child>,
    pub port: u16,
    /// Where the files are (may differ from `wanted` when run as root).
    pub dir: PathBuf,
    /// The folder asked for; pass it to `start` again to restart on the same password.
    pub wanted: PathBuf,
    password: String,
}

impl LocalRedis {
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
        let child = cmd.spawn().context("could not start redis-server")?;
        let mut redis = Self {
            child: Some(child),
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
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn wait_until_accepting(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
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

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_child(child, Signal::SIGTERM, "redis-server");
        }
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.stop();
    }
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
        let postgres =
            tokio::task::spawn_blocking(move || LocalPostgres::start(&pg_dir, pg_port, ephemeral))
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
    let mut conn = sqlx::PgConnection::connect(maintenance_url).await?;
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
        && TcpListener::bind(("127.0.0.1", port)).is_ok()
    {
        return Ok(port);
    }
    let port = free_port()?;
    // Only a convenience: a folder that cannot take the file gets a new port next time.
    let _ = fs::write(&file, port.to_string());
    Ok(port)
}

/// A port that was free a moment ago.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

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
fn reachable(dir: &Path, user: &User) -> bool {
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

/// Signals `child` and waits for it, killing it after 20 s.
pub(crate) fn stop_child(mut child: Child, signal: Signal, name: &str) {
    let pid = Pid::from_raw(child.id() as i32);
    if kill(pid, signal).is_err() {
        let _ = child.wait();
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if Instant::now() > deadline => {
                tracing::warn!(name, "did not stop in time; killing it");
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
