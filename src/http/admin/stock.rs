//! Stock on a product's page: "add N units" (a delta), "set the count to N" (compare-and-set
//! against the count the form showed), each applied once per form, and the ledger with its
//! "verify" check.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use sqlx::PgConnection;

use super::once::{FormOutcome, apply_form, form_key};
use super::products::{ProductPage, load_product};
use super::{PAGE, Page, page_chrome};
use crate::admin::Admin;
use crate::catalog::Sku;
use crate::catalog::manage::ProductRow;
use crate::error::AppError;
use crate::http::{AppState, Chrome, csrf, html};
use crate::idempotency::StoredResponse;
use crate::inventory::db::{self as stock, Adjusted};
use crate::inventory::ledger::{self, Movement};
use crate::inventory::reports;

#[derive(Deserialize)]
pub struct StockForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    units: String,
    #[serde(default)]
    expected: String,
    #[serde(default)]
    on_hand: String,
    #[serde(default)]
    reason: String,
}

pub(super) fn reason_of(raw: &str) -> Result<String, AppError> {
    crate::text::single_line("The reason", raw)?;
    let reason = raw.trim();
    if reason.is_empty() {
        return Err(AppError::Unprocessable(
            "Please give a reason for the change (it goes into the ledger).".into(),
        ));
    }
    if reason.chars().count() > 500 {
        return Err(AppError::Unprocessable(
            "A reason is at most 500 characters.".into(),
        ));
    }
    Ok(reason.to_string())
}

/// A restock that would take a product past what its count can hold.
pub(super) fn too_much(units: i32) -> AppError {
    AppError::Unprocessable(format!(
        "Adding {units} units would take this product past the most it can have on hand \
         ({}); nothing was changed.",
        stock::MAX_ON_HAND
    ))
}

fn whole(raw: &str, what: &str, min: i32, max: i32) -> Result<i32, AppError> {
    raw.trim()
        .parse::<i32>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            AppError::Unprocessable(format!(
                "{what} must be a whole number from {min} to {max}."
            ))
        })
}

/// The product's page again, saying why a stock form changed nothing: 422 for a value it
/// refused, 409 when stock moved under it (`moved`: the count now).
async fn refused(
    req: &HttpRequest,
    admin: &Admin,
    state: &AppState,
    sku: &Sku,
    status: StatusCode,
    message: String,
    moved: Option<i32>,
) -> Result<HttpResponse, AppError> {
    let (_, product) = load_product(state, sku.as_str()).await?;
    let page = ProductPage {
        moved,
        ..ProductPage::new(page_chrome(req, admin), product).saying(message, true)
    };
    html(status, &page)
}

/// The product's page again, 422, saying which value of a stock form was refused.
async fn invalid(
    req: &HttpRequest,
    admin: &Admin,
    state: &AppState,
    sku: &Sku,
    error: AppError,
) -> Result<HttpResponse, AppError> {
    let message = error.public_message();
    refused(
        req,
        admin,
        state,
        sku,
        StatusCode::UNPROCESSABLE_ENTITY,
        message,
        None,
    )
    .await
}

/// "Add N units": a delta, which never conflicts with sales. Applied once per form.
pub async fn post_restock(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<StockForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let (sku, _) = load_product(&state, &path).await?;
    let checked = whole(&form.units, "Units to add", 1, 10_000_000)
        .and_then(|units| Ok((units, reason_of(&form.reason)?)));
    let (units, reason) = match checked {
        Ok(v) => v,
        Err(e) => return invalid(&req, &admin, &state, &sku, e).await,
    };
    let fingerprint = ("restock", sku.as_str(), units, reason.clone());
    let (restocked, actor) = (sku.clone(), admin.username.clone());
    let answer = apply_form(
        &state,
        &admin,
        &key,
        &fingerprint,
        async move |tx: &mut PgConnection| -> Result<StoredResponse, AppError> {
            let on_hand = stock::restock(tx, &restocked, units, &reason, &actor)
                .await?
                .ok_or_else(|| too_much(units))?;
            let outcome = FormOutcome {
                page: format!("/admin/products/{restocked}"),
                notice: format!("Added {units} units; {on_hand} on hand now."),
            };
            Ok(outcome.stored())
        },
    )
    .await??;
    state.stock_changed(&sku).await;
    Ok(answer)
}

