//! The cluster's other daemons: PgBouncer, the Sentinels and HAProxy, each with its
//! configuration, and [`Daemon`], which keeps one running and can restart or kill it.

use crate::children::Running;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::Signal;
use nix::unistd::User;

use crate::children;
use crate::loadtest::servers::ServerProcess;
use crate::local::{
    self, PG_DATABASE, PG_USER, find_binary, free_port, private_dir, run_as, write_private,
};

use super::{ClusterOptions, DOWN_AFTER, FAILOVER_TIMEOUT, MASTER_NAME, QUORUM, SENTINELS};

/// A server process that is not PostgreSQL or Redis (PgBouncer, a Sentinel, HAProxy),
/// kept with how to start it again.
pub struct Daemon {
    process: Running,
    command: Box<dyn Fn() -> Command + Send + Sync>,
    pub port: u16,
    log: PathBuf,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("name", &self.process.name())
            .field("port", &self.port)
            .finish()
    }
}

impl Daemon {
    pub(super) fn start(
        name: impl Into<String>,
        port: u16,
        log: PathBuf,
        command: impl Fn() -> Command + Send + Sync + 'static,
    ) -> anyhow::Result<Self> {
        let mut daemon = Self {
            process: Running::none(name, Signal::SIGTERM),
            command: Box::new(command),
            port,
            log,
        };
        daemon.restart()?;
        Ok(daemon)
    }

