//! `Application::build` wires the process: database pool, migrations, Redis, the HTTP
//! server bound to its listener. Production and tests run exactly this code; tests bind
//! port 0 and read [`Application::port`].

use std::future::ready;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_http::{HttpService, KeepAlive};
use actix_service::{IntoServiceFactory, ServiceFactoryExt, fn_service, map_config};
use actix_web::dev::{AppConfig, Server, ServerHandle};
use actix_web::middleware::from_fn;
use actix_web::rt::net::TcpStream;
use actix_web::{App, web};
use anyhow::Context;
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::config::Settings;
use crate::error::AppError;
use crate::http::{self, AppState, middleware::around_request};
use crate::locking::Redis;
use crate::metrics::Metrics;
use crate::pg::replica::{REPLICA_ACQUIRE_TIMEOUT, Replica};

/// The migrations in `migrations/`, compiled in.
pub static MIGRATOR: Migrator = sqlx::migrate!();

/// Request bodies above these sizes are refused with 413 (JSON: [`http::json::JSON_LIMIT`]).
use crate::http::json::JSON_LIMIT;
const FORM_LIMIT: usize = 16 * 1024;

/// How long a kept-alive connection may sit idle between requests (actix's default).
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// A built, not yet running, Stockade server.
pub struct Application {
    port: u16,
    server: Server,
    state: web::Data<AppState>,
}

impl Application {
    /// Connects to PostgreSQL (and migrates it) and Redis, and binds the listener.
    /// `settings.database_url` and `settings.redis_url` must be set; local mode fills them in.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        crate::catalog::set_currency(&settings.currency);
        crate::clock::set_zone(settings.time_zone);
        migrate(&settings).await?;
        let (main, theirs) = Leaders::split(&settings);
        let db = connect_database_with(&settings, main).await?;
        let redis = connect_redis(&settings).await?;
        // The sold-out answers and key marks need `SET … NX GET`. A Redis that does not
        // answer now is not checked: the app starts on the database guard alone.
        if let Some((major, minor)) = redis.version().await
            && major < 7
        {
            anyhow::bail!(
                "Redis {major}.{minor} is too old: Stockade needs Redis 7.0 or later \
                 (SET with both NX and GET)"
            );
        }
        redis.set_fence_source(db.clone());
        let replica = match &settings.database_replica_url {
            Some(url) => {
                let options = connect_options(&settings, url, "STOCKADE_DATABASE_REPLICA_URL")?;
                let pool =
                    pool_options(&settings, REPLICA_ACQUIRE_TIMEOUT).connect_lazy_with(options);
                let replica = Arc::new(Replica::new(pool, db.clone()));
                replica.spawn_check();
                Some(replica)
            }
            None => None,
        };

