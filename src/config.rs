//! Settings: every knob has a default in code and can be overridden by one environment
//! variable. Unknown `STOCKADE_*` variables and malformed values stop startup with a message
//! naming the variable, so a typo never silently falls back to a default.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// A setting that could not be read; the message names the variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{var}: {problem} (got {value:?})")]
    Malformed {
        var: &'static str,
        value: String,
        problem: String,
    },
    #[error("{var}: unknown setting; known settings are listed in .env.example")]
    Unknown { var: String },
    #[error("{0}")]
    Inconsistent(String),
}

/// How an order decrements stock (the README compares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStrategy {
    /// Redis lease per SKU, then the conditional update (the default).
    RedisLock,
    /// The conditional update alone.
    PgAtomic,
    /// Group commit per SKU: concurrent single-SKU orders queue behind one leader, which
    /// takes the lease once and applies the whole batch in one transaction.
    Batched,
    /// Read, check in Rust, write back. Oversells; only for demonstrations.
    NaiveUnsafe,
}

impl OrderStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RedisLock => "redis-lock",
            Self::PgAtomic => "pg-atomic",
            Self::Batched => "batched",
            Self::NaiveUnsafe => "naive-unsafe",
        }
    }
}

impl FromStr for OrderStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "redis-lock" => Ok(Self::RedisLock),
            "pg-atomic" => Ok(Self::PgAtomic),
            "batched" => Ok(Self::Batched),
            "naive-unsafe" => Ok(Self::NaiveUnsafe),
            _ => Err("expected one of redis-lock, pg-atomic, batched, naive-unsafe".into()),
        }
    }
}

impl std::fmt::Display for OrderStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pretty" => Ok(Self::Pretty),
            "json" => Ok(Self::Json),
            _ => Err("expected pretty or json".into()),
        }
    }
}

/// A setting that must not reach a log or an error page: passwords, tokens, keys, and URLs
/// that may carry a password. Its `Debug` shows `"***"`, or for a URL everything but the
/// password; the value itself is read through `Deref` (`&str`).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_string())
    }
}

impl std::ops::Deref for Secret {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Secret {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_ref()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.split_once("://") {
            // A URL: its user and password sit before the last `@` of what follows.
            Some((scheme, rest)) => match rest.rsplit_once('@') {
                Some((credentials, host)) => {
                    let user = credentials.split_once(':').map_or(credentials, |(u, _)| u);
                    write!(f, "\"{scheme}://{user}:***@{host}\"")
                }
                None => write!(f, "{:?}", self.0),
            },
            None => f.write_str("\"***\""),
        }
    }
}

