//! The storefront in pages, one file per step of a purchase: the catalogue
//! ([`catalogue`]), a product and its pictures ([`product`]), the cart ([`cart`]),
//! checkout ([`checkout`]) and the order page it ends on ([`order`]). Their routes are
//! listed with every other public route in [`super::routes`].
//!
//! The cart lives in a cookie. Its "Checkout" button carries the lines and a fresh
//! idempotency key, and places a hold: the stock is the shopper's while they fill in their
//! details, with a countdown. Placing the order confirms the hold; the hold id makes that
//! idempotent, so submitting twice, refreshing the POST, or going back and submitting again
//! all show the same single order. The key is this browser's alone, and checkouts count
//! against the address's rate limit, like anonymous API orders.

pub mod cart;
pub mod catalogue;
pub mod checkout;
pub mod drop;
pub mod order;
pub mod product;

pub use cart::{CART_COOKIE, Cart};

/// Who this browser is: a digest of its CSRF cookie. It is the key space of its checkout
/// forms (the form's key is random already; this makes a key that leaked, in a shared
/// screenshot or a log, useless from any other browser) and the identity a drop's pass
/// is bound to.
pub fn browser(req: &actix_web::HttpRequest) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(super::csrf::token(req).as_bytes());
    format!("b{}", &hex::encode(digest)[..32])
}
