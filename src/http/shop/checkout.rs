//! Checkout: the cart's "Checkout" button places a hold on its lines, the checkout page
//! shows it with a countdown, and confirming turns it into an order (once, however often
//! the form is sent); cancelling gives the stock back.

use std::time::{Duration, Instant};

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use uuid::Uuid;

use super::cart::{Cart, cart_conflict, max_quantity};
use crate::address::AddressInput;
use crate::checkout::{self, OrderError, OrderRequest, Outcome, Shopper, Want};
use crate::error::AppError;
use crate::holds::{self, Hold, HoldError};
use crate::http::csrf::{self, TokenForm};
use crate::http::middleware::answer_by;
use crate::http::paths::{IdPath, Names};
use crate::http::{AppState, Chrome, detached, html, see_other};
use crate::idempotency::{IdempotencyKey, Scope};
use crate::orders::Shortage;
use crate::payments::flow::PayError;

/// `/checkout` itself is the cart's "Checkout" button; a GET just goes to the cart.
pub async fn get_checkout() -> HttpResponse {
    see_other("/cart")
}

#[derive(Deserialize)]
pub struct StartCheckoutForm {
    #[serde(default)]
    csrf: String,
    key: String,
    lines: String,
}

/// Starts checkout: places a hold on the cart's lines, so the stock is the shopper's while
/// they fill in the form. Pressing the button twice places one hold.
#[tracing::instrument(skip_all)]
pub async fn post_checkout(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<StartCheckoutForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
    crate::http::limits::limit_placement(&req, &state, None).await?;
    let key = IdempotencyKey::parse(&form.key).map_err(|_| {
        AppError::BadRequest("This checkout form is damaged; please start checkout again.".into())
    })?;
    let key = IdempotencyKey::scoped(&super::browser(&req), &key);
    let cart = Cart::decode(&form.lines);
    if cart.lines.is_empty() {
        return Err(AppError::Unprocessable(
            "This checkout form has no products in it; please start checkout again.".into(),
        ));
    }
    let lines = cart
        .lines
        .iter()
        .map(|(s, n)| (s.clone(), i64::from(*n)))
        .collect();
    // The browser by its CSRF cookie (checked above), and its address.
    let shopper = Shopper::default()
        .browser(&form.csrf)
        .address(crate::http::client_addr(&req, &state.settings));
    let request =
        OrderRequest::new(lines, None, None, None, max_quantity(&state))?.placed_by(shopper);
    // A product in a drop: only with this browser's pass (without one, to its queue), or
    // when this form's key already has a record (a second press is answered from it).
    let skus = request.skus();
    let identity = super::browser(&req);
    let allowed = crate::http::gate::may_place(
        &state,
        &skus,
        Ok(&identity),
        |id| super::drop::browser_pass(&req, id),
        (Scope::Page, &key),
    )
    .await;
    match allowed {
        Ok(()) => {}
        Err(crate::drops::registry::RequireError::NeedsPass(n)) => {
            return Ok(see_other(&n.queue_path));
        }
        Err(crate::drops::registry::RequireError::Database(e)) => return Err(e.into()),
    }

    // A second press of the same button waits for the first and goes where it went, for
    // as long as this request may take; a first press that died is taken over once its
    // record goes stale.
    let answer_by = answer_by(&req, state.settings.request_budget);
    let shared = state.clone().into_inner();
    let placement = detached(crate::checkout::work_limit(&state.settings), async move {
        let mut pause = Duration::from_millis(20);
        loop {
            let deps = shared.order_deps(answer_by);
            match checkout::place(deps, Want::Hold, Scope::Page, &key, &request).await {
                Err(OrderError::InFlight) if Instant::now() + pause < answer_by => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                other => return other,
            }
        }
    })
    .await?;
    let placement = match placement {
        // Over a product's limit per customer: back on the cart, saying so.
        Err(OrderError::OverLimit(message)) => {
            return cart_conflict(&req, &state, message, Vec::new()).await;
        }
        other => other?,
    };
    match placement {
        Outcome::Made { made, .. } => Ok(see_other(&format!("/checkout/{}", made.id()))),
        Outcome::Insufficient { shortages, .. } => {
            let message = "Some products are no longer available in the quantity you chose.";
            cart_conflict(&req, &state, message.into(), shortages).await
        }
    }
}