/// All settings of a Stockade process.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `STOCKADE_LISTEN`: address and port of the HTTP server.
    pub listen: SocketAddr,
    /// `STOCKADE_DATA_DIR`: local mode keeps PostgreSQL and Redis data here.
    pub data_dir: PathBuf,
    /// `DATABASE_URL`: connect to this PostgreSQL instead of starting one.
    pub database_url: Option<Secret>,
    /// `REDIS_URL`: connect to this Redis instead of starting one.
    pub redis_url: Option<Secret>,
    /// `STOCKADE_LOCAL_PG_PORT`: local mode's PostgreSQL port (free port when unset).
    pub local_pg_port: Option<u16>,
    /// `STOCKADE_LOCAL_REDIS_PORT`: local mode's Redis port (free port when unset).
    pub local_redis_port: Option<u16>,
    /// `STOCKADE_ORDER_STRATEGY`.
    pub order_strategy: OrderStrategy,
    /// `STOCKADE_BATCH_MAX`: most orders one `batched` transaction applies.
    pub batch_max: usize,
    /// `STOCKADE_BATCH_WAIT_US`: how long a `batched` leader waits for more orders before
    /// applying a batch that is not full (0: take what has queued meanwhile).
    pub batch_wait: Duration,
    /// `STOCKADE_PAGE_CACHE_MS`: how long a process reuses what it read for the catalogue
    /// and product pages (0: read every time).
    pub page_cache: Duration,
    /// `STOCKADE_WORKERS`: HTTP worker threads; 0 means one per CPU core.
    pub workers: usize,
    /// `STOCKADE_DB_POOL_SIZE`: connections per process.
    pub db_pool_size: u32,
    /// `STOCKADE_REDIS_PREFIX`: prefix of every Redis key this process writes.
    pub redis_prefix: String,
    /// `STOCKADE_STATEMENT_TIMEOUT_MS`: PostgreSQL `statement_timeout`.
    pub statement_timeout: Duration,
    /// `STOCKADE_TX_TIMEOUT_MS`: an order transaction is abandoned (rolled back) after this.
    pub tx_timeout: Duration,
    /// `STOCKADE_REQUEST_BUDGET_MS`: every request answers within this, whatever the
    /// database or Redis do; what is still waiting then is cut off and answered 503.
    pub request_budget: Duration,
    /// `STOCKADE_DB_ACQUIRE_TIMEOUT_MS`: how long a request queues for a free database
    /// connection before it is shed with 503.
    pub db_acquire_timeout: Duration,
    /// `STOCKADE_REDIS_TIMEOUT_MS`: how long one Redis command may take before it counts
    /// as a failure (towards opening the circuit breaker).
    pub redis_timeout: Duration,
    /// `STOCKADE_LEASE_TTL_MS`: a SKU lease not renewed for this long expires. Its holder
    /// renews it every third of this while it works, so the TTL only bounds how long a
    /// stopped or dead holder blocks the SKU.
    pub lease_ttl: Duration,
    /// `STOCKADE_LEASE_WAIT_MS`: how long an order waits for busy SKUs before answering 503.
    pub lease_wait: Duration,
    /// `STOCKADE_MAX_LINE_QUANTITY`: most units of one SKU in one order.
    pub max_line_quantity: i32,
    /// `STOCKADE_HOLD_SECONDS`: how long a checkout hold keeps stock for the shopper.
    pub hold_ttl: Duration,
    /// `STOCKADE_HOLD_MAX_PER_SKU`: most units of one SKU a checkout may hold.
    pub hold_max_per_sku: i32,
    /// `STOCKADE_SWEEP_INTERVAL_MS`: how often each process releases expired holds.
    pub sweep_interval: Duration,
    /// `STOCKADE_LOGIN_MAX_FAILURES`: failed admin logins per account within the window.
    pub login_max_failures: i64,
    /// `STOCKADE_LOGIN_MAX_FAILURES_PER_CLIENT`: failed logins per client address within the window.
    pub login_max_failures_per_client: i64,
    /// `STOCKADE_LOGIN_WINDOW_SECONDS`: the window failed logins are counted over.
    pub login_window: Duration,
    /// `STOCKADE_SECURE_COOKIES`: mark cookies Secure (set when a TLS proxy is in front;
    /// requests that arrive over https get Secure cookies anyway).
    pub secure_cookies: bool,
    /// `STOCKADE_TRUSTED_PROXIES`: addresses and networks (CIDR) of the proxies in front of
    /// this server. A request from one of them has its client address taken from
    /// `X-Forwarded-For` (the right-most hop that is not a trusted proxy); empty trusts none,
    /// and the peer address is the client. See [`crate::http::client_addr`].
    pub trusted_proxies: Vec<IpNet>,
    /// `STOCKADE_BODY_TIMEOUT_MS`: a request body not fully received this long after the
    /// request's head is answered 408 and its connection closed.
    pub body_timeout: Duration,
    /// `STOCKADE_METRICS_LISTEN`: serve `/metrics` (and nothing else) on this address of its
    /// own, without a token. Unset: no metrics listener.
    pub metrics_listen: Option<SocketAddr>,
    /// `STOCKADE_METRICS_TOKEN`: serve `/metrics` on the public port too, to requests with
    /// `Authorization: Bearer <token>`. Unset: `/metrics` is 404 on the public port.
    pub metrics_token: Option<Secret>,
    /// `STOCKADE_IDEMPOTENCY_TTL_HOURS`: completed idempotency keys are kept this long.
    pub idempotency_ttl_hours: u32,
    /// `STOCKADE_API_ANONYMOUS_ORDERS`: accept API orders and holds without an API key
    /// (all such callers then share one identity). Off: they are answered 401.
    pub api_anonymous_orders: bool,
    /// `STOCKADE_RATE_LIMIT_PER_MINUTE`: orders and holds one client (an API client, or an
    /// address) may place per minute, sustained.
    pub rate_limit_per_minute: u32,
    /// `STOCKADE_RATE_LIMIT_BURST`: how many of them may come at once.
    pub rate_limit_burst: u32,
    /// `STOCKADE_API_KEY`: the API key `stockade loadtest` sends to servers it did not
    /// start (read by the tools, not by the server).
    pub api_key: Option<Secret>,
    /// Fault injection for tests: pause this long after taking leases, before the
    /// transaction, as a stalled process would. Not settable from the environment.
    pub fault_pause_after_lease: Duration,
    /// `STOCKADE_DISPATCH_INTERVAL_MS`: how often each process's dispatcher looks for
    /// events to route and deliveries to send when it has nothing to do.
    pub dispatch_interval: Duration,
    /// `STOCKADE_DELIVERY_MAX_ATTEMPTS`: attempts of one delivery before it is failed.
    pub delivery_max_attempts: u32,
    /// `STOCKADE_DELIVERY_BACKOFF_MS`: the first retry's wait; it doubles per attempt
    /// (with jitter, at most an hour).
    pub delivery_backoff: Duration,
    /// `STOCKADE_WEBHOOK_TIMEOUT_MS`: how long one webhook or SMTP send may take.
    pub webhook_timeout: Duration,
    /// `STOCKADE_WEBHOOK_ALLOW_PRIVATE`: let webhooks go to loopback and private
    /// addresses (tests, and receivers on the shop's own network). Off: refused (SSRF).
    pub webhook_allow_private: bool,
    /// `STOCKADE_SMTP_URL`: send receipts through this SMTP server, e.g.
    /// `smtps://user:pass@smtp.example.com` or `smtp://127.0.0.1:2525`.
    pub smtp_url: Option<Secret>,
    /// `STOCKADE_MAIL_FROM`: the receipts' sender.
    pub mail_from: String,
    /// `STOCKADE_MAIL_DIR`: without SMTP, write receipts as `.eml` files here (local mode:
    /// `mail/` in the data folder). Neither set: no receipts.
    pub mail_dir: Option<PathBuf>,
    /// `STOCKADE_PUBLIC_URL`: the shop's address as shoppers reach it, for links in
    /// receipts. Unset: `http://` + the listen address.
    pub public_url: Option<String>,
    /// `STOCKADE_REDIS_SENTINELS`: `host:port` of Redis Sentinels; when set, the Redis
    /// master is found through them (and followed across a failover) instead of `REDIS_URL`.
    pub redis_sentinels: Vec<String>,
    /// `STOCKADE_REDIS_MASTER`: the master's name the Sentinels monitor.
    pub redis_master: String,
    /// `STOCKADE_REDIS_PASSWORD`: the password of the Redis master and replicas found
    /// through Sentinel (`REDIS_URL` carries its own).
    pub redis_password: Option<Secret>,
    /// `STOCKADE_DATABASE_REPLICA_URL`: a streaming replica that takes the reads which may
    /// lag (catalogue, product pages, product API, admin reports); unset: the primary.
    pub database_replica_url: Option<Secret>,
    /// `STOCKADE_DATABASE_PGBOUNCER`: `DATABASE_URL` is a PgBouncer (session pooling): the
    /// session timeouts are not sent at connect (PgBouncer refuses startup options) but
    /// set by PgBouncer's `connect_query`.
    pub database_pgbouncer: bool,
    /// `STOCKADE_LOG_FORMAT`: `pretty` or `json`.
    pub log_format: LogFormat,
    /// `STOCKADE_LOG`: tracing filter, e.g. `info` or `stockade=debug`.
    pub log_filter: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".parse().expect("valid default address"),
            data_dir: PathBuf::from("./.stockade"),
            database_url: None,
            redis_url: None,
            local_pg_port: None,
            local_redis_port: None,
            order_strategy: OrderStrategy::RedisLock,
            batch_max: 128,
            batch_wait: Duration::ZERO,
            page_cache: Duration::from_millis(500),
            workers: 0,
            db_pool_size: 16,
            redis_prefix: "stockade:".into(),
            statement_timeout: Duration::from_millis(1_500),
            tx_timeout: Duration::from_millis(2_000),
            request_budget: Duration::from_millis(5_000),
            db_acquire_timeout: Duration::from_millis(500),
            redis_timeout: Duration::from_millis(250),
            lease_ttl: Duration::from_millis(1_000),
            lease_wait: Duration::from_millis(2_000),
            max_line_quantity: 10,
            idempotency_ttl_hours: 24,
            api_anonymous_orders: false,
            rate_limit_per_minute: 60,
            rate_limit_burst: 20,
            api_key: None,
            login_max_failures: 5,
            login_max_failures_per_client: 20,
            login_window: Duration::from_secs(900),
            secure_cookies: false,
            trusted_proxies: Vec::new(),
            body_timeout: Duration::from_millis(4_000),
            metrics_listen: None,
            metrics_token: None,
            hold_ttl: Duration::from_secs(600),
            hold_max_per_sku: 5,
            sweep_interval: Duration::from_millis(1_000),
            fault_pause_after_lease: Duration::ZERO,
            dispatch_interval: Duration::from_millis(500),
            delivery_max_attempts: 10,
            delivery_backoff: Duration::from_millis(1_000),
            webhook_timeout: Duration::from_millis(5_000),
            webhook_allow_private: false,
            smtp_url: None,
            mail_from: "Stockade <shop@localhost>".into(),
            mail_dir: None,
            public_url: None,
            redis_sentinels: Vec::new(),
            redis_master: "stockade".into(),
            redis_password: None,
            database_replica_url: None,
            database_pgbouncer: false,
            log_format: LogFormat::Pretty,
            log_filter: "info".into(),
        }
    }
}

