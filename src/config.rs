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

/// Declares every setting once: its field, type, variable, default (as the text
/// `.env.example` shows; `unset` for none) and reader. From the one table come the
/// [`Settings`] struct, its `Default`, [`VARIABLES`] and [`Settings::from_vars`].
///
/// A reader gets the variable's name and its (non-empty) value and returns the field's
/// value or a [`ConfigError`] naming the variable. An empty value counts as unset.
/// Fields under `internal` are not read from the environment.
macro_rules! settings {
    (
        environment {
            $(
                $(#[$doc:meta])*
                $field:ident: $ty:ty, $var:literal = $default:tt, $read:expr;
            )*
        }
        internal {
            $(
                $(#[$idoc:meta])*
                $ifield:ident: $ity:ty = $idefault:expr;
            )*
        }
    ) => {
        /// All settings of a Stockade process.
        #[derive(Debug, Clone)]
        pub struct Settings {
            $(
                $(#[$doc])*
                #[doc = concat!("\n\n`", $var, "`")]
                pub $field: $ty,
            )*
            $(
                $(#[$idoc])*
                pub $ifield: $ity,
            )*
        }

        impl Default for Settings {
            fn default() -> Self {
                Self {
                    $( $field: settings!(@default $var, $default, $read), )*
                    $( $ifield: $idefault, )*
                }
            }
        }

        /// Every variable Stockade reads, in the order `.env.example` lists them.
        pub const VARIABLES: &[&str] = &[$($var),*];

        /// Each variable's default as `.env.example` shows it (empty: unset).
        #[cfg(test)]
        const DEFAULTS: &[(&str, &str)] = &[$(($var, settings!(@text $default))),*];

        impl Settings {
            /// Reads settings from `(name, value)` pairs; other programs' variables are
            /// ignored, unknown `STOCKADE_*` ones are an error.
            pub fn from_vars(
                vars: impl IntoIterator<Item = (String, String)>,
            ) -> Result<Self, ConfigError> {
                let mut vars: BTreeMap<String, String> = vars
                    .into_iter()
                    .filter(|(k, _)| k.starts_with("STOCKADE_") || VARIABLES.contains(&k.as_str()))
                    // Not a setting: the mark a parent Stockade gives what it starts.
                    .filter(|(k, _)| k != crate::children::warden::VAR)
                    .collect();
                if let Some(unknown) = vars.keys().find(|k| !VARIABLES.contains(&k.as_str())) {
                    return Err(ConfigError::Unknown {
                        var: unknown.clone(),
                    });
                }
                let mut s = Self::default();
                $(
                    if let Some(v) = vars.remove($var).filter(|v| !v.trim().is_empty()) {
                        let read: Reader<$ty> = $read;
                        s.$field = read($var, &v)?;
                    }
                )*
                s.validate()?;
                Ok(s)
            }
        }
    };
    (@default $var:literal, unset, $read:expr) => {
        Default::default()
    };
    (@default $var:literal, $text:literal, $read:expr) => {{
        let read: Reader<_> = $read;
        read($var, $text).expect(concat!("the default of ", $var, " is valid"))
    }};
    (@text unset) => {
        ""
    };
    (@text $text:literal) => {
        $text
    };
}

/// Turns one variable's value into a setting.
type Reader<T> = fn(&'static str, &str) -> Result<T, ConfigError>;

settings! {
environment {
    /// Address and port of the HTTP server.
    listen: SocketAddr, "STOCKADE_LISTEN" = "127.0.0.1:8080",
        |var, v| parse(var, v, "expected address:port, e.g. 127.0.0.1:8080");
    /// Local mode keeps PostgreSQL and Redis data here.
    data_dir: PathBuf, "STOCKADE_DATA_DIR" = "./.stockade", |_, v| Ok(PathBuf::from(v));
    /// Connect to this PostgreSQL instead of starting one.
    database_url: Option<Secret>, "DATABASE_URL" = unset, |var, v| postgres_url(var, v).map(Some);
    /// Connect to this Redis instead of starting one.
    redis_url: Option<Secret>, "REDIS_URL" = unset, |var, v| {
        if !(v.starts_with("redis://") || v.starts_with("rediss://")) {
            return Err(malformed(var, v, "expected redis://host:port[/db]"));
        }
        Ok(Some(Secret::from(v)))
    };
    /// Local mode's PostgreSQL port (free port when unset).
    local_pg_port: Option<u16>, "STOCKADE_LOCAL_PG_PORT" = unset, |var, v| port(var, v).map(Some);
    /// Local mode's Redis port (free port when unset).
    local_redis_port: Option<u16>, "STOCKADE_LOCAL_REDIS_PORT" = unset,
        |var, v| port(var, v).map(Some);
    /// How an order takes stock. `batched` (group commit) is the fastest correct one, so
    /// the default; `redis-lock` is the per-request lease the benchmark compares against.
    order_strategy: OrderStrategy, "STOCKADE_ORDER_STRATEGY" = "batched", choice;
    /// Most orders one `batched` transaction applies.
    batch_max: usize, "STOCKADE_BATCH_MAX" = "128", |var, v| bounded(var, v, 1, 10_000);
    /// How long a `batched` leader waits for more orders before applying a batch that is
    /// not full (0: take what has queued meanwhile).
    batch_wait: Duration, "STOCKADE_BATCH_WAIT_US" = "0",
        |var, v| bounded(var, v, 0, 1_000_000).map(Duration::from_micros);
    /// How long a process reuses what it read for the catalogue and product pages (0: read
    /// every time).
    page_cache: Duration, "STOCKADE_PAGE_CACHE_MS" = "500",
        |var, v| bounded(var, v, 0, 60_000).map(Duration::from_millis);
    /// HTTP worker threads; 0 means one per CPU core.
    workers: usize, "STOCKADE_WORKERS" = "0", |var, v| bounded(var, v, 0, 256);
    /// Connections per process.
    db_pool_size: u32, "STOCKADE_DB_POOL_SIZE" = "16", |var, v| bounded(var, v, 1, 1_000);
    /// Prefix of every Redis key this process writes.
    redis_prefix: String, "STOCKADE_REDIS_PREFIX" = "stockade:", |_, v| Ok(v.to_string());
    /// PostgreSQL `statement_timeout`.
    statement_timeout: Duration, "STOCKADE_STATEMENT_TIMEOUT_MS" = "1500", millis;
    /// An order transaction is abandoned (rolled back) after this.
    tx_timeout: Duration, "STOCKADE_TX_TIMEOUT_MS" = "2000", millis;
    /// PostgreSQL `idle_in_transaction_session_timeout` of the app's sessions: a session
    /// that sends nothing this long inside a transaction (its process stopped) is ended,
    /// and its row locks go back to other buyers. The app never waits inside one.
    idle_in_tx_timeout: Duration, "STOCKADE_IDLE_IN_TX_TIMEOUT_MS" = "500", millis;
    /// Every request answers within this, whatever the database or Redis do; what is still
    /// waiting then is cut off and answered 503.
    request_budget: Duration, "STOCKADE_REQUEST_BUDGET_MS" = "5000", millis;
    /// How long a request queues for a free database connection before it is shed with 503.
    db_acquire_timeout: Duration, "STOCKADE_DB_ACQUIRE_TIMEOUT_MS" = "500", millis;
    /// How long one Redis command may take before it counts as a failure (towards opening
    /// the circuit breaker).
    redis_timeout: Duration, "STOCKADE_REDIS_TIMEOUT_MS" = "250", millis;
    /// A SKU lease not renewed for this long expires. Its holder renews it every third of
    /// this while it works, so the TTL only bounds how long a stopped or dead holder blocks
    /// the SKU.
    lease_ttl: Duration, "STOCKADE_LEASE_TTL_MS" = "1000", millis;
    /// How long an order waits for busy SKUs before answering 503.
    lease_wait: Duration, "STOCKADE_LEASE_WAIT_MS" = "2000", millis;
    /// Most units of one SKU in one order.
    max_line_quantity: i32, "STOCKADE_MAX_LINE_QUANTITY" = "10",
        |var, v| bounded(var, v, 1, 1_000_000);
    /// Completed idempotency keys are kept this long.
    idempotency_ttl_hours: u32, "STOCKADE_IDEMPOTENCY_TTL_HOURS" = "24",
        |var, v| bounded(var, v, 24, 24 * 365);
    /// Delivered and failed events (with their deliveries) are kept this long, then
    /// purged; pending ones stay until they are sent or given up.
    event_retention_days: u32, "STOCKADE_EVENT_RETENTION_DAYS" = "30",
        |var, v| bounded(var, v, 1, 3650);
    /// Released and expired holds (with their lines) are kept this long after their state
    /// changed, then purged — never sooner than `STOCKADE_IDEMPOTENCY_TTL_HOURS`, so a key
    /// retried within its TTL still finds its hold. Confirmed holds stay with their orders.
    hold_retention_days: u32, "STOCKADE_HOLD_RETENTION_DAYS" = "7",
        |var, v| bounded(var, v, 1, 3650);
    /// Accept API orders and holds without an API key (all such callers then share one
    /// identity). Off: they are answered 401.
    api_anonymous_orders: bool, "STOCKADE_API_ANONYMOUS_ORDERS" = "false", boolean;
    /// Orders and holds one client (an API client, or an address) may place per minute,
    /// sustained.
    rate_limit_per_minute: u32, "STOCKADE_RATE_LIMIT_PER_MINUTE" = "60",
        |var, v| bounded(var, v, 1, 1_000_000);
    /// How many of them may come at once.
    rate_limit_burst: u32, "STOCKADE_RATE_LIMIT_BURST" = "20",
        |var, v| bounded(var, v, 1, 1_000_000);
    /// The API key `stockade loadtest` sends to servers it did not start (read by the
    /// tools, not by the server).
    api_key: Option<Secret>, "STOCKADE_API_KEY" = unset, |_, v| Ok(Some(Secret::from(v)));
    /// Failed admin logins per account within the window.
    login_max_failures: i64, "STOCKADE_LOGIN_MAX_FAILURES" = "5",
        |var, v| bounded(var, v, 1, 1_000_000);
    /// Failed logins per client address within the window.
    login_max_failures_per_client: i64, "STOCKADE_LOGIN_MAX_FAILURES_PER_CLIENT" = "20",
        |var, v| bounded(var, v, 1, 1_000_000);
    /// The window failed logins are counted over.
    login_window: Duration, "STOCKADE_LOGIN_WINDOW_SECONDS" = "900",
        |var, v| bounded(var, v, 1, 86_400).map(Duration::from_secs);
    /// Wrong API keys one client address may send within the window; past them it is
    /// answered 429 without a database lookup ([`crate::http::limits::caller`]).
    api_key_max_failures: u32, "STOCKADE_API_KEY_MAX_FAILURES" = "20",
        |var, v| bounded(var, v, 1, 1_000_000);
    /// The window wrong API keys are counted over.
    api_key_failure_window: Duration, "STOCKADE_API_KEY_FAILURE_WINDOW_SECONDS" = "60",
        |var, v| bounded(var, v, 1, 86_400).map(Duration::from_secs);
    /// Mark cookies Secure (set when a TLS proxy is in front; requests that arrive over
    /// https get Secure cookies anyway).
    secure_cookies: bool, "STOCKADE_SECURE_COOKIES" = "false", boolean;
    /// Addresses and networks (CIDR) of the proxies in front of this server. A request from
    /// one of them has its client address taken from `X-Forwarded-For` (the right-most hop
    /// that is not a trusted proxy); empty trusts none, and the peer address is the client.
    /// See [`crate::http::client_addr`].
    trusted_proxies: Vec<IpNet>, "STOCKADE_TRUSTED_PROXIES" = unset, |var, v| {
        v.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| p.parse::<IpNet>())
            .collect::<Result<_, _>>()
            .map_err(|e| malformed(var, v, &e))
    };
    /// A connection whose first request head has not fully arrived this long after it was
    /// opened is answered 408 (a problem document) and closed.
    head_timeout: Duration, "STOCKADE_HEAD_TIMEOUT_MS" = "5000",
        |var, v| bounded(var, v, 100, 600_000).map(Duration::from_millis);
    /// A request body not fully received this long after the request's head is answered
    /// 408 and its connection closed.
    body_timeout: Duration, "STOCKADE_BODY_TIMEOUT_MS" = "4000",
        |var, v| bounded(var, v, 100, 600_000).map(Duration::from_millis);
    /// Serve `/metrics` (and nothing else) on this address of its own, without a token.
    /// Unset: no metrics listener.
    metrics_listen: Option<SocketAddr>, "STOCKADE_METRICS_LISTEN" = unset,
        |var, v| parse(var, v, "expected address:port, e.g. 127.0.0.1:9090").map(Some);
    /// Serve `/metrics` on the public port too, to requests with `Authorization: Bearer
    /// <token>`. Unset: `/metrics` is 404 on the public port.
    metrics_token: Option<Secret>, "STOCKADE_METRICS_TOKEN" = unset, |var, v| {
        let v = v.trim();
        if v.len() < 16 || !v.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(malformed(
                var,
                "(hidden)",
                "expected at least 16 printable characters without spaces",
            ));
        }
        Ok(Some(Secret::from(v)))
    };
    /// How long a checkout hold keeps stock for the shopper.
    hold_ttl: Duration, "STOCKADE_HOLD_SECONDS" = "600",
        |var, v| bounded(var, v, 1, 86_400).map(Duration::from_secs);
    /// Most units of one SKU a checkout may hold, and one shopper (API client, browser,
    /// email) in all their live holds together.
    hold_max_per_sku: i32, "STOCKADE_HOLD_MAX_PER_SKU" = "5",
        |var, v| bounded(var, v, 1, 1_000_000);
    /// Most units of one SKU the live holds from one client address may keep together
    /// (larger: one address may be a whole office or a carrier's NAT).
    hold_max_per_sku_per_address: i32, "STOCKADE_HOLD_MAX_PER_SKU_PER_ADDRESS" = "20",
        |var, v| bounded(var, v, 1, 1_000_000);
    /// Places in one drop's queue that one client address may take; 0 for no limit. One
    /// address may be a household, an office or a carrier's NAT, so the default lets a
    /// crowd behind one address in and stops only a script with hundreds of cookies.
    drop_places_per_address: u32, "STOCKADE_DROP_PLACES_PER_ADDRESS" = "50",
        |var, v| bounded(var, v, 0, 1_000_000);
    /// How often each process releases expired holds.
    sweep_interval: Duration, "STOCKADE_SWEEP_INTERVAL_MS" = "1000", millis;
    /// How often each process probes the database (`select 1`); while a probe finds it
    /// refusing connections, requests that need it are answered 503 at once. 0: no probe.
    db_probe_interval: Duration, "STOCKADE_DB_PROBE_MS" = "250", millis;
    /// How often each process lets a live drop's shoppers in (besides on every poll) and
    /// looks for drops that opened or sold out.
    drop_tick_interval: Duration, "STOCKADE_DROP_TICK_MS" = "250", millis;
    /// How often each process's dispatcher looks for events to route and deliveries to send
    /// when it has nothing to do.
    dispatch_interval: Duration, "STOCKADE_DISPATCH_INTERVAL_MS" = "500", millis;
    /// Attempts of one delivery before it is failed.
    delivery_max_attempts: u32, "STOCKADE_DELIVERY_MAX_ATTEMPTS" = "10",
        |var, v| bounded(var, v, 1, 100);
    /// The first retry's wait; it doubles per attempt (with jitter, at most an hour).
    delivery_backoff: Duration, "STOCKADE_DELIVERY_BACKOFF_MS" = "1000", millis;
    /// How long one webhook or SMTP send may take.
    webhook_timeout: Duration, "STOCKADE_WEBHOOK_TIMEOUT_MS" = "5000",
        |var, v| bounded(var, v, 100, 120_000).map(Duration::from_millis);
    /// Let webhooks go to loopback and private addresses (tests, and receivers on the
    /// shop's own network). Off: refused (SSRF).
    webhook_allow_private: bool, "STOCKADE_WEBHOOK_ALLOW_PRIVATE" = "false", boolean;
    /// Take payment at checkout: `off` (orders are placed without it) or `stripe`.
    payments: PaymentsMode, "STOCKADE_PAYMENTS" = "off", choice;
    /// The provider's secret API key (`sk_…`); local mode makes one up for its fake Stripe.
    stripe_secret_key: Option<Secret>, "STOCKADE_STRIPE_SECRET_KEY" = unset,
        |var, v| api_key(var, v, "sk_").map(Some);
    /// The publishable key the checkout page gives Stripe.js (`pk_…`).
    stripe_publishable_key: Option<String>, "STOCKADE_STRIPE_PUBLISHABLE_KEY" = unset,
        |var, v| api_key(var, v, "pk_").map(|k| Some(k.to_string()));
    /// The secret Stripe signs webhooks to `/webhooks/stripe` with (`whsec_…`).
    stripe_webhook_secret: Option<Secret>, "STOCKADE_STRIPE_WEBHOOK_SECRET" = unset,
        |var, v| api_key(var, v, "whsec_").map(Some);
    /// Where the provider's API is (and Stripe.js, at `/js.stripe.com/v3/` of it when it is
    /// not Stripe's own): a Stripe-compatible server such as localstripe.
    stripe_api_base: String, "STOCKADE_STRIPE_API_BASE" = "https://api.stripe.com", |var, v| {
        if !(v.starts_with("http://") || v.starts_with("https://")) {
            return Err(malformed(var, v, "expected http://… or https://…"));
        }
        Ok(v.trim().trim_end_matches('/').to_string())
    };
    /// How long one call to the provider may take before it counts as unanswered.
    stripe_timeout: Duration, "STOCKADE_STRIPE_TIMEOUT_MS" = "10000",
        |var, v| bounded(var, v, 100, 120_000).map(Duration::from_millis);
    /// The shop's one currency (ISO 4217, lower case), shown with every price.
    currency: String, "STOCKADE_CURRENCY" = "usd", |var, v| {
        let v = v.trim().to_ascii_lowercase();
        if v.len() != 3 || !v.bytes().all(|b| b.is_ascii_lowercase()) {
            return Err(malformed(var, &v, "expected a three-letter ISO 4217 code, e.g. usd"));
        }
        // Prices are kept in hundredths; these currencies have none, or thousandths.
        const NOT_HUNDREDTHS: [&str; 21] = [
            "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd",
            "vuv", "xaf", "xof", "xpf", "bhd", "jod", "kwd", "omr", "tnd",
        ];
        if NOT_HUNDREDTHS.contains(&v.as_str()) {
            return Err(malformed(
                var,
                &v,
                "Stockade keeps prices in hundredths of a unit; this currency is not divided so",
            ));
        }
        Ok(v)
    };
    /// The shop's time zone (an IANA name, e.g. Europe/Berlin): every time a person reads
    /// is shown in it, with its abbreviation, and the drop form's date and time is in it.
    time_zone: chrono_tz::Tz, "STOCKADE_TIME_ZONE" = "UTC", |var, v| {
        v.trim().parse::<chrono_tz::Tz>().map_err(|_| {
            malformed(var, v, "expected an IANA time zone name, e.g. Europe/Berlin or UTC")
        })
    };
    /// Starting to pay extends the hold once, to at least this long from then.
    payment_extension: Duration, "STOCKADE_PAYMENT_EXTENSION_SECONDS" = "900",
        |var, v| bounded(var, v, 1, 3_600).map(Duration::from_secs);
    /// The reconciler looks at a payment nobody finished this long after it was last
    /// touched (and again as often, until it is settled).
    payment_reconcile_after: Duration, "STOCKADE_PAYMENT_RECONCILE_MS" = "10000", millis;
    /// Send receipts through this SMTP server, e.g. `smtps://user:pass@smtp.example.com` or
    /// `smtp://127.0.0.1:2525`.
    smtp_url: Option<Secret>, "STOCKADE_SMTP_URL" = unset, |var, v| {
        if !(v.starts_with("smtp://") || v.starts_with("smtps://")) {
            return Err(malformed(var, "(hidden)", "expected smtp://… or smtps://…"));
        }
        Ok(Some(Secret::from(v.trim())))
    };
    /// The receipts' sender.
    mail_from: String, "STOCKADE_MAIL_FROM" = "Stockade <shop@localhost>",
        |_, v| Ok(v.trim().to_string());
    /// Without SMTP, write receipts as `.eml` files here (local mode: `mail/` in the data
    /// folder). Neither set: no receipts.
    mail_dir: Option<PathBuf>, "STOCKADE_MAIL_DIR" = unset, |_, v| Ok(Some(PathBuf::from(v)));
    /// The shop's address as shoppers reach it, for links in receipts. Unset: `http://` +
    /// the listen address.
    public_url: Option<String>, "STOCKADE_PUBLIC_URL" = unset, |var, v| {
        if !(v.starts_with("http://") || v.starts_with("https://")) {
            return Err(malformed(var, v, "expected http://… or https://…"));
        }
        Ok(Some(v.trim().trim_end_matches('/').to_string()))
    };
    /// `host:port` of Redis Sentinels; when set, the Redis master is found through them (and
    /// followed across a failover) instead of `REDIS_URL`.
    redis_sentinels: Vec<String>, "STOCKADE_REDIS_SENTINELS" = unset, |var, v| {
        v.split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(|a| match a.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    Ok(a.to_string())
                }
                _ => Err(malformed(var, v, "expected host:port,host:port,…")),
            })
            .collect()
    };
    /// The master's name the Sentinels monitor.
    redis_master: String, "STOCKADE_REDIS_MASTER" = "stockade", |_, v| Ok(v.trim().to_string());
    /// The password of the Redis master and replicas found through Sentinel (`REDIS_URL`
    /// carries its own).
    redis_password: Option<Secret>, "STOCKADE_REDIS_PASSWORD" = unset,
        |_, v| Ok(Some(Secret::from(v)));
    /// The Sentinels' own password (their `requirepass`), sent with every question to them.
    redis_sentinel_password: Option<Secret>, "STOCKADE_REDIS_SENTINEL_PASSWORD" = unset,
        |_, v| Ok(Some(Secret::from(v)));
    /// A streaming replica that takes the reads which may lag (catalogue, product pages,
    /// product API, admin reports); unset: the primary.
    database_replica_url: Option<Secret>, "STOCKADE_DATABASE_REPLICA_URL" = unset,
        |var, v| postgres_url(var, v).map(Some);
    /// `DATABASE_URL` is a PgBouncer (session pooling): the session timeouts are not sent
    /// at connect (PgBouncer refuses startup options) but set by PgBouncer's
    /// `connect_query`.
    database_pgbouncer: bool, "STOCKADE_DATABASE_PGBOUNCER" = "false", boolean;
    /// `pretty` or `json`.
    log_format: LogFormat, "STOCKADE_LOG_FORMAT" = "pretty", choice;
    /// Tracing filter, e.g. `info` or `stockade=debug`.
    log_filter: String, "STOCKADE_LOG" = "info", |_, v| Ok(v.to_string());
}
internal {
    /// Fault injection for tests: pause this long after taking leases, before the
    /// transaction, as a stalled process would. Not settable from the environment.
    fault_pause_after_lease: Duration = Duration::ZERO;
}
}

impl Settings {
    /// How long completed idempotency records are kept (`STOCKADE_IDEMPOTENCY_TTL_HOURS`).
    pub fn idempotency_ttl(&self) -> Duration {
        Duration::from_secs(u64::from(self.idempotency_ttl_hours) * 3600)
    }

    /// How long released and expired holds are kept: `STOCKADE_HOLD_RETENTION_DAYS`, or the
    /// idempotency TTL if that is longer.
    pub fn hold_retention(&self) -> Duration {
        let days = Duration::from_secs(u64::from(self.hold_retention_days) * 86_400);
        days.max(self.idempotency_ttl())
    }

    /// How long delivered events are kept (`STOCKADE_EVENT_RETENTION_DAYS`).
    pub fn event_retention(&self) -> Duration {
        Duration::from_secs(u64::from(self.event_retention_days) * 86_400)
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(std::env::vars())
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
        // Zero would turn the server's timeout off.
        if self.idle_in_tx_timeout.is_zero() || self.idle_in_tx_timeout > self.tx_timeout {
            return Err(ConfigError::Inconsistent(format!(
                "STOCKADE_IDLE_IN_TX_TIMEOUT_MS ({} ms) must be from 1 to STOCKADE_TX_TIMEOUT_MS ({} ms)",
                self.idle_in_tx_timeout.as_millis(),
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
        if self.payments == PaymentsMode::Stripe
            && (self.stripe_secret_key.is_none()
                || self.stripe_publishable_key.is_none()
                || self.stripe_webhook_secret.is_none())
            && !self.local_mode()
        {
            return Err(ConfigError::Inconsistent(
                "STOCKADE_PAYMENTS=stripe needs STOCKADE_STRIPE_SECRET_KEY, \
                 STOCKADE_STRIPE_PUBLISHABLE_KEY and STOCKADE_STRIPE_WEBHOOK_SECRET"
                    .into(),
            ));
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

fn choice<T: FromStr<Err = String>>(var: &'static str, value: &str) -> Result<T, ConfigError> {
    value.parse().map_err(|e: String| malformed(var, value, &e))
}

fn postgres_url(var: &'static str, value: &str) -> Result<Secret, ConfigError> {
    if !(value.starts_with("postgres://") || value.starts_with("postgresql://")) {
        return Err(malformed(
            var,
            value,
            "expected postgres://user:password@host:port/database",
        ));
    }
    Ok(Secret::from(value))
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

/// A provider key: `prefix` and printable characters without spaces.
fn api_key(var: &'static str, value: &str, prefix: &str) -> Result<Secret, ConfigError> {
    let v = value.trim();
    if !v.starts_with(prefix) || v.len() <= prefix.len() || !v.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(malformed(
            var,
            "(hidden)",
            &format!("expected {prefix}… without spaces"),
        ));
    }
    Ok(Secret::from(v))
}

fn port(var: &'static str, value: &str) -> Result<u16, ConfigError> {
    bounded(var, value, 1, u16::MAX)
}

fn millis(var: &'static str, value: &str) -> Result<Duration, ConfigError> {
    bounded(var, value, 1u64, 3_600_000).map(Duration::from_millis)
}

mod net;
mod values;

pub use values::{LogFormat, OrderStrategy, PaymentsMode, Secret};

pub use net::{IpNet, canonical_ip};

#[cfg(test)]
mod tests;
