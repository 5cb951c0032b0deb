//! What an address names, read on the way in: a handler takes a [`SkuPath`] or an
//! [`IdPath`] rather than parsing the segment's text itself. One that is not a SKU (or an
//! id of its kind) is 404, in the same words whichever handler it was sent to.

use std::future::{Ready, ready};

use actix_web::{FromRequest, HttpRequest, dev::Payload};

use crate::catalog::Sku;
use crate::error::AppError;

/// The `{sku}` segment of the address, read as a SKU (any case is read as upper case) when
/// the request arrives; the handler takes it with [`SkuPath::sku`] at the point its checks
/// reach the address, so a forged form is refused (403) before its address is judged.
#[derive(Debug)]
pub struct SkuPath(Result<Sku, AppError>);

impl SkuPath {
    /// The SKU, or 404 saying no product has it.
    pub fn sku(self) -> Result<Sku, AppError> {
        self.0
    }
}

/// 404 for an address whose `{sku}` names no product (the text repeated as sent).
pub fn no_product(raw: &str) -> AppError {
    AppError::not_found(format!("No product with SKU {}.", crate::text::quoted(raw)))
}

impl FromRequest for SkuPath {
    type Error = AppError;
    type Future = Ready<Result<Self, AppError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let raw = req.match_info().get("sku").unwrap_or_default();
        ready(Ok(SkuPath(Sku::parse(raw).map_err(|_| no_product(raw)))))
    }
}

/// What an `{id}` segment names: the type of its ids, and the 404 for one that is not
/// such an id (`raw`, as sent), which each kind of page words its own way.
pub trait Names {
    type Id: std::str::FromStr;
    /// The address's segment that names it (most are `{id}`).
    const SEGMENT: &'static str = "id";
    fn missing(raw: &str) -> AppError;
}

/// The `{id}` segment of the address, read as the id of an `N` when the request arrives;
/// the handler takes it with [`IdPath::id`], as [`SkuPath`].
pub struct IdPath<N: Names>(Result<N::Id, AppError>, std::marker::PhantomData<N>);

impl<N: Names> IdPath<N> {
    /// The id, or 404 in `N`'s words.
    pub fn id(self) -> Result<N::Id, AppError> {
        self.0
    }
}

impl<N: Names> FromRequest for IdPath<N> {
    type Error = AppError;
    type Future = Ready<Result<Self, AppError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let raw = req.match_info().get(N::SEGMENT).unwrap_or_default();
        let id = raw.parse().map_err(|_| N::missing(raw));
        ready(Ok(IdPath(id, std::marker::PhantomData)))
    }
}