/// Every variable Stockade reads, in the order `.env.example` lists them.
pub const VARIABLES: &[&str] = &[
    "STOCKADE_LISTEN",
    "STOCKADE_DATA_DIR",
    "DATABASE_URL",
    "REDIS_URL",
    "STOCKADE_LOCAL_PG_PORT",
    "STOCKADE_LOCAL_REDIS_PORT",
    "STOCKADE_ORDER_STRATEGY",
    "STOCKADE_BATCH_MAX",
    "STOCKADE_BATCH_WAIT_US",
    "STOCKADE_PAGE_CACHE_MS",
    "STOCKADE_WORKERS",
    "STOCKADE_DB_POOL_SIZE",
    "STOCKADE_REDIS_PREFIX",
    "STOCKADE_STATEMENT_TIMEOUT_MS",
    "STOCKADE_TX_TIMEOUT_MS",
    "STOCKADE_REQUEST_BUDGET_MS",
    "STOCKADE_DB_ACQUIRE_TIMEOUT_MS",
    "STOCKADE_REDIS_TIMEOUT_MS",
    "STOCKADE_LEASE_TTL_MS",
    "STOCKADE_LEASE_WAIT_MS",
    "STOCKADE_MAX_LINE_QUANTITY",
    "STOCKADE_IDEMPOTENCY_TTL_HOURS",
    "STOCKADE_API_ANONYMOUS_ORDERS",
    "STOCKADE_RATE_LIMIT_PER_MINUTE",
    "STOCKADE_RATE_LIMIT_BURST",
    "STOCKADE_API_KEY",
    "STOCKADE_LOGIN_MAX_FAILURES",
    "STOCKADE_LOGIN_MAX_FAILURES_PER_CLIENT",
    "STOCKADE_LOGIN_WINDOW_SECONDS",
    "STOCKADE_SECURE_COOKIES",
    "STOCKADE_TRUSTED_PROXIES",
    "STOCKADE_BODY_TIMEOUT_MS",
    "STOCKADE_METRICS_LISTEN",
    "STOCKADE_METRICS_TOKEN",
    "STOCKADE_HOLD_SECONDS",
    "STOCKADE_HOLD_MAX_PER_SKU",
    "STOCKADE_SWEEP_INTERVAL_MS",
    "STOCKADE_DISPATCH_INTERVAL_MS",
    "STOCKADE_DELIVERY_MAX_ATTEMPTS",
    "STOCKADE_DELIVERY_BACKOFF_MS",
    "STOCKADE_WEBHOOK_TIMEOUT_MS",
    "STOCKADE_WEBHOOK_ALLOW_PRIVATE",
    "STOCKADE_SMTP_URL",
    "STOCKADE_MAIL_FROM",
    "STOCKADE_MAIL_DIR",
    "STOCKADE_PUBLIC_URL",
    "STOCKADE_REDIS_SENTINELS",
    "STOCKADE_REDIS_MASTER",
    "STOCKADE_REDIS_PASSWORD",
    "STOCKADE_DATABASE_REPLICA_URL",
    "STOCKADE_DATABASE_PGBOUNCER",
    "STOCKADE_LOG_FORMAT",
    "STOCKADE_LOG",
];

