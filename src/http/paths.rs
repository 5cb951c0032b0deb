//! What an address names, read on the way in: a handler takes a [`SkuPath`] rather than
//! parsing the `{sku}` segment's text itself. One that is not a SKU at all is 404, in the
//! same words whichever handler it was sent to.

use std::future::{Ready, ready};

use actix_web::{FromRequest, HttpRequest, dev::Payload};

use crate::catalog::Sku;
use crate::error::AppError;

/// The `{sku}` segment of the address, as a SKU (any case is read as upper case).
#[derive(Debug, Clone)]
pub struct SkuPath(pub Sku);

/// 404 for an address whose `{sku}` names no product (the text repeated as sent).
pub fn no_product(raw: &str) -> AppError {
    AppError::not_found(format!("No product with SKU {}.", crate::text::quoted(raw)))
}

impl FromRequest for SkuPath {
    type Error = AppError;
    type Future = Ready<Result<Self, AppError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let raw = req.match_info().get("sku").unwrap_or_default();
        ready(Sku::parse(raw).map(SkuPath).map_err(|_| no_product(raw)))
    }
}

impl std::ops::Deref for SkuPath {
    type Target = Sku;
    fn deref(&self) -> &Sku {
        &self.0
    }
}

/// What an `{id}` segment names, and the 404 for one that is not such an id (`raw`, as
/// sent): each kind of page words it its own way.
pub trait Names {
    fn missing(raw: &str) -> AppError;
}

/// The `{id}` segment of the address, as the id of an `N`.
pub struct IdPath<N>(pub uuid::Uuid, pub std::marker::PhantomData<N>);

impl<N: Names> FromRequest for IdPath<N> {
    type Error = AppError;
    type Future = Ready<Result<Self, AppError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let raw = req.match_info().get("id").unwrap_or_default();
        let id = uuid::Uuid::try_parse(raw).map_err(|_| N::missing(raw));
        ready(id.map(|id| IdPath(id, std::marker::PhantomData)))
    }
}
