//! `stockade cluster`: the scaled-out topology as child processes on 127.0.0.1, for
//! development and for the failure tests, which start it through [`Cluster::start`].
//!
//! ```text
//!             HAProxy (health checks on /readyz)
//!            /        |        \
//!        app 1      app 2     app N        `stockade serve`
//!          |  \       |         |
//!          |   PgBouncer (session pooling)
//!          |      |                              reads that may lag
//!          |   HAProxy write port ── leader ─WAL─▶ replicas ◀── HAProxy read port
//!          |      (Patroni nodes, one leader chosen through etcd; see [`patroni`])
//!          └── Redis master ──▶ Redis replica, watched by 3 Sentinels (quorum 2)
//! ```
//!
//! Every server runs as in local mode ([`crate::local`]): from the system's binaries, as
//! an unprivileged user when this process is root, in its own process group so Ctrl-C
//! reaches Stockade only. Dropping the [`Cluster`] stops everything, front to back.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::config::Settings;
use crate::loadtest::servers::ServerProcess;
use crate::local::{LocalRedis, free_port, service_user, write_private};

mod daemons;
pub mod patroni;
mod state;

pub use daemons::Daemon;
use daemons::{
    start_haproxy, start_pgbouncer, start_sentinel, wait_for_redis_replica, wait_for_sentinels,
    wait_for_server_connections,
};
pub use patroni::Patroni;
pub use state::write_state_file;

/// The master name the Sentinels monitor.
pub const MASTER_NAME: &str = "stockade";
/// Sentinels in the cluster, and how many must agree that the master is down.
pub const SENTINELS: usize = 3;
const QUORUM: usize = 2;
/// How long the Sentinels wait before calling a silent master down, and how long a
/// failover may take before another is tried: short, so a failover costs seconds.
pub const DOWN_AFTER: Duration = Duration::from_millis(1_000);
const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3_000);

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Where every server keeps its files, one folder each.
    pub dir: PathBuf,
    /// How many `stockade serve` processes run behind HAProxy.
    pub apps: usize,
    /// The `stockade` executable the app processes run.
    pub exe: PathBuf,
    /// More environment for the app processes (`STOCKADE_*` settings).
    pub app_env: Vec<(String, String)>,
    /// HAProxy's port; a free one when `None`.
    pub port: Option<u16>,
    /// PostgreSQL servers, each run by Patroni: one leads, the others stream from it.
    pub postgres_nodes: usize,
    /// Server connections PgBouncer keeps to the leader; each app's own pool gets an
    /// equal share (unless `app_env` sets `STOCKADE_DB_POOL_SIZE`).
    pub pgbouncer_pool: u32,
    /// Trade durability for speed (fsync off): for tests only.
    pub ephemeral: bool,
    /// Route each PostgreSQL node's traffic with etcd and the other nodes through a proxy
    /// of its own, so a fault test can partition it ([`patroni::Options::links`]).
    pub fault_links: bool,
    /// Archive the leader's WAL to, and keep backups in, this pgBackRest repository.
    pub backups: Option<PathBuf>,
    /// Timeouts the database sessions get from PgBouncer (the apps' own settings).
    pub settings: Settings,
}

/// The running topology. Fields are public so the failure tests can stop and kill parts.
pub struct Cluster {
    pub haproxy: Daemon,
    pub apps: Vec<ServerProcess>,
    pub sentinels: Vec<Daemon>,
    /// The Redis servers: the first starts as master, the second as its replica.
    pub redis: Vec<LocalRedis>,
    pub pgbouncer: Daemon,
    /// PostgreSQL: etcd, the Patroni nodes, and HAProxy's write and read ports.
    pub postgres: Patroni,
    redis_password: String,
    /// The first admin's password when this start created it.
    pub admin_password: Option<String>,
    /// The pgBackRest repository the leader archives to, if any.
    backups: Option<PathBuf>,
}