impl Settings {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(std::env::vars())
    }

    /// Reads settings from `(name, value)` pairs; other programs' variables are ignored,
    /// unknown `STOCKADE_*` ones are an error.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut vars: BTreeMap<String, String> = vars
            .into_iter()
            .filter(|(k, _)| k.starts_with("STOCKADE_") || VARIABLES.contains(&k.as_str()))
            .collect();
        if let Some(unknown) = vars.keys().find(|k| !VARIABLES.contains(&k.as_str())) {
            return Err(ConfigError::Unknown {
                var: unknown.clone(),
            });
        }
        let mut s = Self::default();
        let mut take = |var: &'static str| vars.remove(var).filter(|v| !v.trim().is_empty());

        if let Some(v) = take("STOCKADE_LISTEN") {
            s.listen = parse(
                "STOCKADE_LISTEN",
                &v,
                "expected address:port, e.g. 127.0.0.1:8080",
            )?;
        }
        if let Some(v) = take("STOCKADE_DATA_DIR") {
            s.data_dir = PathBuf::from(v);
        }
        s.database_url = take("DATABASE_URL").map(Secret::from);
        if let Some(url) = &s.database_url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            return Err(malformed(
                "DATABASE_URL",
                url,
                "expected postgres://user:password@host:port/database",
            ));
        }
        s.redis_url = take("REDIS_URL").map(Secret::from);
        if let Some(url) = &s.redis_url
            && !(url.starts_with("redis://") || url.starts_with("rediss://"))
        {
            return Err(malformed(
                "REDIS_URL",
                url,
                "expected redis://host:port[/db]",
            ));
        }
        if let Some(v) = take("STOCKADE_LOCAL_PG_PORT") {
            s.local_pg_port = Some(port("STOCKADE_LOCAL_PG_PORT", &v)?);
        }
        if let Some(v) = take("STOCKADE_LOCAL_REDIS_PORT") {
            s.local_redis_port = Some(port("STOCKADE_LOCAL_REDIS_PORT", &v)?);
        }
        if let Some(v) = take("STOCKADE_ORDER_STRATEGY") {
            s.order_strategy = v
                .parse()
                .map_err(|e: String| malformed("STOCKADE_ORDER_STRATEGY", &v, &e))?;
        }
        if let Some(v) = take("STOCKADE_BATCH_MAX") {
            s.batch_max = bounded("STOCKADE_BATCH_MAX", &v, 1, 10_000)?;
        }
        if let Some(v) = take("STOCKADE_BATCH_WAIT_US") {
            s.batch_wait =
                Duration::from_micros(bounded("STOCKADE_BATCH_WAIT_US", &v, 0, 1_000_000)?);
        }
        if let Some(v) = take("STOCKADE_PAGE_CACHE_MS") {
            s.page_cache = Duration::from_millis(bounded("STOCKADE_PAGE_CACHE_MS", &v, 0, 60_000)?);
        }
        if let Some(v) = take("STOCKADE_WORKERS") {
            s.workers = bounded("STOCKADE_WORKERS", &v, 0, 256)?;
        }
        if let Some(v) = take("STOCKADE_DB_POOL_SIZE") {
            s.db_pool_size = bounded("STOCKADE_DB_POOL_SIZE", &v, 1, 1_000)?;
        }
        if let Some(v) = take("STOCKADE_REDIS_PREFIX") {
            s.redis_prefix = v;
        }
        if let Some(v) = take("STOCKADE_STATEMENT_TIMEOUT_MS") {
            s.statement_timeout = millis("STOCKADE_STATEMENT_TIMEOUT_MS", &v)?;
        }
        if let Some(v) = take("STOCKADE_TX_TIMEOUT_MS") {
            s.tx_timeout = millis("STOCKADE_TX_TIMEOUT_MS", &v)?;
        }
        if let Some(v) = take("STOCKADE_REQUEST_BUDGET_MS") {
            s.request_budget = millis("STOCKADE_REQUEST_BUDGET_MS", &v)?;
        }
        if let Some(v) = take("STOCKADE_DB_ACQUIRE_TIMEOUT_MS") {
            s.db_acquire_timeout = millis("STOCKADE_DB_ACQUIRE_TIMEOUT_MS", &v)?;
        }
        if let Some(v) = take("STOCKADE_REDIS_TIMEOUT_MS") {
            s.redis_timeout = millis("STOCKADE_REDIS_TIMEOUT_MS", &v)?;
        }
        if let Some(v) = take("STOCKADE_LEASE_TTL_MS") {
            s.lease_ttl = millis("STOCKADE_LEASE_TTL_MS", &v)?;
        }
        if let Some(v) = take("STOCKADE_LEASE_WAIT_MS") {
            s.lease_wait = millis("STOCKADE_LEASE_WAIT_MS", &v)?;
        }
        if let Some(v) = take("STOCKADE_MAX_LINE_QUANTITY") {
            s.max_line_quantity = bounded("STOCKADE_MAX_LINE_QUANTITY", &v, 1, 1_000_000)?;
        }
        if let Some(v) = take("STOCKADE_IDEMPOTENCY_TTL_HOURS") {
            s.idempotency_ttl_hours = bounded("STOCKADE_IDEMPOTENCY_TTL_HOURS", &v, 24, 24 * 365)?;
        }
        if let Some(v) = take("STOCKADE_API_ANONYMOUS_ORDERS") {
            s.api_anonymous_orders = boolean("STOCKADE_API_ANONYMOUS_ORDERS", &v)?;
        }
        if let Some(v) = take("STOCKADE_RATE_LIMIT_PER_MINUTE") {
            s.rate_limit_per_minute = bounded("STOCKADE_RATE_LIMIT_PER_MINUTE", &v, 1, 1_000_000)?;
        }
        if let Some(v) = take("STOCKADE_RATE_LIMIT_BURST") {
            s.rate_limit_burst = bounded("STOCKADE_RATE_LIMIT_BURST", &v, 1, 1_000_000)?;
        }
        s.api_key = take("STOCKADE_API_KEY").map(Secret::from);
        if let Some(v) = take("STOCKADE_HOLD_SECONDS") {
            s.hold_ttl = Duration::from_secs(bounded("STOCKADE_HOLD_SECONDS", &v, 1, 86_400)?);
        }
        if let Some(v) = take("STOCKADE_HOLD_MAX_PER_SKU") {
            s.hold_max_per_sku = bounded("STOCKADE_HOLD_MAX_PER_SKU", &v, 1, 1_000_000)?;
        }
        if let Some(v) = take("STOCKADE_SWEEP_INTERVAL_MS") {
            s.sweep_interval = millis("STOCKADE_SWEEP_INTERVAL_MS", &v)?;
        }
        if let Some(v) = take("STOCKADE_LOGIN_MAX_FAILURES") {
            s.login_max_failures = bounded("STOCKADE_LOGIN_MAX_FAILURES", &v, 1, 1_000_000)?;
        }
        if let Some(v) = take("STOCKADE_LOGIN_MAX_FAILURES_PER_CLIENT") {
            s.login_max_failures_per_client =
                bounded("STOCKADE_LOGIN_MAX_FAILURES_PER_CLIENT", &v, 1, 1_000_000)?;
        }
        if let Some(v) = take("STOCKADE_LOGIN_WINDOW_SECONDS") {
            s.login_window =
                Duration::from_secs(bounded("STOCKADE_LOGIN_WINDOW_SECONDS", &v, 1, 86_400)?);
        }
        if let Some(v) = take("STOCKADE_SECURE_COOKIES") {
            s.secure_cookies = boolean("STOCKADE_SECURE_COOKIES", &v)?;
        }
        if let Some(v) = take("STOCKADE_TRUSTED_PROXIES") {
            s.trusted_proxies = v
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| p.parse::<IpNet>())
                .collect::<Result<_, _>>()
                .map_err(|e| malformed("STOCKADE_TRUSTED_PROXIES", &v, &e))?;
        }
        if let Some(v) = take("STOCKADE_BODY_TIMEOUT_MS") {
            s.body_timeout =
                Duration::from_millis(bounded("STOCKADE_BODY_TIMEOUT_MS", &v, 100, 600_000)?);
        }
        if let Some(v) = take("STOCKADE_METRICS_LISTEN") {
            s.metrics_listen = Some(parse(
                "STOCKADE_METRICS_LISTEN",
                &v,
                "expected address:port, e.g. 127.0.0.1:9090",
            )?);
        }
        if let Some(v) = take("STOCKADE_METRICS_TOKEN") {
            if v.trim().len() < 16 || !v.trim().bytes().all(|b| b.is_ascii_graphic()) {
                return Err(malformed(
                    "STOCKADE_METRICS_TOKEN",
                    "(hidden)",
                    "expected at least 16 printable characters without spaces",
                ));
            }
            s.metrics_token = Some(Secret::from(v.trim()));
        }
        if let Some(v) = take("STOCKADE_DISPATCH_INTERVAL_MS") {
            s.dispatch_interval = millis("STOCKADE_DISPATCH_INTERVAL_MS", &v)?;
        }
        if let Some(v) = take("STOCKADE_DELIVERY_MAX_ATTEMPTS") {
            s.delivery_max_attempts = bounded("STOCKADE_DELIVERY_MAX_ATTEMPTS", &v, 1, 100)?;
        }
        if let Some(v) = take("STOCKADE_DELIVERY_BACKOFF_MS") {
            s.delivery_backoff = millis("STOCKADE_DELIVERY_BACKOFF_MS", &v)?;
        }
        if let Some(v) = take("STOCKADE_WEBHOOK_TIMEOUT_MS") {
            s.webhook_timeout =
                Duration::from_millis(bounded("STOCKADE_WEBHOOK_TIMEOUT_MS", &v, 100, 120_000)?);
        }
        if let Some(v) = take("STOCKADE_WEBHOOK_ALLOW_PRIVATE") {
            s.webhook_allow_private = boolean("STOCKADE_WEBHOOK_ALLOW_PRIVATE", &v)?;
        }
        if let Some(v) = take("STOCKADE_SMTP_URL") {
            if !(v.starts_with("smtp://") || v.starts_with("smtps://")) {
                return Err(malformed(
                    "STOCKADE_SMTP_URL",
                    "(hidden)",
                    "expected smtp://… or smtps://…",
                ));
            }
            s.smtp_url = Some(Secret::from(v.trim()));
        }
        if let Some(v) = take("STOCKADE_MAIL_FROM") {
            s.mail_from = v.trim().to_string();
        }
        if let Some(v) = take("STOCKADE_MAIL_DIR") {
            s.mail_dir = Some(PathBuf::from(v));
        }
        if let Some(v) = take("STOCKADE_PUBLIC_URL") {
            if !(v.starts_with("http://") || v.starts_with("https://")) {
                return Err(malformed(
                    "STOCKADE_PUBLIC_URL",
                    &v,
                    "expected http://… or https://…",
                ));
            }
            s.public_url = Some(v.trim().trim_end_matches('/').to_string());
        }
        if let Some(v) = take("STOCKADE_REDIS_SENTINELS") {
            s.redis_sentinels = v
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(|a| match a.rsplit_once(':') {
                    Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                        Ok(a.to_string())
                    }
                    _ => Err(malformed(
                        "STOCKADE_REDIS_SENTINELS",
                        &v,
                        "expected host:port,host:port,…",
                    )),
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(v) = take("STOCKADE_REDIS_MASTER") {
            s.redis_master = v.trim().to_string();
        }
        s.redis_password = take("STOCKADE_REDIS_PASSWORD").map(Secret::from);
        s.database_replica_url = take("STOCKADE_DATABASE_REPLICA_URL").map(Secret::from);
        if let Some(url) = &s.database_replica_url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            return Err(malformed(
                "STOCKADE_DATABASE_REPLICA_URL",
                url,
                "expected postgres://user:password@host:port/database",
            ));
        }
        if let Some(v) = take("STOCKADE_DATABASE_PGBOUNCER") {
            s.database_pgbouncer = boolean("STOCKADE_DATABASE_PGBOUNCER", &v)?;
        }
        if let Some(v) = take("STOCKADE_LOG_FORMAT") {
            s.log_format = v
                .parse()
                .map_err(|e: String| malformed("STOCKADE_LOG_FORMAT", &v, &e))?;
        }
        if let Some(v) = take("STOCKADE_LOG") {
            s.log_filter = v;
        }
        s.validate()?;
        Ok(s)
    }

    /// Checks relations between settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.local_pg_port.is_some() && self.local_pg_port == self.local_redis_port {
            return Err(ConfigError::Inconsistent(
                "STOCKADE_LOCAL_PG_PORT and STOCKADE_LOCAL_REDIS_PORT must differ".into(),
            ));
        }
        // Every statement ends before the transaction's own deadline, and queueing for
        // leases plus the transaction fit in the request's budget, so an order reports
        // its own outcome rather than being cut off by the budget.
        if self.statement_timeout > self.tx_timeout {
            return Err(ConfigError::Inconsistent(format!(
                "STOCKADE_STATEMENT_TIMEOUT_MS ({} ms) must not exceed STOCKADE_TX_TIMEOUT_MS ({} ms)",
                self.statement_timeout.as_millis(),
                self.tx_timeout.as_millis()
            )));
        }
        if self.lease_wait + self.tx_timeout >= self.request_budget {
            return Err(ConfigError::Inconsistent(format!(
                "STOCKADE_LEASE_WAIT_MS + STOCKADE_TX_TIMEOUT_MS ({} ms) must be less than STOCKADE_REQUEST_BUDGET_MS ({} ms)",
                (self.lease_wait + self.tx_timeout).as_millis(),
                self.request_budget.as_millis()
            )));
        }
        // Renewed every third of the TTL: shorter would be mostly renewals.
        if self.lease_ttl < Duration::from_millis(100) {
            return Err(ConfigError::Inconsistent(format!(
                "STOCKADE_LEASE_TTL_MS ({} ms) must be at least 100 ms",
                self.lease_ttl.as_millis()
            )));
        }
        Ok(())
    }

    /// Whether `addr` is one of [`Settings::trusted_proxies`].
    pub fn is_trusted_proxy(&self, addr: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(addr))
    }

    /// Local mode runs when the database or Redis is not given (Redis is given by
    /// `REDIS_URL` or by Sentinels).
    pub fn local_mode(&self) -> bool {
        self.database_url.is_none() || (self.redis_url.is_none() && self.redis_sentinels.is_empty())
    }
}