/// "Set the count to N": compare-and-set against the count the form was rendered with.
/// Applied once per form; when stock moved under the form, nothing is applied and the
/// form comes back (409) with the new figure.
pub async fn post_adjust(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<StockForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let (sku, _) = load_product(&state, &path).await?;
    let checked = (|| {
        let expected = whole(&form.expected, "The count the form showed", 0, i32::MAX)?;
        let new = whole(&form.on_hand, "The new count", 0, 10_000_000)?;
        Ok::<_, AppError>((expected, new, reason_of(&form.reason)?))
    })();
    let (expected, new, reason) = match checked {
        Ok(v) => v,
        Err(e) => return invalid(&req, &admin, &state, &sku, e).await,
    };
    let fingerprint = ("adjust", sku.as_str(), expected, new, reason.clone());
    let (adjusted, actor) = (sku.clone(), admin.username.clone());
    let answer = apply_form(
        &state,
        &admin,
        &key,
        &fingerprint,
        async move |tx: &mut PgConnection| -> Result<StoredResponse, NotSet> {
            let outcome = stock::adjust(tx, &adjusted, expected, new, &reason, &actor)
                .await
                .map_err(AppError::from)?;
            match outcome {
                Adjusted::Done => {
                    let outcome = FormOutcome {
                        page: format!("/admin/products/{adjusted}"),
                        notice: format!("On hand set to {new}."),
                    };
                    Ok(outcome.stored())
                }
                Adjusted::Moved { on_hand } => Err(NotSet::Moved { on_hand }),
                Adjusted::BelowReserved { reserved } => Err(NotSet::BelowReserved { reserved }),
            }
        },
    )
    .await?;
    let (notice, moved) = match answer {
        Ok(answer) => {
            state.stock_changed(&sku).await;
            return Ok(answer);
        }
        Err(NotSet::Failed(e)) => return Err(e),
        Err(NotSet::Moved { on_hand }) => (
            format!(
                "Stock moved while you were counting: the form showed {expected} on hand, \
                 now there are {on_hand}. Nothing was changed; check the new figure and \
                 submit again."
            ),
            Some(on_hand),
        ),
        Err(NotSet::BelowReserved { reserved }) => (
            format!("{reserved} units are held in checkouts; the count cannot go below that."),
            None,
        ),
    };
    refused(
        &req,
        &admin,
        &state,
        &sku,
        StatusCode::CONFLICT,
        notice,
        moved,
    )
    .await
}

/// Why a count was not set: stock moved under the form (nothing changed, nothing stored
/// under the key, so the same form may be sent again), or an error.
enum NotSet {
    Moved { on_hand: i32 },
    BelowReserved { reserved: i32 },
    Failed(AppError),
}

impl From<AppError> for NotSet {
    fn from(e: AppError) -> Self {
        Self::Failed(e)
    }
}

#[derive(Template)]
#[template(path = "admin/ledger.html")]
struct LedgerPage {
    chrome: Chrome,
    product: ProductRow,
    movements: Vec<Movement>,
    page: i64,
    pages: i64,
    /// More rows than were counted: `pages` is a lower bound.
    more: bool,
    /// After "verify": the ledger's on hand and reserved, whether they match, and the
    /// stock record's on hand and reserved (read in the same snapshot).
    verified: Option<(i64, i64, bool, i32, i32)>,
}

#[derive(Deserialize)]
pub struct LedgerQuery {
    page: Option<i64>,
    verify: Option<String>,
}

pub async fn get_ledger(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    query: web::Query<LedgerQuery>,
) -> Result<HttpResponse, AppError> {
    let (sku, product) = load_product(&state, &path).await?;
    // Ledger rows are short: twice as many a page.
    let page = Page::of(query.page, PAGE * 2);
    let movements = ledger::page(&state.db, &sku, page.size, page.offset()).await?;
    let (counted, more) = ledger::len(&state.db, &sku).await?;
    let verified = match query.verify {
        Some(_) => {
            let check = reports::check_ledger(&state.db, &sku)
                .await?
                .ok_or_else(|| AppError::not_found(format!("No product with SKU {sku}.")))?;
            Some((
                check.ledger_on_hand,
                check.ledger_reserved,
                check.matches(),
                check.on_hand,
                check.reserved,
            ))
        }
        None => None,
    };
    let page = LedgerPage {
        chrome: page_chrome(&req, &admin),
        product,
        movements,
        page: page.number,
        pages: page.count(counted),
        more,
        verified,
    };
    html(StatusCode::OK, &page)
}