#[derive(Template)]
#[template(path = "shop/checkout.html")]
struct CheckoutPage {
    chrome: Chrome,
    hold: Hold,
    name: String,
    email: String,
    /// Where to ship, as typed (the name above is the recipient's).
    ship: ShipFields,
    /// What went wrong with the checkout as a whole, shown above it.
    error: Option<String>,
    shortages: Vec<Shortage>,
    /// A field the shopper must correct (`name`, `email`, or an address field: `line1`,
    /// `line2`, `city`, `postal_code`, `country`) and why, shown beside it.
    wrong: Option<(&'static str, String)>,
    /// The card form, when the shop takes payments.
    payment: Option<CardForm>,
}

/// What the checkout page's card form needs: Stripe.js, and the key it is given.
struct CardForm {
    js_url: String,
    publishable_key: String,
}

impl CardForm {
    fn of(state: &AppState) -> Option<Self> {
        state.payments.as_ref().map(|p| Self {
            js_url: p.js_url.clone(),
            publishable_key: p.publishable_key.clone(),
        })
    }
}

/// The checkout page: with the card form, and a policy that lets Stripe.js in, when the
/// shop takes payments.
fn checkout_page(
    state: &AppState,
    status: StatusCode,
    page: &CheckoutPage,
) -> Result<HttpResponse, AppError> {
    let mut res = html(status, page)?;
    if let Some(payments) = &state.payments
        && !page.hold.state.is_released()
    {
        let origin = payments.script_origin();
        let policy = format!(
            "{}; script-src 'self' {origin}; connect-src 'self' {origin}; frame-src {origin}",
            crate::http::middleware::CSP
        );
        if let Ok(value) = header::HeaderValue::from_str(&policy) {
            res.headers_mut()
                .insert(header::CONTENT_SECURITY_POLICY, value);
        }
    }
    Ok(res)
}

/// The address fields of the checkout form, as typed.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ShipFields {
    #[serde(default)]
    line1: String,
    #[serde(default)]
    line2: String,
    #[serde(default)]
    city: String,
    #[serde(default)]
    postal_code: String,
    #[serde(default)]
    country: String,
}

impl ShipFields {
    /// The address to `name`, as typed.
    fn input(&self, name: &str) -> AddressInput {
        AddressInput {
            name: Some(name.to_string()),
            line1: Some(self.line1.clone()),
            line2: Some(self.line2.clone()),
            city: Some(self.city.clone()),
            postal_code: Some(self.postal_code.clone()),
            country: Some(self.country.clone()),
        }
    }

    /// Every country, to choose from.
    fn countries(&self) -> &'static [(&'static str, &'static str)] {
        &crate::address::countries::COUNTRIES
    }
}

impl CheckoutPage {
    /// A product of this checkout by its name (its SKU, if the hold does not have it).
    fn name_of(&self, sku: &str) -> String {
        self.hold
            .lines
            .iter()
            .find(|l| l.sku.as_str() == sku)
            .map_or_else(|| sku.to_string(), |l| l.display_name())
    }

    /// Why `field` was refused, if it was.
    fn wrong(&self, field: &str) -> Option<&str> {
        self.wrong
            .as_ref()
            .filter(|(wrong, _)| *wrong == field)
            .map(|(_, why)| why.as_str())
    }
}

/// A checkout's address: `/checkout/{id}`, the id of its hold.
pub struct Checkout;

impl Names for Checkout {
    type Id = uuid::Uuid;

    fn missing(_: &str) -> AppError {
        AppError::not_found("We have no checkout with this number.")
    }
}

