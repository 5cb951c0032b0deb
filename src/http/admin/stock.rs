//! Stock on a product's page: "add N units" (a delta), "set the count to N" (compare-and-set
//! against the count the form showed), each applied once per form, and the ledger with its
//! "verify" check.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use sqlx::PgConnection;

use super::once::{FormOutcome, InTransaction, apply_form, form_key};
use super::products::{ProductPage, load_product};
use super::{PAGE, Page, page_chrome};
use crate::admin::Admin;
use crate::catalog::Sku;
use crate::catalog::manage::ProductRow;
use crate::error::AppError;
use crate::http::paths::SkuPath;
use crate::http::{AppState, Chrome, csrf, html};
use crate::idempotency::StoredResponse;
use crate::inventory::change::{self, Change, Refused};
use crate::inventory::ledger::{self, Movement};
use crate::inventory::reports;
use crate::text::whole_number;

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
    let (_, product) = load_product(state, sku.clone()).await?;
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
    address: SkuPath,
    form: web::Form<StockForm>,
) -> Result<HttpResponse, AppError> {
    let checked = Change::restock(whole_number(&form.units), "Units to add");
    apply(req, admin, state, address, form, checked).await
}

/// "Set the count to N": compare-and-set against the count the form was rendered with.
/// Applied once per form; when stock moved under the form, nothing is applied and the
/// form comes back (409) with the new figure.
pub async fn post_adjust(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    address: SkuPath,
    form: web::Form<StockForm>,
) -> Result<HttpResponse, AppError> {
    let checked = Change::adjust(
        (whole_number(&form.expected), "The count the form showed"),
        (whole_number(&form.on_hand), "The new count"),
    );
    apply(req, admin, state, address, form, checked).await
}

/// Applies a stock form's change once per form: the product's page with a notice, or
/// again with the refusal (422 for a value, 409 when stock moved under the form).
async fn apply(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    address: SkuPath,
    form: web::Form<StockForm>,
    checked: Result<Change, change::Invalid>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let (sku, _) = load_product(&state, address.sku()?).await?;
    let checked = checked.and_then(|c| Ok((c, change::reason(&form.reason)?)));
    let (change, reason) = match checked {
        Ok(v) => v,
        Err(e) => return invalid(&req, &admin, &state, &sku, e.into()).await,
    };
    let fingerprint = change.fingerprint(&sku, &reason);
    let (changed, actor) = (sku.clone(), admin.username.clone());
    let answer = apply_form(
        &state,
        &admin,
        &key,
        &fingerprint,
        InTransaction(
            async move |tx: &mut PgConnection| -> Result<StoredResponse, NotSet> {
                let applied = change.apply(tx, &changed, &reason, &actor).await;
                let on_hand = applied.map_err(AppError::from)?.map_err(NotSet::Refused)?;
                let notice = match change {
                    Change::Restock { units } => {
                        format!("Added {units} units; {on_hand} on hand now.")
                    }
                    Change::Adjust { new, .. } => format!("On hand set to {new}."),
                };
                let page = format!("/admin/products/{changed}");
                Ok(FormOutcome { page, notice }.stored())
            },
        ),
    )
    .await?;
    let refusal = match answer {
        Ok(answer) => {
            state.stock_changed(&sku).await;
            return Ok(answer);
        }
        Err(NotSet::Failed(e)) => return Err(e),
        Err(NotSet::Refused(refusal)) => refusal,
    };
    let (status, notice, moved) = match (refusal, change) {
        (Refused::TooMuch { .. }, _) => {
            let status = StatusCode::UNPROCESSABLE_ENTITY;
            (status, refusal.sentence(change), None)
        }
        // In the form's own words: the page shows the new count beside the field.
        (Refused::Moved { on_hand }, Change::Adjust { expected, .. }) => (
            StatusCode::CONFLICT,
            format!(
                "Stock moved while you were counting: the form showed {expected} on hand, \
                 now there are {on_hand}. Nothing was changed; check the new figure and \
                 submit again."
            ),
            Some(on_hand),
        ),
        _ => (StatusCode::CONFLICT, refusal.sentence(change), None),
    };
    refused(&req, &admin, &state, &sku, status, notice, moved).await
}

/// Why a form's change was not made: refused (nothing changed, nothing stored under the
/// key, so the same form may be sent again), or an error.
enum NotSet {
    Refused(Refused),
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
    address: SkuPath,
    query: web::Query<LedgerQuery>,
) -> Result<HttpResponse, AppError> {
    let sku = address.sku()?;
    let (sku, product) = load_product(&state, sku).await?;
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
