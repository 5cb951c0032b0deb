//! The admin API's drops: list, schedule, read one live, and pause, resume or end one.

use actix_web::http::header;
use actix_web::{HttpResponse, web};
use uuid::Uuid;

use super::super::AdminWrite;
use super::super::drops::{AdminDrop, DropAction, DropForm, apply_change, drop_error};
use crate::admin::Admin;
use crate::drops::live::{Live, live};
use crate::error::AppError;
use crate::http::AppState;
use crate::http::contract::{AdminActionErrors, AdminCreateErrors, AdminReadErrors};
use crate::http::json::{Body, FromBody};
use crate::http::paths::{IdPath, Names};

/// A drop to schedule.
#[derive(utoipa::ToSchema)]
#[schema(example = json!({
    "sku": "KB-ALPINE-75", "opens_at": "+300", "prequeue_seconds": 300,
    "queueing": "lottery", "admit_per_minute": 120, "session_seconds": 600
}))]
#[expect(
    dead_code,
    reason = "the contract's shape; read as JSON into `DropForm`"
)]
pub struct NewDropBody {
    #[schema(value_type = crate::http::contract::inputs::SkuInput)]
    sku: String,
    /// RFC 3339, or `+SECONDS` from now; not in the past.
    #[schema(
        pattern = r"^(\+[0-9]{1,9}|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2}))$"
    )]
    opens_at: String,
    /// Joining opens this long before the opening (0 to 604800; default 0).
    #[schema(minimum = 0, maximum = 604800)]
    prequeue_seconds: Option<i64>,
    /// `fifo`, or `lottery` (the pre-queue in a random order drawn once).
    #[schema(value_type = crate::drops::Queueing)]
    queueing: String,
    #[schema(minimum = 1, maximum = 1000000)]
    admit_per_minute: i64,
    /// Most shoppers admitted at once (none or 0: no limit).
    #[schema(minimum = 0, maximum = 1000000)]
    max_active: Option<i64>,
    /// How long an admission lasts (30 to 86400; default 600).
    #[schema(minimum = 30, maximum = 86400)]
    session_seconds: Option<i64>,
}

async fn find_id(state: &AppState, id: Uuid) -> Result<crate::drops::Drop, AppError> {
    crate::drops::db::get(&state.db, id)
        .await?
        .ok_or_else(|| AdminDrop::missing(""))
}

fn no_store(mut res: actix_web::HttpResponseBuilder, body: &impl serde::Serialize) -> HttpResponse {
    res.insert_header((header::CACHE_CONTROL, "no-store"))
        .json(body)
}

/// The latest drops (up to 50), newest first, with their live figures.
#[utoipa::path(
    get,
    path = "/api/v1/admin/drops",
    tag = "admin",
    security(("admin_session" = [])),
    responses(
        (status = 200, description = "The drops.", body = Vec<Live>),
        AdminReadErrors,
    )
)]
pub async fn get_api_drops(
    _admin: Admin,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AppError> {
    let mut all = Vec::new();
    for drop in crate::drops::db::recent(&state.db, 50).await? {
        all.push(live(&state.db, &state.redis, &drop).await?);
    }
    Ok(no_store(HttpResponse::Ok(), &all))
}

impl FromBody for DropForm {
    fn from_body(value: serde_json::Value) -> Result<Self, crate::error::AppError> {
        let shape = r#"{"sku": …, "opens_at": "<RFC 3339 or +SECONDS>", "queueing": "fifo" or "lottery", "admit_per_minute": N, …}"#;
        crate::http::json::shaped(value, shape)
    }
}

/// Schedules a drop. Its product needs a pass from the queue for every hold and order
/// from a few seconds after this answer until the drop ends.
#[utoipa::path(
    post,
    path = "/api/v1/admin/drops",
    tag = "admin",
    security(("admin_session" = [])),
    params(super::CsrfHeader),
    request_body = NewDropBody,
    responses(
        (status = 201, description = "The drop.", body = Live),
        (status = 409, response = crate::http::contract::Conflict),
        AdminCreateErrors,
    )
)]
pub async fn post_api_drops(
    AdminWrite(admin): AdminWrite,
    state: web::Data<AppState>,
    Body(form): Body<DropForm>,
) -> Result<HttpResponse, AppError> {
    let new = form.parse()?;
    let drop = crate::drops::db::create(&state.db, &new)
        .await
        .map_err(drop_error)?;
    state.drops.reload(&state.db).await?;
    tracing::info!(admin = %admin.username, drop = %drop.id, sku = %drop.sku, "drop scheduled");
    let body = live(&state.db, &state.redis, &drop).await?;
    Ok(no_store(
        HttpResponse::Created()
            .insert_header((header::LOCATION, format!("/api/v1/admin/drops/{}", drop.id)))
            .take(),
        &body,
    ))
}

/// A drop with its live figures: waiting, admitted, active, sold, left, the admission
/// rate and the estimated time to sell out.
#[utoipa::path(
    get,
    path = "/api/v1/admin/drops/{id}",
    tag = "admin",
    security(("admin_session" = [])),
    params(("id" = String, Path, description = "The drop's id.")),
    responses(
        (status = 200, description = "The drop.", body = Live),
        (status = 404, response = crate::http::contract::NotFound),
        AdminReadErrors,
    )
)]
pub async fn get_api_drop(
    _admin: Admin,
    state: web::Data<AppState>,
    address: IdPath<AdminDrop>,
) -> Result<HttpResponse, AppError> {
    let id = address.id()?;
    let drop = find_id(&state, id).await?;
    Ok(no_store(
        HttpResponse::Ok(),
        &live(&state.db, &state.redis, &drop).await?,
    ))
}

/// Pauses (nobody is let in; passes given keep working), resumes, or ends a drop (the
/// queue closes, everyone waiting is told, and the product sells as usual again). Doing
/// what is done already changes nothing; an ended drop cannot be paused or resumed (409).
#[utoipa::path(
    post,
    path = "/api/v1/admin/drops/{id}/{action}",
    tag = "admin",
    security(("admin_session" = [])),
    params(
        ("id" = String, Path, description = "The drop's id."),
        ("action" = String, Path, description = "`pause`, `resume` or `end`.",
            pattern = "^(pause|resume|end)$"),
        super::CsrfHeader,
    ),
    responses(
        (status = 200, description = "The drop, after the change.", body = Live),
        (status = 409, response = crate::http::contract::Conflict),
        AdminActionErrors,
    )
)]
pub async fn post_api_drop_change(
    AdminWrite(admin): AdminWrite,
    state: web::Data<AppState>,
    address: IdPath<AdminDrop>,
    action: IdPath<DropAction>,
) -> Result<HttpResponse, AppError> {
    let change = action.id()?;
    let drop = find_id(&state, address.id()?).await?;
    apply_change(&state, drop.id, change, &admin.username).await?;
    let drop = find_id(&state, drop.id).await?;
    Ok(no_store(
        HttpResponse::Ok(),
        &live(&state.db, &state.redis, &drop).await?,
    ))
}
