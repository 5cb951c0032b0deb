//! Admin changes applied once per idempotency key, by [`idempotency::run`]: the stock
//! forms, the cancel and release forms and the stock API claim a key (in the admin's own
//! key space), run their change, and store its answer in the change's transaction. A form
//! answers 303 to the page that shows the result, and that page finds the result again by
//! `?done=<key>`; the API answers the stored JSON ([`super::api`]).
//! A change that commits on its own (a cancel, a release, a drop's change) is given as
//! [`Apart`], and no connection is held while it runs.

use std::time::Duration;

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

use crate::admin::Admin;
use crate::error::AppError;
use crate::http::{AppState, detached, see_other};
use crate::idempotency::{self, IdempotencyKey, Once, Request, RunError, Scope, StoredResponse};

/// How long a second press of a stock form (a double click, a refresh while the first is
/// still running) waits for the first to finish before it is answered 409.
const SECOND_PRESS_WAIT: Duration = Duration::from_secs(2);

/// An admin's own key space: `{admin id}:{key}`, so two admins never share a key. The key
/// was checked on its own (up to 255 characters, as the document says); the prefix does not
/// count against it, as an API client's does not (the fuzzer found 400s for keys the
/// document allows when it did).
pub(super) fn admin_key(admin: &Admin, key: &IdempotencyKey) -> Result<IdempotencyKey, AppError> {
    Ok(IdempotencyKey::scoped(&admin.id.to_string(), key))
}

/// A change applied under a key: one that runs in the key's own transaction
/// ([`InTransaction`], [`idempotency::run`]), or one that commits on its own ([`Apart`],
/// [`idempotency::run_apart`]: an order's cancel, a hold's release, a drop's schedule).
pub(super) trait Change<E> {
    async fn run(self, db: &PgPool, request: Request) -> Result<Result<Once, E>, RunError>;
}

/// A change given the key's transaction.
pub(super) struct InTransaction<F>(pub F);

/// A change that commits on its own; no connection is held for it while it runs.
pub(super) struct Apart<F>(pub F);

impl<E, F> Change<E> for InTransaction<F>
where
    F: AsyncFnOnce(&mut PgConnection) -> Result<StoredResponse, E>,
{
    async fn run(self, db: &PgPool, request: Request) -> Result<Result<Once, E>, RunError> {
        idempotency::run(db, request, self.0).await
    }
}

impl<E, F> Change<E> for Apart<F>
where
    F: AsyncFnOnce() -> Result<StoredResponse, E>,
{
    async fn run(self, db: &PgPool, request: Request) -> Result<Result<Once, E>, RunError> {
        idempotency::run_apart(db, request, self.0).await
    }
}

/// Runs `change` at most once per `key`, waiting up to `wait` for a twin request still
/// running. It runs as its own task, so a client that goes away leaves the key completed
/// or released, never stuck in flight.
///
/// The outer error is the machinery's (the database), the inner one the change's.
pub(super) async fn apply_once<E: 'static>(
    state: &AppState,
    scope: Scope,
    key: IdempotencyKey,
    fingerprint: &impl Serialize,
    wait: Duration,
    change: impl Change<E> + 'static,
) -> Result<Result<Once, E>, AppError> {
    let request = request(state, scope, key, fingerprint, wait);
    let db = state.db.clone();
    let ran = detached(crate::checkout::work_limit(&state.settings), async move {
        change.run(&db, request).await
    })
    .await?;
    answered(ran)
}

fn request(
    state: &AppState,
    scope: Scope,
    key: IdempotencyKey,
    fingerprint: &impl Serialize,
    wait: Duration,
) -> Request {
    Request {
        scope,
        key,
        fingerprint: idempotency::Fingerprint::of(fingerprint),
        stale_after: crate::checkout::stale_after(&state.settings),
        wait,
    }
}

fn answered<E>(ran: Result<Result<Once, E>, RunError>) -> Result<Result<Once, E>, AppError> {
    match ran {
        Ok(once) => Ok(once),
        Err(RunError::TakenOver) => Err(AppError::conflict(
            "This request was taken over by a retry.",
        )),
        Err(RunError::Database(e)) => Err(e.into()),
    }
}