        let listener = TcpListener::bind(settings.listen)
            .with_context(|| format!("STOCKADE_LISTEN: cannot listen on {}", settings.listen))?;
        let port = listener.local_addr()?.port();
        let metrics_listener = match settings.metrics_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .with_context(|| format!("STOCKADE_METRICS_LISTEN: cannot listen on {addr}"))?,
            ),
            None => None,
        };
        let metrics_addr = match &metrics_listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        let workers = match settings.workers {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        spawn_stale_key_purge(db.clone(), crate::checkout::stale_after(&settings));
        crate::retention::spawn(db.clone(), crate::retention::Windows::of(&settings));
        crate::holds::spawn_sweeper(db.clone(), redis.clone(), settings.sweep_interval);
        crate::checkout::sold_out::spawn_drain(db.clone(), redis.clone());
        let settings = Arc::new(settings);
        let metrics = Arc::new(Metrics::new());
        let public_url = (settings.public_url.clone())
            .unwrap_or_else(|| format!("http://{}:{port}", settings.listen.ip()));
        let mailer =
            crate::events::mail::Mailer::from_settings(&settings, &public_url)?.map(Arc::new);
        crate::events::dispatch::Dispatcher::new(
            db.clone(),
            settings.clone(),
            metrics.clone(),
            mailer,
        )?
        .spawn();
        let catalog = Arc::new(crate::catalog::cache::CatalogCache::new(
            settings.page_cache,
        ));
        let leaders = Leaders::connect(&db, theirs);
        let batcher = Arc::new(crate::checkout::Batcher::new(
            leaders.pool.clone(),
            redis.clone(),
            settings.clone(),
            metrics.clone(),
            catalog.clone(),
        ));
        let confirmer = Arc::new(crate::holds::Confirmer::new(
            db.clone(),
            leaders.pool.clone(),
            &settings,
        ));
        let payments = crate::payments::Payments::new(
            &settings,
            db.clone(),
            redis.clone(),
            confirmer.clone(),
        )?
        .map(Arc::new);
        if let Some(payments) = &payments {
            let every = (settings.payment_reconcile_after / 4).max(Duration::from_millis(200));
            crate::payments::finish::spawn_reconciler(payments.clone(), every);
        }
        let drops = Arc::new(crate::drops::Registry::default());
        crate::drops::spawn_ticker(
            db.clone(),
            redis.clone(),
            drops.clone(),
            settings.drop_tick_interval,
        );
        let outage = Arc::new(crate::pg::outage::Outage::default());
        outage.spawn(db.clone(), settings.db_probe_interval);
        let state = web::Data::new(AppState {
            outage,
            confirmer,
            db,
            leaders: leaders.own.then_some(leaders.pool),
            limiter: Arc::new(crate::ratelimit::RateLimiter::new(redis.clone())),
            redis,
            settings,
            metrics,
            batcher,
            catalog,
            metrics_addr,
            api_keys: Arc::default(),
            drops,
            replica,
            payments,
        });
        let app_state = state.clone();
        let app = move |listener: SocketAddr| {
            App::new()
                .wrap(from_fn(around_request))
                .wrap(from_fn(http::shown::redirect_form_answers))
                .app_data(app_state.clone())
                .app_data(http::Listener(listener))
                .app_data(
                    web::JsonConfig::default()
                        .limit(JSON_LIMIT)
                        .error_handler(|e, _| http::json::payload_error(e).into()),
                )
                .app_data(
                    web::FormConfig::default()
                        .limit(FORM_LIMIT)
                        .error_handler(|e, _| http::params::form_error(e).into()),
                )
                .app_data(
                    web::QueryConfig::default()
                        .error_handler(|e, _| http::params::query_error(e).into()),
                )
                .app_data(web::PayloadConfig::default().limit(JSON_LIMIT))
                .configure(http::routes)
                .default_service(web::to(not_found))
        };
        let mut builder = actix_server::Server::build();
        let shutdown = builder.graceful_shutdown_signal();
        let head_timeout = state.settings.head_timeout;
        for listener in std::iter::once(listener).chain(metrics_listener) {
            let addr = listener.local_addr()?;
            let (app, shutdown) = (app.clone(), shutdown.clone());
            builder = builder.listen(format!("stockade-{addr}"), listener, move || {
                let shutdown = shutdown.clone();
                let app = app(addr)
                    .into_factory()
                    .map_err(|e: actix_web::Error| e.error_response());
                let http1 = HttpService::build()
                    .keep_alive(KeepAlive::Timeout(KEEP_ALIVE))
                    // The first head's deadline is `HeadDeadline`'s, which reads first.
                    .client_request_timeout(Duration::ZERO)
                    .client_disconnect_timeout(Duration::from_secs(1))
                    .local_addr(addr)
                    .graceful_shutdown_signal(move || {
                        let signal = shutdown.clone();
                        async move { signal.notified().await }
                    })
                    .h1(map_config(app, |_| AppConfig::default()));
                fn_service(move |io: TcpStream| {
                    let peer = io.peer_addr().ok();
                    ready(Ok((http::HeadDeadline::new(io, head_timeout), peer)))
                })
                .and_then(http1)
            })?;
        }
        let server = builder
            .workers(workers)
            .disable_signals()
            .shutdown_timeout(10)
            .run();
        Ok(Self {
            port,
            server,
            state,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the metrics listener (`STOCKADE_METRICS_LISTEN`), if there is one.
    pub fn metrics_port(&self) -> Option<u16> {
        self.state.metrics_addr.map(|a| a.port())
    }

    pub fn db(&self) -> &PgPool {
        &self.state.db
    }

    /// Stops the server: `handle().stop(true)` finishes in-flight requests first.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}

async fn not_found() -> Result<actix_web::HttpResponse, AppError> {
    Err(AppError::not_found(
        "There is nothing at this address. It may have moved, or the link is mistyped.",
    ))
}

/// The process's Redis: through the Sentinels when `STOCKADE_REDIS_SENTINELS` is set,
/// else `REDIS_URL`.
pub async fn connect_redis(settings: &Settings) -> anyhow::Result<Redis> {
    if !settings.redis_sentinels.is_empty() {
        return Redis::connect_sentinel(
            &settings.redis_sentinels,
            &settings.redis_master,
            settings.redis_password.as_deref(),
            settings.redis_sentinel_password.as_deref(),
            &settings.redis_prefix,
            settings.redis_timeout,
        )
        .await
        .context("STOCKADE_REDIS_SENTINELS: cannot find the Redis master");
    }
    let redis_url = settings
        .redis_url
        .as_deref()
        .context("REDIS_URL is not set")?;
    Redis::connect(redis_url, &settings.redis_prefix, settings.redis_timeout)
        .with_context(|| format!("REDIS_URL {redis_url:?} cannot be used"))
}

/// A pool whose sessions carry the configured statement timeout.
pub async fn connect_database(settings: &Settings) -> anyhow::Result<PgPool> {
    connect_database_with(settings, settings.db_pool_size).await
}

/// [`connect_database`] with a pool of `size` connections.
async fn connect_database_with(settings: &Settings, size: u32) -> anyhow::Result<PgPool> {
    let url = settings
        .database_url
        .as_deref()
        .context("DATABASE_URL is not set")?;
    let options = connect_options(settings, url, "DATABASE_URL")?;
    // The first connection may take longer than a request may wait for one (a server or
    // PgBouncer busy with other processes' logins): it is tried for a while.
    let deadline = std::time::Instant::now() + FIRST_CONNECTION_WITHIN;
    loop {
        match pool_options(settings, settings.db_acquire_timeout)
            .max_connections(size)
            .connect_with(options.clone())
            .await
        {
            Ok(pool) => return Ok(pool),
            Err(sqlx::Error::PoolTimedOut) if std::time::Instant::now() < deadline => {}
            Err(e) => return Err(e).context("could not connect to PostgreSQL (DATABASE_URL)"),
        }
    }
}

/// The connections of the group-commit leaders (orders' and holds' batches, confirmation
/// lots, sold-out lots), carved out of the process's `STOCKADE_DB_POOL_SIZE`.
///
/// Why a pool of their own: each actix worker is a single-threaded runtime, and a socket
/// is watched by the runtime that opened it, which under load looks at its sockets only
/// between runs of its tasks (every 61 of them). A leader working on a worker (or on a
/// connection a worker opened) waits that long for every answer, and a batch holding the
/// hot stock row's lock holds it that much longer, for every buyer of the SKU. The leaders
/// run on the process's own runtime instead, whose threads are idle but for background
/// work, on connections only they open there: a hold batch's answers arrive at once. (A
/// storefront drop, side by side: 745 → 1,013 checkouts a second, and the open loop's
/// p50 at 80 % of the peak from 990 ms, past the old build's capacity, to 59 ms.)
struct Leaders {
    pool: PgPool,
    /// Whether `pool` is the leaders' own (not the process's pool, shared).
    own: bool,
}

impl Leaders {
    /// `STOCKADE_DB_POOL_SIZE` as (the process's pool, the leaders'). Under `batched`,
    /// leaders take a third of a pool of twelve or more, four to six connections: three
    /// leaders can be at work at once (batches, sold-out lots, confirmation lots), each
    /// using one connection and another while sqlx pings the one it released. A smaller
    /// pool is shared (0), and so is every pool under the other strategies, which start no
    /// leaders.
    fn split(settings: &Settings) -> (u32, u32) {
        let size = settings.db_pool_size;
        if settings.order_strategy != crate::config::OrderStrategy::Batched || size < 12 {
            return (size, 0);
        }
        let theirs = (size / 3).clamp(4, 6);
        (size - theirs, theirs)
    }

    /// The leaders' pool, of `size` connections opened on first use (by the leaders, on
    /// this runtime) as `db`'s are; `db` itself when `size` is 0. Call it on the runtime
    /// the leaders will run on.
    fn connect(db: &PgPool, size: u32) -> Self {
        if size == 0 {
            return Self {
                pool: db.clone(),
                own: false,
            };
        }
        let pool = db
            .options()
            .clone()
            .max_connections(size)
            .connect_lazy_with((*db.connect_options()).clone());
        Self { pool, own: true }
    }
}

/// How long a process tries to open its first database connection.
const FIRST_CONNECTION_WITHIN: Duration = Duration::from_secs(10);

/// How this process's sessions are opened: with the statement, lock and idle-transaction
/// timeouts as startup options, or, through PgBouncer (which refuses startup options),
/// without: PgBouncer sets them on its server connections (`connect_query`).
/// How the app connects to the database at `url` (named by its variable `var`): its
/// application name and session timeouts. Public so tests can open a session exactly as
/// the app's.
pub fn connect_options(
    settings: &Settings,
    url: &str,
    var: &str,
) -> anyhow::Result<PgConnectOptions> {
    let options: PgConnectOptions = url
        .parse()
        .with_context(|| format!("{var} cannot be parsed"))?;
    let options = options.application_name("stockade");
    if settings.database_pgbouncer && var == "DATABASE_URL" {
        return Ok(options);
    }
    // Every statement ends before the transaction's own deadline; a session left idle in a
    // transaction (a frozen process) is ended by the server, releasing its row locks. The
    // app sends a transaction's statements back to back (nothing inside one waits for
    // Redis, a hash or a picture), so a short idle timeout ends only stopped ones.
    let statement_ms = settings.statement_timeout.as_millis().to_string();
    let tx_ms = settings.idle_in_tx_timeout.as_millis().to_string();
    // The server also probes an idle client and drops one that stops acknowledging, so a
    // vanished process does not keep its backend and locks for TCP's default minutes.
    Ok(options.options([
        ("statement_timeout", statement_ms.as_str()),
        ("lock_timeout", statement_ms.as_str()),
        ("idle_in_transaction_session_timeout", tx_ms.as_str()),
        ("tcp_keepalives_idle", "5"),
        ("tcp_keepalives_interval", "1"),
        ("tcp_keepalives_count", "3"),
        ("tcp_user_timeout", "5000"),
    ]))
}

fn pool_options(settings: &Settings, acquire_timeout: Duration) -> PgPoolOptions {
    // sqlx pings every connection on its release (a round trip, no time limit) to drain
    // what a call dropped mid-way left behind. Behind a network that stopped answering
    // that ping would wait for TCP to give up, holding a pool slot for minutes, so while
    // the network is suspect (a call was cut off by its time limit within the last
    // `pg::SUSPECT_FOR`, see `pg::cut_off`) a released connection is first pinged within
    // the statement timeout and closed if it does not answer. Otherwise the release costs
    // sqlx's one ping and no more: at the rates that matter, a round trip per use (a cold
    // product page served 7,500/s with two pings per use, 10,300/s with one). What stays
    // exposed is what was before: a connection whose ping from sqlx is already on the wire
    // when the network dies waits for the network (or TCP) like any call in flight (sqlx
    // sets no client-side timeout); under load that can be a good share of the pool, which
    // comes back when the network does.
    // A connection handed out again within a second of its release is not pinged again;
    // one that sat idle longer is, as the server may have gone away meanwhile.
    let ping_within = settings.statement_timeout;
    PgPoolOptions::new()
        .max_connections(settings.db_pool_size)
        .acquire_timeout(acquire_timeout)
        // A wait that long ends in a 503, which is logged; no second warning for it.
        .acquire_slow_threshold(acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                use sqlx::Connection;
                if meta.idle_for < Duration::from_secs(1) {
                    return Ok(true);
                }
                Ok(crate::pg::bounded(ping_within, conn.ping()).await.is_ok())
            })
        })
        .after_release(move |conn, _| {
            Box::pin(async move {
                use sqlx::Connection;
                if !crate::pg::suspect() {
                    return Ok(true);
                }
                crate::pg::bounded(ping_within, conn.ping())
                    .await
                    .map(|()| true)
            })
        })
}

