//! Which products are in a drop, as this process knows it: read from PostgreSQL every
//! [`REFRESH`], and at once by the process that changed a drop. A drop binds its product
//! [`BIND_AFTER`](super::BIND_AFTER) after it is created; a process whose copy is older than [`STALE`]
//! reads it again before deciding whether a hold or order needs a pass, so no process
//! sells a bound product without one (BIND_AFTER − STALE is the margin for the moment
//! between the drop's insert and its commit).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use chrono::Utc;
use sqlx::PgPool;
use uuid::Uuid;

use super::Drop;
use super::pass::{self, Refused};

pub const REFRESH: Duration = Duration::from_millis(500);
pub const STALE: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Known {
    /// Drops that have not ended, by SKU.
    by_sku: HashMap<String, Arc<Drop>>,
    loaded: Option<Instant>,
}

/// The live drops, shared by every request of this process.
#[derive(Default)]
pub struct Registry {
    known: RwLock<Known>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
}

/// A hold or order that may not go ahead: the drop's queue is where to go.
#[derive(Debug, Clone)]
pub struct NeedsPass {
    pub drop_id: Uuid,
    pub sku: String,
    pub queue_path: String,
    pub message: String,
}

impl Registry {
    /// Reads the live drops again.
    pub async fn reload(&self, db: &PgPool) -> sqlx::Result<()> {
        let _one = self.reloading.lock().await;
        self.read(db).await
    }

    /// Reads them again unless fresh by the time it is this caller's turn: requests
    /// finding the copy stale together read it once.
    async fn refresh(&self, db: &PgPool) -> sqlx::Result<()> {
        let _one = self.reloading.lock().await;
        if self.fresh() {
            return Ok(());
        }
        self.read(db).await
    }

    async fn read(&self, db: &PgPool) -> sqlx::Result<()> {
        let started = Instant::now();
        let drops = super::db::live(db).await?;
        let mut known = self.known.write().expect("drops registry");
        known.by_sku = drops
            .into_iter()
            .map(|d| (d.sku.clone(), Arc::new(d)))
            .collect();
        known.loaded = Some(started);
        Ok(())
    }

    fn fresh(&self) -> bool {
        let known = self.known.read().expect("drops registry");
        known.loaded.is_some_and(|at| at.elapsed() < STALE)
    }

    /// The live drops (reloaded first when this copy is stale).
    pub async fn live(&self, db: &PgPool) -> sqlx::Result<Vec<Arc<Drop>>> {
        if !self.fresh() {
            self.refresh(db).await?;
        }
        let known = self.known.read().expect("drops registry");
        Ok(known.by_sku.values().cloned().collect())
    }

    /// Whether any live drop binds its product at `now` (reloaded first when stale).
    pub async fn binds_any(&self, db: &PgPool, now: chrono::DateTime<Utc>) -> sqlx::Result<bool> {
        if !self.fresh() {
            self.refresh(db).await?;
        }
        let known = self.known.read().expect("drops registry");
        Ok(known.by_sku.values().any(|d| d.binds_at <= now))
    }

    /// The drop `sku` is in, if any (reloaded first when this copy is stale).
    pub async fn of_sku(&self, db: &PgPool, sku: &str) -> sqlx::Result<Option<Arc<Drop>>> {
        if !self.fresh() {
            self.refresh(db).await?;
        }
        Ok(self
            .known
            .read()
            .expect("drops registry")
            .by_sku
            .get(sku)
            .cloned())
    }

    /// Live drop `id` as this process knows it (reloaded first when stale); `None` for one
    /// that ended (or does not exist).
    pub async fn by_id(&self, db: &PgPool, id: Uuid) -> sqlx::Result<Option<Arc<Drop>>> {
        if !self.fresh() {
            self.refresh(db).await?;
        }
        let known = self.known.read().expect("drops registry");
        Ok(known.by_sku.values().find(|d| d.id == id).cloned())
    }

    /// Whether a hold or order of `skus` by `identity` may go ahead: each SKU in a drop
    /// that binds it needs `passes` to hold a valid one of that drop, and the drop to be
    /// open. `passes` are what the caller sent, by drop.
    pub async fn require_pass(
        &self,
        db: &PgPool,
        skus: impl Iterator<Item = &str>,
        identity: &str,
        passes: impl Fn(Uuid) -> Option<String>,
    ) -> Result<(), RequireError> {
        let now = Utc::now();
        for sku in skus {
            let Some(drop) = self.of_sku(db, sku).await? else {
                continue;
            };
            if drop.binds_at > now {
                continue;
            }
            let refuse = |message: String| {
                RequireError::NeedsPass(NeedsPass {
                    drop_id: drop.id,
                    sku: drop.sku.clone(),
                    queue_path: drop.queue_path(),
                    message,
                })
            };
            let checked = match passes(drop.id) {
                None => Err(Refused::Missing),
                Some(raw) => pass::verify(&raw, &drop.secret, drop.id, identity, now),
            };
            if let Err(why) = checked {
                return Err(refuse(format!(
                    "{sku} is sold in a drop. {why} The queue is at {}.",
                    drop.queue_path()
                )));
            }
            if drop.opens_at > now {
                return Err(refuse(format!(
                    "{sku} goes on sale at {}; nothing of it is sold before.",
                    drop.opens_at
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                )));
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RequireError {
    #[error("{}", .0.message)]
    NeedsPass(NeedsPass),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}