async fn find_hold(state: &AppState, id: Uuid) -> Result<Hold, AppError> {
    holds::db::find_hold(&state.db, id)
        .await?
        .ok_or_else(|| AppError::not_found("We have no checkout with this number."))
}

pub async fn get_checkout_hold(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<Checkout>,
) -> Result<HttpResponse, AppError> {
    let id = address.id()?;
    let hold = find_hold(&state, id).await?;
    if let Some(order_id) = hold.order_id {
        return Ok(see_other(&format!("/orders/{order_id}")));
    }
    let page = CheckoutPage {
        chrome: Chrome::new(&req),
        name: hold.customer_name.clone().unwrap_or_default(),
        email: hold.email.clone().unwrap_or_default(),
        ship: ShipFields::default(),
        hold,
        error: None,
        shortages: Vec::new(),
        wrong: None,
        payment: CardForm::of(&state),
    };
    checkout_page(&state, StatusCode::OK, &page)
}

#[derive(Deserialize)]
pub struct ConfirmForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    email: String,
    #[serde(flatten)]
    ship: ShipFields,
}

/// Places the order: the hold becomes an order once, however often this is sent.
#[tracing::instrument(skip_all)]
pub async fn post_checkout_confirm(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<Checkout>,
    form: web::Form<ConfirmForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
    let id = address.id()?;
    let again = |status, error: &str, shortages| {
        let problem = Problem::Checkout(error.to_string(), shortages);
        checkout_again(&req, &state, id, &form, status, problem)
    };
    // A field to correct: the page again, with the reason beside it.
    let wrong = |field, why: &str| {
        let problem = Problem::Field(field, why.to_string());
        checkout_again(
            &req,
            &state,
            id,
            &form,
            StatusCode::UNPROCESSABLE_ENTITY,
            problem,
        )
    };
    if form.name.trim().is_empty() {
        return wrong("name", "Please tell us your name.").await;
    }
    if form.email.trim().is_empty() {
        let why = "Please give an email address, so we can reach you about your order.";
        return wrong("email", why).await;
    }
    // A hold placed before its product's drop bound it: only with this browser's pass.
    let allowed = crate::http::gate::may_confirm(&state, id, &super::browser(&req), |d| {
        super::drop::browser_pass(&req, d)
    })
    .await;
    match allowed {
        Ok(()) => {}
        Err(crate::drops::registry::RequireError::NeedsPass(n)) => {
            return Ok(see_other(&n.queue_path));
        }
        Err(crate::drops::registry::RequireError::Database(e)) => return Err(e.into()),
    }
    if let Err(e) = OrderRequest::check_contact(Some(&form.email), Some(&form.name), None) {
        let field = match OrderRequest::check_contact(Some(&form.email), None, None) {
            Err(_) => "email",
            Ok(_) => "name",
        };
        return wrong(field, &crate::error::sentence(&e.0)).await;
    }
    let address = form.ship.input(&form.name);
    if let Err(e) = address.parse() {
        let why = match e.message.as_str() {
            "is required" if e.field == "country" => "Please choose the country to ship to.".into(),
            "is required" => format!("Please fill in {}.", ship_label(e.field)),
            _ => crate::error::sentence(&format!("{} {}", ship_label(e.field), e.message)),
        };
        return wrong(e.field, &why).await;
    }
    // Each part was checked above, so this refuses nothing.
    let contact = OrderRequest::check_contact(Some(&form.email), Some(&form.name), Some(&address))?;
    let answer_by = answer_by(&req, state.settings.request_budget);
    let shared = state.clone().into_inner();
    let confirmed = detached(state.confirm_limit(), async move {
        let asked = crate::holds::Confirmation {
            hold: id,
            owner: None,
            contact: contact.contact(),
            answer_by,
        };
        shared.confirm_hold(asked).await
    })
    .await?;
    match confirmed {
        Ok(confirmed) => Ok(HttpResponse::SeeOther()
            .insert_header((header::LOCATION, format!("/orders/{}", confirmed.order.id)))
            .cookie(Cart::default().cookie(&req))
            .finish()),
        Err(PayError::Hold(HoldError::Insufficient(shortages))) => {
            let mut message =
                "Your reservation expired, and there is no longer enough stock to place this \
                 order."
                    .to_string();
            if let Some(payments) = &state.payments {
                message.push_str(payments.not_charged(id).await?);
            }
            again(StatusCode::CONFLICT, &message, shortages).await
        }
        Err(PayError::Hold(HoldError::OverLimit(message))) => {
            again(StatusCode::CONFLICT, &message, vec![]).await
        }
        Err(PayError::NotFound) => {
            Err(AppError::not_found("We have no checkout with this number."))
        }
        Err(PayError::Hold(HoldError::Released)) => {
            let message = "You cancelled this checkout. Start again from your cart.";
            again(StatusCode::CONFLICT, message, vec![]).await
        }
        Err(PayError::NotPaid(_)) => {
            let message = "Please pay for your order with a card first.";
            again(StatusCode::PAYMENT_REQUIRED, message, vec![]).await
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize)]
pub struct PayForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    payment_method: String,
}