/// An address range in CIDR notation (`10.0.0.0/8`, `fd00::/8`), or one address
/// (`127.0.0.1`, `::1`, a range of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Whether `addr` lies in this range (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.addr, canonical_ip(addr)) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// `::ffff:1.2.3.4` → `1.2.3.4`; other addresses as they are.
pub fn canonical_ip(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

impl FromStr for IpNet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not an address or CIDR range (e.g. 10.0.0.0/8, ::1)");
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr = canonical_ip(addr.trim().parse::<IpAddr>().map_err(|_| bad())?);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(bad)?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }
}

fn malformed(var: &'static str, value: &str, problem: &str) -> ConfigError {
    ConfigError::Malformed {
        var,
        value: value.to_string(),
        problem: problem.to_string(),
    }
}

fn parse<T: FromStr>(var: &'static str, value: &str, problem: &str) -> Result<T, ConfigError> {
    value
        .trim()
        .parse()
        .map_err(|_| malformed(var, value, problem))
}

fn bounded<T>(var: &'static str, value: &str, min: T, max: T) -> Result<T, ConfigError>
where
    T: FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let problem = format!("expected a whole number from {min} to {max}");
    let n: T = parse(var, value, &problem)?;
    if n < min || n > max {
        return Err(malformed(var, value, &problem));
    }
    Ok(n)
}

