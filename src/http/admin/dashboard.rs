//! The dashboard: stock, today's orders and revenue, holds, low and sold-out products,
//! recent orders, and the health of Redis, the events and the replica. Its JSON twin (polled
//! for live updates) is [`super::api::get_dashboard_json`].

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Serialize;
use uuid::Uuid;

use super::page_chrome;
use crate::admin::Admin;
use crate::catalog::{LOW_STOCK, format_cents};
use crate::error::AppError;
use crate::holds;
use crate::http::{AppState, Chrome, html};
use crate::inventory::reports::{self, StockRow};
use crate::orders::{self, db::OrderFilter, db::OrderSummary};

/// The numbers on the dashboard (also its JSON, polled for live updates).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Dashboard {
    pub on_hand: i64,
    pub reserved: i64,
    pub available: i64,
    pub orders_today: i64,
    pub revenue_today_cents: i64,
    pub revenue_today: String,
    pub active_holds: i64,
    pub low_stock: Vec<StockRow>,
    pub sold_out: Vec<StockRow>,
    pub recent_orders: Vec<RecentOrder>,
    pub strategy: String,
    /// `up`, or `degraded` while Redis is unreachable.
    pub lease_layer: String,
    /// Events out: deliveries pending, sent, failed, and the oldest pending's age.
    pub events: crate::events::db::Stats,
    /// How far the read replica is behind ("no replica", "down", or its lag).
    pub replica: String,
    /// The last `stockade check` (quick or full) recorded, if any.
    pub last_check: Option<crate::verdicts::LastCheck>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RecentOrder {
    pub id: Uuid,
    pub reference: String,
    pub status: String,
    pub total: String,
    pub units: i64,
    pub at: String,
}

/// Products listed under "low" and under "sold out".
const LISTED: i64 = 12;

pub(super) async fn dashboard(state: &AppState) -> Result<Dashboard, AppError> {
    let (stock, today, active_holds, low_stock, sold_out, recent, events, last_check) = state
        .read(async |db| {
            Ok((
                reports::totals(db).await?,
                orders::reports::today(db).await?,
                holds::reports::active_count(db).await?,
                reports::available_between(db, 1..=LOW_STOCK, LISTED).await?,
                reports::available_between(db, i32::MIN..=0, LISTED).await?,
                orders::reports::list(db, &OrderFilter::default(), 8, 0)
                    .await?
                    .0,
                crate::events::db::stats(db).await?,
                crate::verdicts::last(db).await?,
            ))
        })
        .await?;
    let redis_up = tokio::time::timeout(Duration::from_secs(1), state.redis.ping())
        .await
        .is_ok_and(|r| r.is_ok());
    Ok(Dashboard {
        on_hand: stock.on_hand,
        reserved: stock.reserved,
        available: stock.on_hand - stock.reserved,
        orders_today: today.orders,
        revenue_today_cents: today.revenue_cents,
        revenue_today: format_cents(today.revenue_cents),
        active_holds,
        low_stock,
        sold_out,
        recent_orders: recent.into_iter().map(recent_order).collect(),
        strategy: state.settings.order_strategy.to_string(),
        lease_layer: if redis_up { "up" } else { "degraded" }.into(),
        events,
        // After the reads: one that found the replica gone has taken it out.
        replica: match &state.replica {
            None => "none".into(),
            Some(r) => match r.lag() {
                Some((ms, bytes)) => format!("{ms} ms behind ({bytes} bytes of WAL)"),
                None => "down; reads on the primary".into(),
            },
        },
        last_check,
    })
}

fn recent_order(o: OrderSummary) -> RecentOrder {
    RecentOrder {
        reference: o.reference(),
        id: o.id,
        status: o.status.to_string(),
        total: format_cents(o.total_cents),
        units: o.units,
        at: crate::clock::show(o.created_at, "%H:%M:%S"),
    }
}

#[derive(Template)]
#[template(path = "admin/dashboard.html")]
struct DashboardPage {
    chrome: Chrome,
    d: Dashboard,
}

pub async fn get_dashboard(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AppError> {
    let page = DashboardPage {
        chrome: page_chrome(&req, &admin),
        d: dashboard(&state).await?,
    };
    html(StatusCode::OK, &page)
}