/// What a stock form did, stored under the form's key: the page that shows the result, and
/// the notice it shows there.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct FormOutcome {
    pub(super) page: String,
    pub(super) notice: String,
}

impl FormOutcome {
    /// A form's change that went through, answered by this outcome (a 303 to its page).
    pub(super) fn stored(self) -> StoredResponse {
        StoredResponse {
            status: StatusCode::SEE_OTHER.as_u16(),
            body: serde_json::to_value(self).expect("a form outcome is plain JSON"),
        }
    }
}

/// A fresh key for a stock form being rendered.
pub(super) fn new_form_key() -> String {
    IdempotencyKey::generate().as_str().to_string()
}

/// The hidden key a stock form carries (made when the form was rendered).
pub(super) fn form_key(raw: &str) -> Result<IdempotencyKey, AppError> {
    IdempotencyKey::parse(raw).map_err(|_| {
        AppError::BadRequest(
            "This form is out of date or damaged; reload the page and submit it again.".into(),
        )
    })
}

/// Runs a stock form's change once per form key (and admin), and answers post/redirect/get:
/// 303 to the page that shows the result, the first time and for every replay of the same
/// form (a refresh, a double click, going back and submitting again); 422 when the key
/// comes back with other values; 409 while its first request is still running.
pub(super) async fn apply_form<E: 'static>(
    state: &AppState,
    admin: &Admin,
    key: &IdempotencyKey,
    fingerprint: &impl Serialize,
    change: impl Change<E> + 'static,
) -> Result<Result<HttpResponse, E>, AppError> {
    let scoped = admin_key(admin, key)?;
    let wait = SECOND_PRESS_WAIT;
    let once = apply_once(state, Scope::AdminForm, scoped, fingerprint, wait, change).await?;
    form_answer(key, once)
}

/// The answer to a form from what applying it came to.
fn form_answer<E>(
    key: &IdempotencyKey,
    once: Result<Once, E>,
) -> Result<Result<HttpResponse, E>, AppError> {
    let stored = match once {
        Err(e) => return Ok(Err(e)),
        Ok(Once::Applied(stored) | Once::Replayed(stored)) => stored,
        Ok(Once::Mismatch) => {
            return Err(AppError::Unprocessable(
                "This form was already submitted with other values, so these were not \
                 applied and nothing changed. Open the page again for a fresh form."
                    .into(),
            ));
        }
        Ok(Once::InFlight) => {
            return Err(AppError::Conflict {
                message: "This form was sent twice and the first is still being applied; \
                          nothing was done twice. Reload the page in a moment to see the result."
                    .into(),
                retry_after: Some(1),
                details: None,
            });
        }
    };
    let outcome: FormOutcome =
        serde_json::from_value(stored.body).map_err(|e| AppError::Internal(e.into()))?;
    let done = crate::error::percent_encode(key.as_str());
    Ok(Ok(see_other(&format!("{}?done={done}", outcome.page))))
}

/// `?done=<form key>` on a page a stock form redirected to.
#[derive(Deserialize)]
pub struct DoneQuery {
    pub(super) done: Option<String>,
}

/// The notice of this admin's stock form `done`, if it was applied and shows on `page`.
pub(super) async fn done_notice(
    state: &AppState,
    admin: &Admin,
    page: &str,
    done: Option<&str>,
) -> Result<Option<String>, AppError> {
    let Some(key) = done.and_then(|raw| IdempotencyKey::parse(raw).ok()) else {
        return Ok(None);
    };
    let Ok(key) = admin_key(admin, &key) else {
        return Ok(None);
    };
    let stored = idempotency::stored(&state.db, Scope::AdminForm, &key).await?;
    Ok(stored
        .and_then(|s| serde_json::from_value::<FormOutcome>(s.body).ok())
        .filter(|outcome| outcome.page == page)
        .map(|outcome| outcome.notice))
}
