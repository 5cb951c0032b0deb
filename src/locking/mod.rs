//! Redis: one shared connection manager for the whole process, and the per-SKU leases
//! built on it.
//!
//! A lease queues the buyers of one SKU so the database does not burn work on conflicts;
//! it is not what prevents overselling — the conditional update in
//! [`crate::inventory::db::take_stock`] is. So:
//! - an order takes the leases of all its SKUs at once, in sorted order, in one Lua script
//!   (all or nothing);
//! - each grant carries a fencing token from one counter; the stock row refuses a write
//!   with a token older than the last one that wrote it;
//! - release is compare-and-delete on the owner token, so a holder whose lease expired
//!   cannot delete its successor's;
//! - a holder renews its lease while it works ([`Redis::while_held`], a watchdog), so the
//!   TTL can be short: it only bounds how long a stopped or dead holder blocks the SKU;
//! - a circuit breaker stands in front of every call: after [`OPEN_AFTER`] failures in a
//!   row (errors or timeouts) it opens, the layer reports [`Acquire::Degraded`] without
//!   calling Redis, and orders continue on the database guard alone at its full speed; a
//!   background probe pings Redis every [`PROBE_EVERY`] and closes the breaker at the
//!   first answer.
//!
//! What a fence guarantees: among writes made under leases, a write whose lease was
//! superseded (it expired while its holder stalled, or Redis forgot the counter and the
//! counter was raised past every token the database has seen) is refused once a newer
//! lease has written the row. Writes made while the breaker is open carry no fence; they,
//! like every write, are kept from overselling by the conditional update alone.
//!
//! With Sentinel ([`Redis::connect_sentinel`]) the master is found by asking the
//! Sentinels, and asked again whenever the breaker is open: a killed master, or one demoted
//! to a replica (its writes answer `READONLY`), fails calls, opens the breaker, and the
//! probe moves the connection to the master the Sentinels name now. A promoted replica
//! may have missed the last `INCR`s of the fence counter, so before the breaker closes on
//! a new master the counter is raised past the highest fence PostgreSQL has seen (plus
//! [`FENCE_EPOCH`]); until that succeeds, orders stay on the database guard.
//!
//! A "sold out" hint per SKU lets waiters stop queueing once the database has said a SKU
//! is gone. Leasing callers confirm it against the database; the sold-out answers of
//! [`decisions`] rely on it for at most its short lifetime.

pub mod decisions;
mod lease;

use lease::RAISE_FENCE;
pub use lease::{Acquire, AcquireFree, FENCE_EPOCH, KeyLease, Lease};

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::{TcpSettings, socket2::TcpKeepalive};
use redis::{IntoConnectionInfo, Script};

use crate::catalog::Sku;

/// Failures in a row that open the breaker.
pub const OPEN_AFTER: u32 = 3;
/// How often an open breaker pings Redis to see whether it is back.
pub const PROBE_EVERY: Duration = Duration::from_millis(200);

/// The process's Redis handle; cheap to clone.
#[derive(Clone)]
pub struct Redis {
    /// Replaced when Sentinel names a new master.
    conn: Arc<RwLock<ConnectionManager>>,
    /// Set in Sentinel mode: how to find the master again.
    sentinel: Option<Arc<Sentinel>>,
    /// Where the highest fence written so far is read, to raise the counter on a new master.
    fence_source: Arc<OnceLock<sqlx::PgPool>>,
    prefix: String,
    timeout: Duration,
    breaker: Arc<Breaker>,
    /// SKUs this process saw hinted sold out, so it tries the cheap sold-out answer
    /// first; the hint in Redis stays the authority.
    sold_out_here: Arc<Mutex<HashSet<String>>>,
}

/// Consecutive failures, and whether calls are skipped until a probe succeeds.
#[derive(Default)]
struct Breaker {
    failures: AtomicU32,
    open: AtomicBool,
}

/// How Sentinel mode finds the current master.
struct Sentinel {
    /// `host:port` of each Sentinel.
    addresses: Vec<String>,
    /// The master's name the Sentinels monitor.
    master: String,
    password: Option<String>,
    /// The Sentinels' own (`requirepass`).
    sentinel_password: Option<String>,
    /// The master the connection points at now.
    current: Mutex<(String, u16)>,
}