impl Cluster {
    /// Starts every part, back to front, and waits until each answers.
    pub async fn start(options: ClusterOptions) -> anyhow::Result<Self> {
        fs::create_dir_all(&options.dir)
            .with_context(|| format!("cannot create {}", options.dir.display()))?;
        let dir = options.dir.canonicalize()?;
        let owner = service_user()?;

        let postgres = Patroni::start(
            &dir,
            patroni::Options {
                nodes: options.postgres_nodes.max(1),
                ephemeral: options.ephemeral,
                synchronous: true,
                backups: options.backups.clone(),
                links: options.fault_links,
                clash: false,
            },
        )
        .await?;
        let admin_password = prepare_database(&postgres.database_url()).await?;
        let secret = postgres.scram_secret().await?;
        let pgbouncer = start_pgbouncer(&dir, owner.clone(), &postgres, &secret, &options)?;
        wait_for_server_connections(
            &postgres.database_url(),
            (&pgbouncer, &pgbouncer_url(&postgres, pgbouncer.port)),
            options.pgbouncer_pool,
        )
        .await?;

        let redis_password = redis_password(&dir)?;
        let (pw, a_dir) = (redis_password.clone(), dir.join("redis-a"));
        // A replica's first copy starts at once (the default waits 5 s for more replicas
        // to share it), on either server, as either may be master after a failover.
        const SYNC_NOW: &str = "repl-diskless-sync-delay 0";
        let master =
            blocking(move || LocalRedis::start_with(&a_dir, None, Some(&pw), SYNC_NOW)).await?;
        let follow = format!("replicaof 127.0.0.1 {}\n{SYNC_NOW}", master.port);
        let (pw, b_dir) = (redis_password.clone(), dir.join("redis-b"));
        let redis_replica =
            blocking(move || LocalRedis::start_with(&b_dir, None, Some(&pw), &follow)).await?;
        wait_for_redis_replica([&master, &redis_replica], &redis_password).await?;
        let mut sentinels = Vec::new();
        for i in 0..SENTINELS {
            sentinels.push(start_sentinel(
                &dir.join(format!("sentinel-{}", i + 1)),
                owner.clone(),
                master.port,
                &redis_password,
            )?);
        }
        let sentinel_ports: Vec<u16> = sentinels.iter().map(|s| s.port).collect();
        wait_for_sentinels(&sentinels, &redis_password).await?;

        let mut cluster_env = vec![
            (
                "DATABASE_URL".to_string(),
                pgbouncer_url(&postgres, pgbouncer.port),
            ),
            ("STOCKADE_DATABASE_PGBOUNCER".into(), "true".into()),
            (
                "STOCKADE_DATABASE_REPLICA_URL".into(),
                postgres.replica_url(),
            ),
            (
                "STOCKADE_REDIS_SENTINELS".into(),
                sentinel_ports
                    .iter()
                    .map(|p| format!("127.0.0.1:{p}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("STOCKADE_REDIS_MASTER".into(), MASTER_NAME.into()),
            ("STOCKADE_REDIS_PASSWORD".into(), redis_password.clone()),
            // The Sentinels share the servers' password (`requirepass`).
            (
                "STOCKADE_REDIS_SENTINEL_PASSWORD".into(),
                redis_password.clone(),
            ),
            // HAProxy forwards the client's address.
            ("STOCKADE_TRUSTED_PROXIES".into(), "127.0.0.1".into()),
            ("STOCKADE_LISTEN".into(), "127.0.0.1:0".into()),
            (
                "STOCKADE_DB_POOL_SIZE".into(),
                (options.pgbouncer_pool / options.apps.max(1) as u32)
                    .max(1)
                    .to_string(),
            ),
        ];
        cluster_env.extend(options.app_env.iter().cloned());
        let env: Vec<(&str, String)> = cluster_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let starts =
            (0..options.apps.max(1)).map(|_| ServerProcess::start(&options.exe, &env, &[]));
        let apps = futures_util::future::try_join_all(starts).await?;

        let port = match options.port {
            Some(p) => p,
            None => free_port()?,
        };
        let haproxy = start_haproxy(&dir, port, &apps)?;

        Ok(Self {
            haproxy,
            apps,
            sentinels,
            redis: vec![master, redis_replica],
            pgbouncer,
            postgres,
            redis_password,
            admin_password,
            backups: options.backups.clone(),
        })
    }

    /// The storefront through HAProxy, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.haproxy.port)
    }

    /// The database on whichever node leads, through HAProxy's write port (not through
    /// PgBouncer): for tools and checks.
    pub fn primary_url(&self) -> String {
        self.postgres.database_url()
    }

    /// PgBouncer's URL, as the apps use it.
    pub fn pgbouncer_url(&self) -> String {
        pgbouncer_url(&self.postgres, self.pgbouncer.port)
    }

    /// A replica, through HAProxy's read port.
    pub fn replica_url(&self) -> String {
        self.postgres.replica_url()
    }

    /// `host:port` of each Sentinel.
    pub fn sentinel_addresses(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    /// The URL of the Redis server at `port`, with the cluster's password.
    pub fn redis_url(&self, port: u16) -> String {
        format!("redis://:{}@127.0.0.1:{port}", self.redis_password)
    }

    pub fn redis_password(&self) -> &str {
        &self.redis_password
    }

    /// Where the Sentinels say the master is now.
    pub async fn current_master_port(&self) -> anyhow::Result<u16> {
        let client = redis::Client::open(format!(
            "redis://:{}@127.0.0.1:{}",
            self.redis_password, self.sentinels[0].port
        ))?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME)
            .query_async(&mut conn)
            .await?;
        Ok(port)
    }

    /// What to print for a person: every address and how to reach it.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let base = self.url();
        out.push_str("Stockade cluster is running.\n");
        out.push_str(&format!("  Storefront:  {base}/  (HAProxy)\n"));
        match &self.admin_password {
            Some(pw) => out.push_str(&format!(
                "  Admin:       {base}/admin  (user admin, password {pw}; shown only now)\n"
            )),
            None => out.push_str(&format!("  Admin:       {base}/admin\n")),
        }
        for (i, app) in self.apps.iter().enumerate() {
            out.push_str(&format!("  App {}:       {}/\n", i + 1, app.address));
        }
        out.push_str(&format!(
            "  PostgreSQL:  {}  (HAProxy to the leader)\n",
            self.primary_url()
        ));
        out.push_str(&format!(
            "  Replicas:    {}  (HAProxy to the replicas)\n",
            self.replica_url()
        ));
        for node in &self.postgres.nodes {
            out.push_str(&format!(
                "  Patroni {}: {}  (PostgreSQL on port {}, data in {})\n",
                node.name,
                node.patroni_url(),
                node.pg_port,
                node.data_dir.display()
            ));
        }
        out.push_str(&format!(
            "  etcd:        http://127.0.0.1:{}  (Patroni's leader key)\n",
            self.postgres.etcd.port
        ));
        out.push_str(&format!(
            "  PgBouncer:   {}  (session pooling)\n",
            self.pgbouncer_url()
        ));
        for (i, r) in self.redis.iter().enumerate() {
            out.push_str(&format!(
                "  Redis {}:     {}  ({})\n",
                i + 1,
                self.redis_url(r.port),
                if i == 0 {
                    "master at start"
                } else {
                    "replica at start"
                }
            ));
        }
        out.push_str(&format!(
            "  Sentinels:   {}  (master name {MASTER_NAME})\n",
            self.sentinel_addresses().join(",")
        ));
        if let Some(dir) = &self.backups {
            out.push_str(&format!(
                "  Backups:     {}  (pgBackRest, the leader's WAL archived)\n",
                dir.display()
            ));
        }
        out
    }

    /// Stops everything, front to back; blocks until each has exited.
    pub fn stop(mut self) {
        self.haproxy.stop();
        for app in &mut self.apps {
            app.stop();
        }
        for s in &mut self.sentinels {
            s.stop();
        }
        for r in &mut self.redis {
            r.stop();
        }
        self.pgbouncer.stop();
        self.postgres.stop();
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(work).await?
}

/// Migrates the database, seeds the demo catalogue and makes the first admin on first
/// start (returning its password); the apps, behind PgBouncer, do not migrate.
async fn prepare_database(url: &str) -> anyhow::Result<Option<String>> {
    use sqlx::Connection;
    let mut conn = crate::pg::connect(url).await?;
    crate::startup::MIGRATOR
        .run(&mut conn)
        .await
        .context("could not apply database migrations")?;
    conn.close().await?;
    let db = sqlx::PgPool::connect(url).await?;
    let products = sqlx::query_scalar!(r#"select count(*) as "count!" from products"#)
        .fetch_one(&db)
        .await?;
    if products == 0 {
        crate::seed::seed_demo(&db).await?;
    }
    let mut password = None;
    if crate::admin::count_admins(&db).await? == 0 {
        let pw = crate::admin::generate_password();
        crate::admin::create_admin(&db, "admin", &pw).await?;
        password = Some(pw);
    }
    db.close().await;
    Ok(password)
}

fn pgbouncer_url(postgres: &Patroni, port: u16) -> String {
    postgres
        .database_url()
        .replace(&format!(":{}/", postgres.write_port), &format!(":{port}/"))
}

/// The Redis password the cluster's servers share, kept in the cluster's folder.
fn redis_password(dir: &Path) -> anyhow::Result<String> {
    let file = dir.join("redis.password");
    if let Ok(p) = fs::read_to_string(&file)
        && !p.trim().is_empty()
    {
        return Ok(p.trim().to_string());
    }
    let p = uuid::Uuid::new_v4().simple().to_string();
    write_private(&file, &p)?;
    Ok(p)
}