/// Pays for the checkout's hold with the card Stripe.js tokenized in the browser (the
/// checkout page's script calls this, then sends the order form): JSON, as the API's
/// payment answers.
#[tracing::instrument(skip_all)]
pub async fn post_checkout_pay(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<Checkout>,
    form: web::Form<PayForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
    let id = address.id()?;
    let payments = state.payments.clone().ok_or_else(|| {
        AppError::not_found("This shop does not take card payments: place the order as it is.")
    })?;
    let method = crate::payments::flow::check_method(&form.payment_method)
        .map_err(AppError::Unprocessable)?
        .to_string();
    let hold = find_hold(&state, id).await?;
    let payment = detached(payments.work_limit(), async move {
        payments.pay(&hold, &method).await
    })
    .await??;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "status": payment.status,
        "client_secret": payment.client_secret,
    })))
}

/// How the checkout form labels address field `field`, for its messages.
fn ship_label(field: &str) -> &'static str {
    match field {
        "name" => "your name",
        "line1" => "the street and number",
        "line2" => "the second address line",
        "city" => "the town or city",
        "postal_code" => "the postal code",
        _ => "the country",
    }
}

/// Why a checkout was shown again.
enum Problem {
    /// The order could not be placed: why, and the products short.
    Checkout(String, Vec<Shortage>),
    /// A field (`name`, `email`) to correct, and why.
    Field(&'static str, String),
}

/// The checkout page again, with what went wrong.
async fn checkout_again(
    req: &HttpRequest,
    state: &AppState,
    id: Uuid,
    form: &ConfirmForm,
    status: StatusCode,
    problem: Problem,
) -> Result<HttpResponse, AppError> {
    let (error, shortages, wrong) = match problem {
        Problem::Checkout(error, shortages) => (Some(error), shortages, None),
        Problem::Field(field, why) => (None, Vec::new(), Some((field, why))),
    };
    let page = CheckoutPage {
        chrome: Chrome::new(req),
        hold: find_hold(state, id).await?,
        name: form.name.clone(),
        email: form.email.clone(),
        ship: form.ship.clone(),
        error,
        shortages,
        wrong,
        payment: CardForm::of(state),
    };
    checkout_page(state, status, &page)
}

/// Leaves checkout: the held stock goes back on sale at once.
pub async fn post_checkout_cancel(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<Checkout>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
    let id = address.id()?;
    let shared = state.into_inner();
    let released = detached(crate::checkout::work_limit(&shared.settings), async move {
        holds::release(&shared.db, Some(&shared.redis), id, "shopper").await
    })
    .await?;
    match released {
        Ok(_) => Ok(see_other("/cart")),
        Err(HoldError::AlreadyConfirmed(order_id)) => Ok(see_other(&format!("/orders/{order_id}"))),
        Err(e) => Err(e.into()),
    }
}