impl Sentinel {
    /// Asks the Sentinels in turn for the master's address; the first answer wins.
    async fn master_address(&self, timeout: Duration) -> Option<(String, u16)> {
        for address in &self.addresses {
            let ask = async {
                let url = match &self.sentinel_password {
                    Some(pw) => format!("redis://:{pw}@{address}"),
                    None => format!("redis://{address}"),
                };
                let client = redis::Client::open(url)?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            match tokio::time::timeout(timeout, ask).await {
                Ok(Ok(Some(addr))) => return Some(addr),
                Ok(Ok(None)) => {
                    tracing::warn!(sentinel = %address, master = %self.master, "the Sentinel does not know this master")
                }
                Ok(Err(e)) => {
                    tracing::debug!(sentinel = %address, error = %e, "Sentinel did not answer")
                }
                Err(_) => tracing::debug!(sentinel = %address, "Sentinel timed out"),
            }
        }
        None
    }

    fn url(&self, (host, port): &(String, u16)) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{pw}@{host}:{port}"),
            None => format!("redis://{host}:{port}"),
        }
    }
}

/// A connection manager for `url` that fails calls after `timeout`.
fn manager(url: &str, timeout: Duration) -> redis::RedisResult<ConnectionManager> {
    // A peer that vanishes without closing (a dead host, a cut cable) is noticed by
    // the kernel within seconds rather than TCP's default minutes.
    let tcp = TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(
            TcpKeepalive::new()
                .with_time(Duration::from_secs(2))
                .with_interval(Duration::from_secs(1))
                .with_retries(3),
        )
        .set_user_timeout(Duration::from_secs(5));
    let info = url.into_connection_info()?.set_tcp_settings(tcp);
    let client = redis::Client::open(info)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(250))))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200));
    ConnectionManager::new_lazy_with_config(client, config)
}

impl Redis {
    /// [`Redis::connect`] with a patient one-second timeout, for tools and checks.
    pub fn connect_lazy(url: &str, prefix: &str) -> anyhow::Result<Self> {
        Self::connect(url, prefix, Duration::from_secs(1))
    }