/// Releases, every [`STALE_PURGE_EVERY`], the idempotency keys of requests that died in
/// flight longer than `stale_after` ago, so no dead record blocks its key much past the
/// stale window (in every process: the delete is idempotent). What is kept for how long
/// is [`crate::retention`]'s.
fn spawn_stale_key_purge(db: PgPool, stale_after: Duration) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(STALE_PURGE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let purge = crate::idempotency::purge_stale(&db, stale_after);
            match crate::pg::cut_off(STALE_PURGE_EVERY * 5, purge).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => {
                    tracing::info!(purged = n, "released idempotency keys of dead requests")
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "stale idempotency purge failed"),
                Err(_) => tracing::debug!("stale idempotency purge timed out"),
            }
        }
    });
}

/// How often each process deletes in-flight idempotency records past the stale window.
pub const STALE_PURGE_EVERY: Duration = Duration::from_secs(1);

/// Applies the migrations on a connection of its own, without the request timeouts.
pub async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    use sqlx::Connection;
    let url = settings
        .database_url
        .as_deref()
        .context("DATABASE_URL is not set")?;
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .context("could not connect to PostgreSQL (DATABASE_URL)")?;
    MIGRATOR
        .run(&mut conn)
        .await
        .context("could not apply database migrations")?;
    conn.close().await?;
    Ok(())
}
