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
//!
//! Listings are kept per request (search words, category, order, page, page size): an
//! entry only ever answers the exact question it was the answer to.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::browse::{Browse, Search};
use super::db::Listing;
use super::{ProductView, Sku};

type Timed<T> = (Instant, T);
/// Category names with how many products each has on sale.
type Categories = Vec<(String, i64)>;

/// The product pages' and catalogue's data, per process.
pub struct CatalogCache {
    ttl: Duration,
    products: Mutex<HashMap<String, Timed<Option<ProductView>>>>,
    listings: Mutex<HashMap<(Browse, i64), Timed<Listing>>>,
    /// Per search: the counts are of what it finds.
    categories: Mutex<HashMap<Search, Timed<Categories>>>,
}

/// Entries kept at most (one per product viewed); past this the map starts afresh.
const MAX_ENTRIES: usize = 100_000;
/// Listings kept at most (one per distinct search and page); past this, afresh.
const MAX_LISTINGS: usize = 1_000;

impl CatalogCache {
    /// A cache whose entries live for `ttl`; zero turns it off.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            products: Mutex::default(),
            listings: Mutex::default(),
            categories: Mutex::default(),
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

    /// One page of a listing ([`super::db::browse`]), as of at most the TTL ago.
    pub async fn browse(
        &self,
        db: &PgPool,
        browse: &Browse,
        per_page: i64,
    ) -> sqlx::Result<Listing> {
        let key = (browse.clone(), per_page);
        if let Some((at, listing)) = self.listings.lock().expect("cache").get(&key)
            && at.elapsed() < self.ttl
        {
            return Ok(listing.clone());
        }
        let listing = super::db::browse(db, browse, per_page).await?;
        if !self.ttl.is_zero() {
            let mut listings = self.listings.lock().expect("cache");
            if listings.len() >= MAX_LISTINGS {
                listings.clear();
            }
            listings.insert(key, (Instant::now(), listing.clone()));
        }
        Ok(listing)
    }

    /// The categories with products on sale, counting what `search` finds, as of at most
    /// the TTL ago.
    pub async fn categories(&self, db: &PgPool, search: &Search) -> sqlx::Result<Categories> {
        if let Some((at, list)) = self.categories.lock().expect("cache").get(search)
            && at.elapsed() < self.ttl
        {
            return Ok(list.clone());
        }
        let list = super::db::categories(db, search).await?;
        if !self.ttl.is_zero() {
            let mut categories = self.categories.lock().expect("cache");
            if categories.len() >= MAX_LISTINGS {
                categories.clear();
            }
            categories.insert(search.clone(), (Instant::now(), list.clone()));
        }
        Ok(list)
    }

    /// Forgets what is known of `sku` (its stock or details changed here), and every
    /// listing, which may show it.
    pub fn forget(&self, sku: &Sku) {
        self.products.lock().expect("cache").remove(sku.as_str());
        self.listings.lock().expect("cache").clear();
        self.categories.lock().expect("cache").clear();
    }
}