    /// Prepares a connection to `url` without waiting for it; keys are prefixed by
    /// `prefix`, and a command without an answer after `timeout` fails.
    pub fn connect(url: &str, prefix: &str, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self::with_manager(
            manager(url, timeout)?,
            None,
            prefix,
            timeout,
        ))
    }

    /// Finds the master named `master` through the Sentinels at `sentinels` (`host:port`)
    /// (asking them with `sentinel_password`) and connects to it with `password`; follows
    /// it across failovers from then on.
    pub async fn connect_sentinel(
        sentinels: &[String],
        master: &str,
        password: Option<&str>,
        sentinel_password: Option<&str>,
        prefix: &str,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let mut sentinel = Sentinel {
            addresses: sentinels.to_vec(),
            master: master.to_string(),
            password: password.map(str::to_string),
            sentinel_password: sentinel_password.map(str::to_string),
            current: Mutex::new((String::new(), 0)),
        };
        let patience = timeout.max(Duration::from_secs(1));
        let Some(address) = sentinel.master_address(patience).await else {
            anyhow::bail!(
                "no Sentinel of {} named a master called {master:?}",
                sentinels.join(",")
            );
        };
        tracing::info!(master = %format!("{}:{}", address.0, address.1), "Redis master found through Sentinel");
        let conn = manager(&sentinel.url(&address), timeout)?;
        sentinel.current = Mutex::new(address);
        Ok(Self::with_manager(
            conn,
            Some(Arc::new(sentinel)),
            prefix,
            timeout,
        ))
    }

    fn with_manager(
        conn: ConnectionManager,
        sentinel: Option<Arc<Sentinel>>,
        prefix: &str,
        timeout: Duration,
    ) -> Self {
        Self {
            conn: Arc::new(RwLock::new(conn)),
            sentinel,
            fence_source: Arc::default(),
            prefix: prefix.to_string(),
            timeout,
            breaker: Arc::default(),
            sold_out_here: Arc::default(),
        }
    }

    /// Where the highest fence written so far is read when a new master must have its
    /// counter raised (Sentinel mode).
    pub fn set_fence_source(&self, db: sqlx::PgPool) {
        let _ = self.fence_source.set(db);
    }

    /// The master's address (`host:port`) the connection points at, in Sentinel mode.
    pub fn master_address(&self) -> Option<String> {
        let sentinel = self.sentinel.as_ref()?;
        let (host, port) = sentinel.current.lock().expect("master address").clone();
        Some(format!("{host}:{port}"))
    }

    /// A connection to use for one command or script call.
    pub fn conn(&self) -> ConnectionManager {
        self.conn.read().expect("redis connection").clone()
    }

    /// `prefix + name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn lease_key(&self, sku: &Sku) -> String {
        self.key(&format!("lease:{sku}"))
    }

    fn sold_out_key(&self, sku: &Sku) -> String {
        self.key(&format!("soldout:{sku}"))
    }

    fn fence_key(&self) -> String {
        self.key("fence")
    }

    /// Round trip to the server.
    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = self.conn();
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(())
    }

    /// The server's version, `(major, minor)`, when Redis answers.
    pub async fn version(&self) -> Option<(u32, u32)> {
        let mut conn = self.conn();
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        let info = self
            .call(
                "reading the server's version",
                cmd.query_async::<String>(&mut conn),
            )
            .await?;
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))?
            .trim();
        let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
        Some((parts.next()??, parts.next()??))
    }

    /// Whether the breaker is open: Redis is not called, orders run on the database guard.
    pub fn is_degraded(&self) -> bool {
        self.breaker.open.load(Ordering::Relaxed)
    }

    /// Records whether Redis answered. The breaker opens after [`OPEN_AFTER`] failures in
    /// a row and starts the probe that closes it; transitions are logged once each.
    fn note(&self, reachable: bool) {
        if reachable {
            self.breaker.failures.store(0, Ordering::Relaxed);
            if self.breaker.open.swap(false, Ordering::Relaxed) {
                tracing::info!("Redis is reachable again; SKU leases are back in use");
            }
            return;
        }
        let failures = self.breaker.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= OPEN_AFTER && !self.breaker.open.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "Redis is unreachable; orders continue on the database guard alone (degraded)"
            );
            let redis = self.clone();
            tokio::spawn(async move { redis.probe().await });
        }
    }

    /// Pings Redis every [`PROBE_EVERY`] while the breaker is open; the first answer
    /// closes it. In Sentinel mode each round first asks the Sentinels where the master
    /// is, and moves to a new one (raising its fence counter) before pinging.
    async fn probe(self) {
        while self.is_degraded() {
            tokio::time::sleep(PROBE_EVERY).await;
            if !self.follow_master().await {
                continue;
            }
            if tokio::time::timeout(self.timeout, self.ping())
                .await
                .is_ok_and(|r| r.is_ok())
            {
                self.note(true);
            }
        }
    }

    /// In Sentinel mode, points the connection at the master the Sentinels name now; a new
    /// master gets its fence counter raised first. False while that is not done (no
    /// Sentinel answered, or the counter could not be raised); true otherwise.
    async fn follow_master(&self) -> bool {
        let Some(sentinel) = &self.sentinel else {
            return true;
        };
        let Some(address) = sentinel.master_address(self.timeout).await else {
            return false;
        };
        if *sentinel.current.lock().expect("master address") == address {
            return true;
        }
        let Ok(conn) = manager(&sentinel.url(&address), self.timeout) else {
            return false;
        };
        let started = Instant::now();
        if let Err(e) = self.raise_fence_on(conn.clone()).await {
            tracing::warn!(error = %e, "could not raise the fence counter on the new Redis master");
            return false;
        }
        *self.conn.write().expect("redis connection") = conn;
        let (host, port) = &address;
        tracing::warn!(
            master = %format!("{host}:{port}"),
            raised_in_ms = started.elapsed().as_millis() as u64,
            "Redis master changed (Sentinel failover); fence counter raised, leases resume"
        );
        *sentinel.current.lock().expect("master address") = address;
        true
    }

    /// Raises the fence counter on `conn` past the highest fence in the database.
    async fn raise_fence_on(&self, mut conn: ConnectionManager) -> anyhow::Result<()> {
        let seen: i64 = match self.fence_source.get() {
            Some(db) => {
                sqlx::query_scalar!(
                    r#"select coalesce(max(last_fence), 0)::bigint as "fence!" from stock"#
                )
                .fetch_one(db)
                .await?
            }
            None => 0,
        };
        let script = Script::new(RAISE_FENCE);
        let mut invocation = script.key(self.fence_key());
        invocation.arg(seen.saturating_add(FENCE_EPOCH));
        tokio::time::timeout(self.timeout, invocation.invoke_async::<i64>(&mut conn)).await??;
        Ok(())
    }

    /// Runs one Redis call through the breaker: `None` when the breaker is open or the
    /// call failed (which counts towards opening it).
    pub(crate) async fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Option<T> {
        if self.is_degraded() {
            return None;
        }
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => {
                self.note(true);
                Some(value)
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "{what} failed");
                self.note(false);
                None
            }
            Err(_) => {
                tracing::debug!("{what} timed out");
                self.note(false);
                None
            }
        }
    }
}