fn boolean(var: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(malformed(var, value, "expected true or false")),
    }
}

fn port(var: &'static str, value: &str) -> Result<u16, ConfigError> {
    bounded(var, value, 1, u16::MAX)
}

fn millis(var: &'static str, value: &str) -> Result<Duration, ConfigError> {
    bounded(var, value, 1u64, 3_600_000).map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn sentinels_replace_redis_url_and_must_each_be_host_and_port() {
        let s = Settings::from_vars(vars(&[
            ("DATABASE_URL", "postgres://u@h/db"),
            (
                "STOCKADE_REDIS_SENTINELS",
                "10.0.0.1:26379, sentinel-2:26379,",
            ),
            ("STOCKADE_REDIS_MASTER", "shop"),
        ]))
        .unwrap();
        assert_eq!(s.redis_sentinels, ["10.0.0.1:26379", "sentinel-2:26379"]);
        assert_eq!(s.redis_master, "shop");
        assert!(!s.local_mode(), "Sentinels stand in for REDIS_URL");
        for bad in ["sentinel-1", ":26379", "host:port", "host:70000"] {
            let err = Settings::from_vars(vars(&[("STOCKADE_REDIS_SENTINELS", bad)])).unwrap_err();
            assert!(
                err.to_string().contains("STOCKADE_REDIS_SENTINELS"),
                "{bad}: {err}"
            );
        }
        let err = Settings::from_vars(vars(&[("STOCKADE_DATABASE_REPLICA_URL", "mysql://x")]))
            .unwrap_err();
        assert!(err.to_string().contains("STOCKADE_DATABASE_REPLICA_URL"));
    }

    #[test]
    fn defaults_apply_when_nothing_is_set() {
        let s = Settings::from_vars(vars(&[("PATH", "/bin")])).unwrap();
        assert_eq!(s.listen.port(), 8080);
        assert_eq!(s.order_strategy, OrderStrategy::RedisLock);
        assert!(s.local_mode());
    }

    #[test]
    fn values_are_read() {
        let s = Settings::from_vars(vars(&[
            ("STOCKADE_LISTEN", "0.0.0.0:9000"),
            ("STOCKADE_ORDER_STRATEGY", "pg-atomic"),
            ("DATABASE_URL", "postgres://a@b/c"),
            ("REDIS_URL", "redis://127.0.0.1:6379"),
            ("STOCKADE_DB_POOL_SIZE", "4"),
        ]))
        .unwrap();
        assert_eq!(s.listen.port(), 9000);
        assert_eq!(s.order_strategy, OrderStrategy::PgAtomic);
        assert_eq!(s.db_pool_size, 4);
        assert!(!s.local_mode());
    }

    #[test]
    fn malformed_values_name_the_variable() {
        for (var, value) in [
            ("STOCKADE_LISTEN", "localhost"),
            ("STOCKADE_ORDER_STRATEGY", "yolo"),
            ("STOCKADE_DB_POOL_SIZE", "0"),
            ("STOCKADE_DB_POOL_SIZE", "many"),
            ("STOCKADE_LOCAL_PG_PORT", "70000"),
            ("DATABASE_URL", "mysql://x"),
            ("STOCKADE_STATEMENT_TIMEOUT_MS", "-5"),
        ] {
            let err = Settings::from_vars(vars(&[(var, value)])).unwrap_err();
            assert!(err.to_string().starts_with(var), "{var}={value}: {err}");
        }
    }

    #[test]
    fn timeouts_must_fit_inside_each_other_and_the_request_budget() {
        let err = Settings::from_vars(vars(&[
            ("STOCKADE_TX_TIMEOUT_MS", "4000"),
            ("STOCKADE_REQUEST_BUDGET_MS", "5000"),
        ]))
        .unwrap_err();
        assert!(
            err.to_string().contains("STOCKADE_REQUEST_BUDGET_MS"),
            "{err}"
        );
        let err =
            Settings::from_vars(vars(&[("STOCKADE_STATEMENT_TIMEOUT_MS", "2500")])).unwrap_err();
        assert!(err.to_string().contains("STOCKADE_TX_TIMEOUT_MS"), "{err}");
        let err = Settings::from_vars(vars(&[("STOCKADE_LEASE_TTL_MS", "50")])).unwrap_err();
        assert!(err.to_string().contains("STOCKADE_LEASE_TTL_MS"), "{err}");
        // A TTL shorter than the transaction is fine: the holder renews it.
        Settings::from_vars(vars(&[("STOCKADE_LEASE_TTL_MS", "300")])).unwrap();
    }

    #[test]
    fn trusted_proxies_are_addresses_and_ranges_of_both_families() {
        let s = Settings::from_vars(vars(&[(
            "STOCKADE_TRUSTED_PROXIES",
            "127.0.0.1, 10.0.0.0/8,fd00::/8, ::1",
        )]))
        .unwrap();
        let trusted = |a: &str| s.is_trusted_proxy(a.parse().unwrap());
        assert!(trusted("127.0.0.1") && trusted("::ffff:127.0.0.1"));
        assert!(trusted("10.255.3.4") && trusted("fd12::1") && trusted("::1"));
        assert!(!trusted("127.0.0.2") && !trusted("11.0.0.1") && !trusted("fe80::1"));
        assert!(!Settings::default().is_trusted_proxy("127.0.0.1".parse().unwrap()));
        let all: IpNet = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "localhost",
            "10.0.0/8",
            "1.2.3.4/x",
        ] {
            let err = Settings::from_vars(vars(&[("STOCKADE_TRUSTED_PROXIES", bad)])).unwrap_err();
            assert!(
                err.to_string().starts_with("STOCKADE_TRUSTED_PROXIES"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn metrics_and_body_settings_are_read_and_checked() {
        let s = Settings::from_vars(vars(&[
            ("STOCKADE_METRICS_LISTEN", "127.0.0.1:9090"),
            ("STOCKADE_METRICS_TOKEN", "0123456789abcdef0123"),
            ("STOCKADE_BODY_TIMEOUT_MS", "2500"),
        ]))
        .unwrap();
        assert_eq!(s.metrics_listen, Some("127.0.0.1:9090".parse().unwrap()));
        assert_eq!(s.metrics_token.as_deref(), Some("0123456789abcdef0123"));
        assert_eq!(s.body_timeout, Duration::from_millis(2500));
        let d = Settings::default();
        assert!(d.metrics_listen.is_none() && d.metrics_token.is_none());
        for (var, value) in [
            ("STOCKADE_METRICS_TOKEN", "short"),
            ("STOCKADE_METRICS_LISTEN", "9090"),
            ("STOCKADE_BODY_TIMEOUT_MS", "0"),
        ] {
            let err = Settings::from_vars(vars(&[(var, value)])).unwrap_err();
            assert!(err.to_string().starts_with(var), "{var}={value}: {err}");
        }
    }

    #[test]
    fn api_and_rate_limit_settings_are_read() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert!(
            !s.api_anonymous_orders,
            "anonymous API orders are off by default"
        );
        let s = Settings::from_vars(vars(&[
            ("STOCKADE_API_ANONYMOUS_ORDERS", "true"),
            ("STOCKADE_RATE_LIMIT_PER_MINUTE", "120"),
            ("STOCKADE_RATE_LIMIT_BURST", "7"),
            ("STOCKADE_API_KEY", "sk_abc"),
        ]))
        .unwrap();
        assert!(s.api_anonymous_orders);
        assert_eq!((s.rate_limit_per_minute, s.rate_limit_burst), (120, 7));
        assert_eq!(s.api_key.as_deref(), Some("sk_abc"));
        for (var, value) in [
            ("STOCKADE_API_ANONYMOUS_ORDERS", "maybe"),
            ("STOCKADE_RATE_LIMIT_PER_MINUTE", "0"),
            ("STOCKADE_RATE_LIMIT_BURST", "lots"),
        ] {
            let err = Settings::from_vars(vars(&[(var, value)])).unwrap_err();
            assert!(err.to_string().starts_with(var), "{var}={value}: {err}");
        }
    }

    #[test]
    fn secrets_do_not_print_through_debug() {
        let s = Settings::from_vars(vars(&[
            ("DATABASE_URL", "postgres://shop:hunter2@db:5432/stockade"),
            ("REDIS_URL", "redis://:s3cret@cache:6379"),
            ("STOCKADE_API_KEY", "sk_abc"),
            ("STOCKADE_METRICS_TOKEN", "0123456789abcdef0123"),
            ("STOCKADE_SMTP_URL", "smtps://mailer:pa55@smtp.example.com"),
            ("STOCKADE_REDIS_PASSWORD", "sentinel-pw"),
            (
                "STOCKADE_DATABASE_REPLICA_URL",
                "postgres://shop:hunter3@replica/stockade",
            ),
        ]))
        .unwrap();
        let printed = format!("{s:?}");
        for secret in [
            "hunter2",
            "s3cret",
            "sk_abc",
            "0123456789abcdef0123",
            "pa55",
            "sentinel-pw",
            "hunter3",
        ] {
            assert!(!printed.contains(secret), "{secret} printed in {printed}");
        }
        assert!(
            printed.contains(r#""postgres://shop:***@db:5432/stockade""#),
            "{printed}"
        );
        assert_eq!(
            s.database_url.as_deref(),
            Some("postgres://shop:hunter2@db:5432/stockade")
        );
    }

    #[test]
    fn unknown_stockade_variables_are_refused() {
        let err = Settings::from_vars(vars(&[("STOCKADE_LISTNE", "x")])).unwrap_err();
        assert_eq!(
            err,
            ConfigError::Unknown {
                var: "STOCKADE_LISTNE".into()
            }
        );
    }

    #[test]
    fn env_example_lists_every_variable_with_a_comment_and_valid_defaults() {
        let example = include_str!("../.env.example");
        let mut listed = Vec::new();
        let mut previous = "";
        for line in example.lines() {
            if let Some((name, _)) = line.split_once('=')
                && !line.starts_with('#')
            {
                assert!(previous.starts_with('#'), "{name} has no comment above it");
                listed.push(name.to_string());
            }
            previous = line;
        }
        assert_eq!(listed, VARIABLES, ".env.example and VARIABLES differ");
        // The example file itself is a valid configuration.
        let pairs = example
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()));
        Settings::from_vars(pairs).unwrap();
    }
}
