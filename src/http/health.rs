//! `/healthz`: the process is alive. `/readyz`: PostgreSQL and Redis answer; 503 naming
//! whichever does not.

use std::time::Duration;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;

use super::AppState;
use crate::error::AppError;

pub async fn get_healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body("ok\n")
}

#[derive(Serialize)]
struct Readiness {
    status: &'static str,
    postgres: String,
    redis: String,
    /// `leases` normally; `degraded` while orders run on the database guard alone.
    order_guard: &'static str,
}

const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn get_readyz(state: web::Data<AppState>) -> HttpResponse {
    let postgres = async {
        match crate::pg::cut_off(CHECK_TIMEOUT, sqlx::query("select 1").execute(&state.db)).await {
            Ok(Ok(_)) => "ok".to_string(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "readiness: PostgreSQL unreachable");
                "unreachable".to_string()
            }
            Err(_) => "unreachable: no answer within 2 s".to_string(),
        }
    };
    let redis = async {
        match tokio::time::timeout(CHECK_TIMEOUT, state.redis.ping()).await {
            Ok(Ok(())) => "ok".to_string(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "readiness: Redis unreachable");
                "unreachable".to_string()
            }
            Err(_) => "unreachable: no answer within 2 s".to_string(),
        }
    };
    let (postgres, redis) = tokio::join!(postgres, redis);
    let ready = postgres == "ok" && redis == "ok";
    // Degraded while Redis does not answer, and until the lease layer's breaker has
    // seen it answer again.
    let degraded = redis != "ok" || state.redis.is_degraded();
    state.metrics.degraded.set(i64::from(degraded));
    let body = Readiness {
        status: if ready { "ready" } else { "unavailable" },
        order_guard: if degraded { "degraded" } else { "leases" },
        postgres,
        redis,
    };
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// Prometheus text format. Served on the metrics listener (`STOCKADE_METRICS_LISTEN`) to
/// anyone who reaches it, and on the public port only with `Authorization: Bearer` and
/// `STOCKADE_METRICS_TOKEN`; otherwise 404, as if there were nothing here.
pub async fn get_metrics(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AppError> {
    let allowed = state.on_metrics_listener(&req)
        || state
            .settings
            .metrics_token
            .as_deref()
            .is_some_and(|token| {
                let sent = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .unwrap_or_default();
                super::csrf::same(sent.trim(), token)
            });
    if !allowed {
        return Err(AppError::not_found(
            "There is nothing at this address. It may have moved, or the link is mistyped.",
        ));
    }
    state
        .metrics
        .degraded
        .set(i64::from(state.redis.is_degraded()));
    state
        .metrics
        .db_pool_connections
        .set(i64::from(state.db.size()));
    state.metrics.db_pool_idle.set(state.db.num_idle() as i64);
    let leaders = state.leaders.as_ref();
    state
        .metrics
        .db_leader_pool_connections
        .set(leaders.map_or(0, |p| i64::from(p.size())));
    state
        .metrics
        .db_leader_pool_idle
        .set(leaders.map_or(0, |p| p.num_idle() as i64));
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render()))
}
