//! The storefront's view of the catalogue, kept in each process for a moment so that a
//! page view in a flash sale costs no database round trip.
//!
//! Why a short time-to-live rather than notifications: a flash sale changes a hot SKU's
//! stock thousands of times a second, and a message per change (LISTEN/NOTIFY, a Redis
//! channel) would cost more than the reads it saves. So an entry lives for
//! `STOCKADE_PAGE_CACHE_MS` (half a second by default): a count such as "only 3 left" is
//! never staler than that, and the process that sells the last unit, or changes stock in
//! the admin, forgets the entry at once, so "sold out" shows there immediately. Orders
//! never read this cache: the database decides every sale.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::{ProductView, Sku};

/// The product pages' and catalogue's data, per process.
pub struct CatalogCache {
    ttl: Duration,
    products: Mutex<HashMap<String, (Instant, Option<ProductView>)>>,
    list: Mutex<Option<(Instant, Vec<ProductView>)>>,
}

/// Entries kept at most (one per product viewed); past this the map starts afresh.
const MAX_ENTRIES: usize = 100_000;

impl CatalogCache {
    /// A cache whose entries live for `ttl`; zero turns it off.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            products: Mutex::default(),
            list: Mutex::default(),
        }
    }

    /// One active product, as of at most the TTL ago.
    pub async fn product(&self, db: &PgPool, sku: &Sku) -> sqlx::Result<Option<ProductView>> {
        if let Some((at, view)) = self.products.lock().expect("cache").get(sku.as_str())
            && at.elapsed() < self.ttl
        {
            return Ok(view.clone());
        }
        let view = super::db::find_product(db, sku).await?;
        if !self.ttl.is_zero() {
            let mut products = self.products.lock().expect("cache");
            if products.len() >= MAX_ENTRIES {
                products.clear();
            }
            products.insert(sku.to_string(), (Instant::now(), view.clone()));
        }
        Ok(view)
    }

    /// The active products, by name, as of at most the TTL ago.
    pub async fn products(&self, db: &PgPool) -> sqlx::Result<Vec<ProductView>> {
        if let Some((at, list)) = self.list.lock().expect("cache").as_ref()
            && at.elapsed() < self.ttl
        {
            return Ok(list.clone());
        }
        let list = super::db::list_products(db).await?;
        if !self.ttl.is_zero() {
            *self.list.lock().expect("cache") = Some((Instant::now(), list.clone()));
        }
        Ok(list)
    }

    /// Forgets what is known of `sku` (its stock or details changed here).
    pub fn forget(&self, sku: &Sku) {
        self.products.lock().expect("cache").remove(sku.as_str());
        *self.list.lock().expect("cache") = None;
    }
}
