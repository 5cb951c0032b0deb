//! PostgreSQL made highly available by Patroni, with etcd as its consensus store.
//!
//! Each node is a Patroni process that runs its own PostgreSQL and holds or watches the
//! leader key in etcd; the node holding it is the primary, the others stream from it.
//! Which node leads is decided by Patroni alone: HAProxy asks every node's REST API
//! (`/primary`, `/replica`) and sends writes to the one that answers 200 as primary, reads
//! to the replicas. Nothing here, and nothing in the app, picks a primary.
//!
//! - `synchronous_mode: true`: a commit is acknowledged only once a standby has it, and
//!   Patroni promotes only a node that was the synchronous standby, so a primary lost
//!   with its node loses no acknowledged commit (RPO 0).
//! - `synchronous_mode_strict: false`: when no standby is left, the primary goes on alone
//!   rather than refuse every write. That trades durability for availability only while
//!   the cluster is already degraded, and the lone primary's commits are not lost by a
//!   failover either: Patroni will not promote a standby that was not in sync.
//! - Timing: the leader key lives `ttl` (20 s, Patroni's floor) after its holder stops
//!   renewing it; `loop_wait` 2 s and `retry_timeout` 5 s keep `loop_wait + 2 ×
//!   retry_timeout` (12 s) under it. A postmaster that dies under a live Patroni is
//!   restarted in place and, should that not bring it up within `master_start_timeout`
//!   (10 s), failed over.
//! - A failed leader that comes back rejoins as a replica, rewound with `pg_rewind`
//!   (`use_pg_rewind`, with `wal_log_hints` on), without a person's help.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::unistd::User;
use serde_json::json;
use sqlx::Connection;

use super::daemons::{Daemon, log_to, write_owned};
use crate::local::backups::{Repo, Server};
use crate::local::{PG_DATABASE, PG_USER, find_binary, free_port, private_dir, run_as};
use etcd::{PATRONI_USER, secure_etcd, start_etcd, wait_for_etcd};
use routing::{start_haproxy, start_link};

mod etcd;
mod node;
mod routing;

pub use node::Node;

/// Patroni's scope: the cluster's name in etcd.
pub const SCOPE: &str = "stockade";
/// The user Patroni's REST API asks its unsafe methods for (with `patroni-rest.password`).
pub const REST_USER: &str = "stockade";
/// The leader key's life after its holder stops renewing it.
pub const TTL: Duration = Duration::from_secs(20);

/// What to start.
#[derive(Debug, Clone)]
pub struct Options {
    /// Patroni nodes (PostgreSQL servers).
    pub nodes: usize,
    /// Trade durability for speed (fsync off): for tests only.
    pub ephemeral: bool,
    /// `synchronous_mode`: a commit acknowledged only once a standby has it. Off only to
    /// measure what it costs.
    pub synchronous: bool,
    /// Archive the leader's WAL to, and keep backups in, this pgBackRest repository.
    pub backups: Option<PathBuf>,
    /// Each node reaches etcd, and is reached by the other nodes (replication and REST),
    /// through a TCP proxy of its own, so a test can cut it off ([`Node::partition`]).
    pub links: bool,
    /// A test seam: node 1's link listens for REST calls on the port its own Patroni's
    /// REST API is given, as two draws of one port once made it; the start must then fail
    /// naming that Patroni, not wait.
    pub clash: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            nodes: 2,
            ephemeral: false,
            synchronous: true,
            backups: None,
            links: false,
            clash: false,
        }
    }
}

/// etcd, the Patroni nodes, and HAProxy's two database ports in front of them.
pub struct Patroni {
    pub etcd: Daemon,
    pub nodes: Vec<Node>,
    /// `write_port` reaches the leader, `read_port` the replicas.
    pub haproxy: Daemon,
    pub write_port: u16,
    pub read_port: u16,
    passwords: Passwords,
    backups: Option<Repo>,
}

/// PostgreSQL's passwords in this cluster, one per role (on loopback only), each made at
/// the first start and kept in a file of its own (mode 0600) in the cluster's folder: the
/// app's may be handed to tools (it is in `--state-file`), the others stay with Patroni.
#[derive(Debug, Clone)]
struct Passwords {
    app: String,
    superuser: String,
    replication: String,
    rewind: String,
    /// Patroni's REST API: asked for its unsafe methods (`PATCH /config`, a switchover,
    /// a restart), so nobody else on the machine can reconfigure or move the cluster.
    rest: String,
    /// etcd's `root` (needed to turn auth on), and Patroni's own etcd user.
    etcd_root: String,
    etcd: String,
}