    /// Starts the process again (after [`Daemon::stop`] or [`Daemon::kill9`]) and waits
    /// until it accepts connections.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        let mut cmd = (self.command)();
        cmd.stdin(Stdio::null()).process_group(0);
        let child = crate::children::mark(&mut cmd)
            .spawn()
            .with_context(|| format!("could not start {}", self.process.name()))?;
        self.process.set(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let name = self.process.name().to_owned();
            if let Some(child) = self.process.child()
                && let Err(e) = children::exited(&name, child, &self.log)
            {
                self.process.forget();
                return Err(e);
            }
            // Its own port, not another's: a port that answers before this daemon runs
            // would be someone else's listener (ports are drawn so it cannot be).
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not accept connections on port {} within 20 s; the last lines of \
                     {}:\n{}",
                    self.process.name(),
                    self.port,
                    self.log.display(),
                    children::log_tail(&self.log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An error naming the daemon and quoting its log if it has exited (or was stopped):
    /// every wait on the cluster asks this of its daemons at each tick, so a daemon that
    /// dies fails the wait at once.
    pub fn check(&self) -> anyhow::Result<()> {
        match self.process.pid() {
            Some(pid) => children::check_alive(self.process.name(), pid, &self.log),
            // Stopped or killed on purpose (a fault test's crash): not a failed start.
            None => Ok(()),
        }
    }

    /// The process's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    /// Kills the process and every process of its group at once (SIGKILL): a server and
    /// the children it runs, as a machine dying would take them.
    pub fn kill9_group(&mut self) {
        self.process.kill9_group();
    }

    /// SIGTERM, and waits for the exit.
    pub fn stop(&mut self) {
        self.process.stop();
    }
}

/// Writes `content` to `path` (mode 0600) owned by `owner`, who runs the server reading it.
pub(super) fn write_owned(path: &Path, content: &str, owner: Option<&User>) -> anyhow::Result<()> {
    write_private(path, content)?;
    if let Some(owner) = owner {
        nix::unistd::chown(path, Some(owner.uid), Some(owner.gid))?;
    }
    Ok(())
}

/// PgBouncer in front of the leader (through HAProxy's write port, so its server
/// connections follow a failover: HAProxy cuts those to a node that stops leading, and
/// PgBouncer opens new ones to the next), in session pooling mode: it caps the leader's
/// connections at `pgbouncer_pool` and queues the apps' connections for them. Not
/// transaction pooling: PgBouncer 1.18 hands the server connection back at every Sync
/// outside a transaction, and sqlx sends Parse+Describe+Sync before Bind+Execute+Sync, so
/// a statement would be parsed on one server connection and bound on another (named
/// statements collide at once: "prepared statement sqlx_s_1 already exists"). PgBouncer
/// refuses startup options, so the session timeouts the apps would send are set here, on
/// every server connection (`connect_query`).
pub(super) fn start_pgbouncer(
    dir: &Path,
    owner: Option<User>,
    postgres: &super::Patroni,
    scram_secret: &str,
    options: &ClusterOptions,
) -> anyhow::Result<Daemon> {
    let bin = find_binary("pgbouncer")
        .or_else(|| Some(PathBuf::from("/usr/sbin/pgbouncer")).filter(|p| p.is_file()))
        .context("pgbouncer not found: install it (Debian/Ubuntu: apt-get install pgbouncer)")?;
    let dir = private_dir(&dir.join("pgbouncer"), owner.as_ref())?;
    let port = free_port()?;
    // The role's SCRAM secret, as PostgreSQL keeps it, not its password: PgBouncer checks
    // a login against a secret with a few hashes, but derives one from a password with
    // 4,096 (PBKDF2) at every login, which, single-threaded, caps it at a few hundred
    // logins a second. In a failover every app's pool logs in again and again until the
    // new leader is up; with the password PgBouncer fell behind those logins and opened
    // no connection to the new leader for half a minute. Its own logins to PostgreSQL,
    // a few a second at most, use the password given with the database below.
    let password = postgres.password();
    let userlist = dir.join("userlist.txt");
    write_owned(
        &userlist,
        &format!("\"{PG_USER}\" \"{scram_secret}\"\n"),
        owner.as_ref(),
    )?;
    let s = &options.settings;
    let connect_query = format!(
        "set statement_timeout = {st}; set lock_timeout = {st}; \
         set idle_in_transaction_session_timeout = {tx}",
        st = s.statement_timeout.as_millis(),
        tx = s.idle_in_tx_timeout.as_millis()
    );
    let config = dir.join("pgbouncer.ini");
    write_owned(
        &config,
        &format!(
            "[databases]\n\
             {PG_DATABASE} = host=127.0.0.1 port={pg} dbname={PG_DATABASE} user={PG_USER} \
             password={password} connect_query='{connect_query}'\n\
             * = host=127.0.0.1 port={pg} password={password} connect_query='{connect_query}'\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = scram-sha-256\n\
             auth_file = {userlist}\n\
             pool_mode = session\n\
             default_pool_size = {pool}\n\
             min_pool_size = {pool}\n\
             reserve_pool_size = 4\n\
             reserve_pool_timeout = 1\n\
             query_wait_timeout = 5\n\
             max_client_conn = 4000\n\
             ignore_startup_parameters = extra_float_digits\n\
             server_login_retry = 1\n\
             logfile = {log}\n\
             pidfile = {pid}\n",
            pg = postgres.write_port,
            userlist = userlist.display(),
            pool = options.pgbouncer_pool,
            log = dir.join("pgbouncer.log").display(),
            pid = dir.join("pgbouncer.pid").display(),
        ),
        owner.as_ref(),
    )?;
    Daemon::start("pgbouncer", port, dir.join("pgbouncer.log"), move || {
        let mut cmd = Command::new(&bin);
        cmd.arg(&config).stdout(Stdio::null()).stderr(Stdio::null());
        run_as(&mut cmd, owner.as_ref());
        cmd
    })
}

/// Waits until PgBouncer has opened its server connections (`min_pool_size`, a few a
/// second, once a first client has made it open the pool): apps started before would
/// wait for them at their first requests, and give up.
pub(super) async fn wait_for_server_connections(
    leader_url: &str,
    (pgbouncer, pgbouncer_url): (&Daemon, &str),
    pool: u32,
) -> anyhow::Result<()> {
    use sqlx::Connection;
    let first = crate::pg::connect(pgbouncer_url)
        .await
        .context("cannot connect through PgBouncer")?;
    let db = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(30))
        .connect(leader_url)
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        pgbouncer.check()?;
        // This check's own session is one of the client backends.
        let open = sqlx::query_scalar!(
            r#"select count(*) - 1 as "open!" from pg_stat_activity
                where backend_type = 'client backend' and datname = $1"#,
            PG_DATABASE,
        )
        .fetch_one(&db)
        .await?;
        if open >= i64::from(pool) {
            break;
        }
        if Instant::now() > deadline {
            tracing::warn!(
                open,
                pool,
                "PgBouncer has not opened all its server connections yet"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.close().await;
    first.close().await?;
    Ok(())
}

/// A Sentinel watching the master at `master_port`. Its configuration file is its own to
/// rewrite (Sentinel records what it learns there), so it is written fresh each start.
pub(super) fn start_sentinel(
    dir: &Path,
    owner: Option<User>,
    master_port: u16,
    password: &str,
) -> anyhow::Result<Daemon> {
    let (bin, sentinel_flag) = match find_binary("redis-sentinel") {
        Some(bin) => (bin, false),
        None => (
            find_binary("redis-server").context(
                "redis-sentinel not found: install it (Debian/Ubuntu: apt-get install redis-sentinel)",
            )?,
            true,
        ),
    };
    let dir = private_dir(dir, owner.as_ref())?;
    let port = free_port()?;
    let config = dir.join("sentinel.conf");
    write_owned(
        &config,
        &format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             daemonize no\n\
             set-proc-title no\n\
             dir {dir}\n\
             logfile {log}\n\
             requirepass {password}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {QUORUM}\n\
             sentinel auth-pass {MASTER_NAME} {password}\n\
             sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
             sentinel failover-timeout {MASTER_NAME} {failover}\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n",
            dir = dir.display(),
            log = dir.join("sentinel.log").display(),
            down = DOWN_AFTER.as_millis(),
            failover = FAILOVER_TIMEOUT.as_millis(),
        ),
        owner.as_ref(),
    )?;
    Daemon::start(
        "redis-sentinel",
        port,
        dir.join("sentinel.log"),
        move || {
            // Under umask 077: Sentinel rewrites its configuration (with the Redis password
            // in it) as a new file, which would otherwise be readable by everyone (0644).
            let mut cmd = Command::new("/bin/sh");
            cmd.args(["-c", "umask 077 && exec \"$0\" \"$@\""])
                .arg(&bin)
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if sentinel_flag {
                cmd.arg("--sentinel");
            }
            run_as(&mut cmd, owner.as_ref());
            cmd
        },
    )
}

/// Waits until the Redis replica on `port` has copied its master and follows its stream
/// (`master_link_status:up`): until then a failover would promote an empty replica, and
/// everything kept only in Redis (a drop's queue) would be lost with the master.
pub(super) async fn wait_for_redis_replica(
    servers: [&local::LocalRedis; 2],
    password: &str,
) -> anyhow::Result<()> {
    let port = servers[1].port;
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = redis::Client::open(format!("redis://:{password}@127.0.0.1:{port}"))?;
    loop {
        for server in servers {
            server.check()?;
        }
        // A replica busy loading its master's copy may be slow to answer: not yet, not a
        // failure, until the deadline.
        let info: redis::RedisResult<String> = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
        }
        .await;
        if let Ok(info) = &info
            && info.lines().any(|l| l.trim() == "master_link_status:up")
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the Redis replica on port {port} did not copy its master within 30 s \
                 (last answer: {info:?})"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every Sentinel knows the replica and enough other Sentinels to fail over
/// (`SENTINEL CKQUORUM`), so a failure right after start is handled.
pub(super) async fn wait_for_sentinels(sentinels: &[Daemon], password: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for port in sentinels.iter().map(|s| s.port) {
        let client = redis::Client::open(format!("redis://:{password}@127.0.0.1:{port}"))?;
        loop {
            for sentinel in sentinels {
                sentinel.check()?;
            }
            let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
                if Instant::now() > deadline {
                    bail!("the Sentinel on port {port} did not answer within 30 s");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let quorum = redis::cmd("SENTINEL")
                .arg("ckquorum")
                .arg(MASTER_NAME)
                .query_async::<String>(&mut conn)
                .await;
            let replicas = redis::cmd("SENTINEL")
                .arg("replicas")
                .arg(MASTER_NAME)
                .query_async::<Vec<redis::Value>>(&mut conn)
                .await
                .map(|r| r.len())
                .unwrap_or(0);
            let sentinels = redis::cmd("SENTINEL")
                .arg("sentinels")
                .arg(MASTER_NAME)
                .query_async::<Vec<redis::Value>>(&mut conn)
                .await
                .map(|r| r.len())
                .unwrap_or(0);
            if quorum.is_ok() && replicas > 0 && sentinels + 1 >= SENTINELS {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "the Sentinel on port {port} did not see the replica and the other Sentinels within 30 s"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// HAProxy in front of the apps: round robin, each checked on `/readyz` every half
/// second. The forwarding headers the apps believe (from 127.0.0.1, their trusted proxy)
/// are HAProxy's own, never the client's: `X-Forwarded-Host` is the `Host` it was sent,
/// `X-Forwarded-Proto` is `http` (it listens on plain http), `Forwarded` is dropped, and
/// `X-Forwarded-For` gets the client's address appended (the apps read only that hop). An app is taken out when its PostgreSQL check fails (three checks in a row); a
/// Redis outage leaves it in, as orders go on under the database guard. A request whose
/// connection is refused (a dead app) is sent to another app. If every app fails its
/// check, all of them get traffic again, unchecked (fail open).
pub(super) fn start_haproxy(
    dir: &Path,
    port: u16,
    apps: &[ServerProcess],
) -> anyhow::Result<Daemon> {
    let dir = dir.join("haproxy");
    fs::create_dir_all(&dir)?;
    let mut servers = String::new();
    for (i, app) in apps.iter().enumerate() {
        let addr = app.address.trim_start_matches("http://");
        servers.push_str(&format!("  server app{} {addr} check\n", i + 1));
    }
    // When every app fails its check at once (overload makes the checks wait for a
    // database connection too), failing open beats answering 503 to everyone: the same
    // apps, unchecked, as backups.
    for (i, app) in apps.iter().enumerate() {
        let addr = app.address.trim_start_matches("http://");
        servers.push_str(&format!("  server app{}-open {addr} backup\n", i + 1));
    }
    let config = dir.join("haproxy.cfg");
    write_private(
        &config,
        &format!(
            "global\n\
             \x20 maxconn 4000\n\
             defaults\n\
             \x20 mode http\n\
             \x20 timeout connect 1s\n\
             \x20 timeout client 30s\n\
             \x20 timeout server 30s\n\
             \x20 timeout check 2500ms\n\
             \x20 retries 3\n\
             \x20 option redispatch 1\n\
             \x20 retry-on conn-failure\n\
             frontend shop\n\
             \x20 bind 127.0.0.1:{port}\n\
             \x20 http-request del-header forwarded\n\
             \x20 http-request set-header x-forwarded-host %[req.hdr(host)]\n\
             \x20 http-request set-header x-forwarded-proto http\n\
             \x20 option forwardfor\n\
             \x20 default_backend apps\n\
             backend apps\n\
             \x20 balance roundrobin\n\
             \x20 option httpchk GET /readyz\n\
             \x20 http-check expect rstring postgres.:.ok\n\
             \x20 option allbackups\n\
             \x20 default-server inter 500ms fall 3 rise 2\n\
             {servers}"
        ),
    )?;
    run_haproxy(&dir, config, port)
}

/// The haproxy binary: on `PATH`, or where Debian puts it.
pub(super) fn haproxy_binary() -> anyhow::Result<PathBuf> {
    find_binary("haproxy")
        .or_else(|| Some(PathBuf::from("/usr/sbin/haproxy")).filter(|p| p.is_file()))
        .context("haproxy not found: install it (Debian/Ubuntu: apt-get install haproxy)")
}

/// Runs `haproxy -db -f config` (in the foreground), its output in `dir/haproxy.log`; ready
/// once `port` accepts connections.
pub(super) fn run_haproxy(dir: &Path, config: PathBuf, port: u16) -> anyhow::Result<Daemon> {
    let bin = haproxy_binary()?;
    let log = dir.join("haproxy.log");
    let out = fs::File::create(&log)?;
    Daemon::start("haproxy", port, log, move || {
        let mut cmd = Command::new(&bin);
        cmd.arg("-db").arg("-f").arg(&config);
        log_to(&mut cmd, &out);
        cmd
    })
}

/// Sends a daemon's standard output and error to `log`.
pub(super) fn log_to(cmd: &mut Command, log: &fs::File) {
    if let (Ok(out), Ok(err)) = (log.try_clone(), log.try_clone()) {
        cmd.stdout(Stdio::from(out));
        cmd.stderr(Stdio::from(err));
    }
}
