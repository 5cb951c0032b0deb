//! `/healthz`: the process is alive. `/readyz`: PostgreSQL and Redis answer; 503 naming
//! whichever does not.

use std::time::Duration;

use actix_web::{HttpResponse, web};
use serde::Serialize;

use super::AppState;

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
        match tokio::time::timeout(CHECK_TIMEOUT, sqlx::query("select 1").execute(&state.db)).await
        {
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

/// Prometheus text format.
pub async fn get_metrics(state: web::Data<AppState>) -> HttpResponse {
    state
        .metrics
        .degraded
        .set(i64::from(state.redis.is_degraded()));
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