impl Passwords {
    fn load(dir: &Path) -> anyhow::Result<Self> {
        let one = |name: &str| -> anyhow::Result<String> {
            let file = dir.join(format!("{name}.password"));
            if let Ok(p) = fs::read_to_string(&file)
                && !p.trim().is_empty()
            {
                return Ok(p.trim().to_string());
            }
            let p = uuid::Uuid::new_v4().simple().to_string();
            crate::local::write_private(&file, &p)?;
            Ok(p)
        };
        Ok(Self {
            app: one("patroni")?,
            superuser: one("patroni-superuser")?,
            replication: one("patroni-replication")?,
            rewind: one("patroni-rewind")?,
            rest: one("patroni-rest")?,
            etcd_root: one("etcd-root")?,
            etcd: one("etcd-patroni")?,
        })
    }
}

impl Patroni {
    /// Starts etcd, `nodes` Patroni nodes and HAProxy; waits for a leader with a
    /// synchronous standby, then creates the app's role and database through it.
    pub async fn start(dir: &Path, options: Options) -> anyhow::Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = &dir.canonicalize()?;
        let owner = crate::local::service_user()?;
        let passwords = Passwords::load(dir)?;
        let backups = match options.backups.clone() {
            Some(repo) => Some(tokio::task::spawn_blocking(move || Repo::open(&repo)).await??),
            None => None,
        };
        let etcd = start_etcd(dir, owner.clone())?;
        wait_for_etcd(etcd.port, Duration::from_secs(30)).await?;
        secure_etcd(etcd.port, &passwords.etcd_root, &passwords.etcd).await?;
        let mut started = Vec::new();
        for i in 1..=options.nodes.max(1) {
            let node = start_node(
                dir,
                owner.clone(),
                i,
                etcd.port,
                &passwords,
                &options,
                backups.as_ref(),
            )?;
            started.push(node);
        }
        if let Some(repo) = &backups {
            // Their archive commands retry until this is written.
            let servers: Vec<Server> = started
                .iter()
                .map(|n| Server {
                    data_dir: n.data_dir.clone(),
                    port: n.pg_port,
                    socket_dir: n.home.clone(),
                })
                .collect();
            repo.configure_servers(&servers, "postgres", Some(&passwords.superuser))?;
        }
        let (write_port, read_port) = (free_port()?, free_port()?);
        let haproxy = start_haproxy(dir, write_port, read_port, &started)?;
        let mut cluster = Self {
            etcd,
            nodes: started,
            haproxy,
            write_port,
            read_port,
            passwords,
            backups,
        };
        let leader = cluster.wait_for_leader(Duration::from_secs(60)).await?;
        if cluster.nodes.len() > 1 && options.synchronous {
            cluster.wait_for(Duration::from_secs(60), "/sync").await?;
        }
        cluster.create_database(leader).await?;
        cluster.wait_for_write_port(Duration::from_secs(30)).await?;
        if let Some(repo) = cluster.backups.take() {
            // The stanza, and a first full backup unless the repository has one.
            let repo = tokio::task::spawn_blocking(move || repo.prepare().map(|()| repo)).await??;
            cluster.backups = Some(repo);
        }
        Ok(cluster)
    }

    /// The password of Patroni's REST API for its unsafe methods (user [`REST_USER`]).
    pub fn rest_password(&self) -> &str {
        &self.passwords.rest
    }

    /// The app's database through HAProxy's write port: whichever node leads.
    pub fn database_url(&self) -> String {
        format!(
            "postgres://{PG_USER}:{}@127.0.0.1:{}/{PG_DATABASE}",
            self.passwords.app, self.write_port
        )
    }

    /// The app's database through HAProxy's read port: a replica.
    pub fn replica_url(&self) -> String {
        format!(
            "postgres://{PG_USER}:{}@127.0.0.1:{}/{PG_DATABASE}",
            self.passwords.app, self.read_port
        )
    }

    /// The superuser's URL of node `i`, straight to its PostgreSQL: for tools and checks.
    pub fn superuser_url(&self, i: usize, database: &str) -> String {
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/{database}",
            self.passwords.superuser, self.nodes[i].pg_port
        )
    }

    /// The app's password.
    pub fn password(&self) -> &str {
        &self.passwords.app
    }

    /// The app role's SCRAM secret (`SCRAM-SHA-256$<iterations>:<salt>$<keys>`), as the
    /// leader keeps it.
    pub async fn scram_secret(&self) -> anyhow::Result<String> {
        let leader = self
            .leader()
            .await
            .context("no leader to read the secret from")?;
        let mut conn = crate::pg::connect(&self.superuser_url(leader, "postgres")).await?;
        let secret: Option<String> =
            sqlx::query_scalar("select rolpassword from pg_authid where rolname = $1")
                .bind(PG_USER)
                .fetch_one(&mut conn)
                .await?;
        conn.close().await?;
        secret
            .filter(|s| s.starts_with("SCRAM-SHA-256$"))
            .with_context(|| format!("the role {PG_USER} has no SCRAM secret"))
    }

    /// The pgBackRest repository the leader archives to, if any.
    pub fn backups(&self) -> Option<&Repo> {
        self.backups.as_ref()
    }

    /// The node Patroni says leads now, if any answers so.
    pub async fn leader(&self) -> Option<usize> {
        for (i, node) in self.nodes.iter().enumerate() {
            if node.answers("/primary").await {
                return Some(i);
            }
        }
        None
    }

    /// An error naming the first of the cluster's daemons (etcd, a node's Patroni or link,
    /// HAProxy) that has died: waits on the cluster end with it at once rather than at
    /// their deadline. One stopped or killed on purpose is not counted.
    pub fn check_daemons(&self) -> anyhow::Result<()> {
        self.etcd.check()?;
        for node in &self.nodes {
            node.daemon.check()?;
            if let Some(link) = &node.link {
                link.check()?;
            }
        }
        self.haproxy.check()
    }

    /// Waits until a node leads; which.
    pub async fn wait_for_leader(&self, within: Duration) -> anyhow::Result<usize> {
        let deadline = Instant::now() + within;
        loop {
            self.check_daemons()?;
            if let Some(i) = self.leader().await {
                return Ok(i);
            }
            if Instant::now() > deadline {
                bail!("no Patroni node became the leader within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until some node answers 200 at `path`; which.
    pub async fn wait_for(&self, within: Duration, path: &str) -> anyhow::Result<usize> {
        let deadline = Instant::now() + within;
        loop {
            self.check_daemons()?;
            for (i, node) in self.nodes.iter().enumerate() {
                if node.answers(path).await {
                    return Ok(i);
                }
            }
            if Instant::now() > deadline {
                bail!("no Patroni node answered {path} within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until HAProxy's write port reaches the leader (marked up at its first passing
    /// check).
    async fn wait_for_write_port(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            self.check_daemons()?;
            match crate::pg::connect(&self.database_url()).await {
                Ok(conn) => {
                    conn.close().await?;
                    return Ok(());
                }
                Err(e) if Instant::now() > deadline => {
                    return Err(e).context("HAProxy's write port did not reach the leader");
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    async fn create_database(&self, leader: usize) -> anyhow::Result<()> {
        let url = self.superuser_url(leader, "postgres");
        let mut conn = crate::pg::connect(&url).await?;
        // Runtime strings, not `query!`: role and database names are identifiers, and the
        // password a literal, none of which can be bound.
        let exists: bool =
            sqlx::query_scalar("select exists (select 1 from pg_roles where rolname = $1)")
                .bind(PG_USER)
                .fetch_one(&mut conn)
                .await?;
        if !exists {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "create role {PG_USER} login password '{}'",
                self.passwords.app
            )))
            .execute(&mut conn)
            .await?;
            // pg_monitor: the dashboard and checks read replication's progress.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "grant pg_monitor to {PG_USER}"
            )))
            .execute(&mut conn)
            .await?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "create database {PG_DATABASE} owner {PG_USER}"
            )))
            .execute(&mut conn)
            .await?;
        }
        conn.close().await?;
        Ok(())
    }

    /// Stops everything, HAProxy first, then the nodes, then etcd.
    pub fn stop(mut self) {
        self.haproxy.stop();
        for node in &mut self.nodes {
            node.daemon.stop();
        }
        self.etcd.stop();
    }
}

fn start_node(
    dir: &Path,
    owner: Option<User>,
    i: usize,
    etcd_port: u16,
    passwords: &Passwords,
    options: &Options,
    backups: Option<&Repo>,
) -> anyhow::Result<Node> {
    let bin = find_binary("patroni")
        .context("patroni not found: install it (Debian/Ubuntu: apt-get install patroni)")?;
    // The folder the server binaries really are in (a PATH folder may hold links to a
    // few of them): Patroni also runs pg_basebackup and pg_rewind from it.
    let postgres = fs::canonicalize(crate::local::postgres_bin_dir()?.join("postgres"))?;
    let pg_bin = postgres
        .parent()
        .context("the postgres binary has no folder")?
        .to_path_buf();
    let name = format!("pg{i}");
    let home = private_dir(&dir.join(format!("patroni-{i}")), owner.as_ref())?;
    let data_dir = home.join("data");
    let (rest, pg_port) = (free_port()?, free_port()?);
    // What etcd and the other nodes are reached at: the link's ports with links.
    let link_ports = if options.links {
        Some((free_port()?, free_port()?, free_port()?))
    } else {
        None
    };
    let mut ports = vec![("its REST API", rest), ("its PostgreSQL", pg_port)];
    if let Some((etcd_at, pg_at, rest_at)) = link_ports {
        ports.push(("its link to etcd", etcd_at));
        ports.push(("its link to PostgreSQL", pg_at));
        ports.push(("its link to the REST API", rest_at));
    }
    crate::children::ports::distinct(&name, &ports)?;
    let link_ports = link_ports.map(|(etcd_at, pg_at, rest_at)| {
        (
            etcd_at,
            pg_at,
            if options.clash && i == 1 {
                rest
            } else {
                rest_at
            },
        )
    });
    let (etcd_at, pg_at, rest_at) = link_ports.unwrap_or((etcd_port, pg_port, rest));
    let mut parameters = json!({
        "wal_log_hints": "on",
        "max_wal_senders": 10,
        "max_replication_slots": 10,
        "hot_standby": "on",
    });
    if options.ephemeral {
        // Not `full_page_writes`: pg_rewind needs it on.
        parameters["fsync"] = json!("off");
    }
    let mut local_parameters = json!({"unix_socket_directories": home.display().to_string()});
    if let Some(repo) = backups {
        let text = data_dir.to_string_lossy();
        if text.contains(['"', '\'', '\\', '$', '`', '%']) || text.contains(char::is_whitespace) {
            bail!(
                "{} has a space, quote, $, `, % or backslash in its path; PostgreSQL's \
                 archive_command could not name it safely (choose another --data-dir)",
                data_dir.display()
            );
        }
        for (name, value) in repo.archive_settings(Some(&data_dir)) {
            local_parameters[name] = json!(value);
        }
    }
    let config = json!({
        "scope": SCOPE,
        "name": name,
        // Patroni's own default: each loop's decision ("no action. I am (pg3), the leader
        // with the lock") is what tells afterwards why a node did or did not lead.
        "log": {"level": "INFO"},
        "restapi": {
            "listen": format!("127.0.0.1:{rest}"),
            "connect_address": format!("127.0.0.1:{rest_at}"),
            // For the unsafe methods only: HAProxy's checks and the waits here are GETs.
            "authentication": {"username": REST_USER, "password": passwords.rest},
        },
        // With links, etcd is reached only through them: no discovery of its members'
        // own addresses, which would go around the link.
        "etcd3": {
            "hosts": [format!("127.0.0.1:{etcd_at}")],
            "use_proxies": options.links,
            "username": PATRONI_USER,
            "password": passwords.etcd,
        },
        "bootstrap": {
            "dcs": {
                "ttl": TTL.as_secs(),
                "loop_wait": 2,
                "retry_timeout": 5,
                "master_start_timeout": 10,
                "synchronous_mode": options.synchronous,
                "synchronous_mode_strict": false,
                "postgresql": {"use_pg_rewind": true, "use_slots": true, "parameters": parameters},
            },
            "initdb": [{"encoding": "UTF8"}, {"auth": "scram-sha-256"}],
            "pg_hba": [
                "local all all trust",
                "host replication replicator 127.0.0.1/32 scram-sha-256",
                "host all all 127.0.0.1/32 scram-sha-256",
            ],
        },
        "postgresql": {
            "listen": format!("127.0.0.1:{pg_port}"),
            "connect_address": format!("127.0.0.1:{pg_at}"),
            "data_dir": data_dir.display().to_string(),
            "bin_dir": pg_bin.display().to_string(),
            "pgpass": home.join("pgpass").display().to_string(),
            "authentication": {
                "superuser": {"username": "postgres", "password": passwords.superuser},
                "replication": {"username": "replicator", "password": passwords.replication},
                "rewind": {"username": "rewinder", "password": passwords.rewind},
            },
            "parameters": local_parameters,
        },
    });
    // JSON is YAML: Patroni reads it as its configuration file.
    let file = home.join("patroni.yml");
    write_owned(
        &file,
        &serde_json::to_string_pretty(&config)?,
        owner.as_ref(),
    )?;
    let log = home.join("patroni.log");
    let out = fs::File::create(&log)?;
    // The link first: Patroni reaches etcd through it before it opens its REST API.
    let link = match link_ports {
        Some(ports) => Some(start_link(&home, ports, (etcd_port, pg_port, rest))?),
        None => None,
    };
    let daemon = Daemon::start(format!("Patroni of {name}"), rest, log, move || {
        let mut cmd = Command::new(&bin);
        cmd.arg(&file);
        run_as(&mut cmd, owner.as_ref());
        log_to(&mut cmd, &out);
        cmd
    })?;
    Ok(Node {
        name,
        daemon,
        pg_port,
        data_dir,
        home,
        link,
    })
}
