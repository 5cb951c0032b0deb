//! The two kinds of placement, an order (stock sold now) and a hold (stock set aside for a
//! while), and the points where their one path differs: how stock moves, which rows are
//! written, which event is told, how one is read back for a replay.

use chrono::Utc;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::OrderRequest;
use super::batch::{BatchAnswer, Want};
use super::decided::Keyed;
use crate::catalog::Sku;
use crate::config::{OrderStrategy, Settings};
use crate::events::Event;
use crate::holds::{self, Hold, HoldState};
use crate::inventory::db::{self as stock, Take};
use crate::orders::db as order_rows;
use crate::orders::{Order, OrderLine, OrderStatus};

/// What an order or a hold is made of, before the kind decides the rest.
pub(super) struct Draft<'a> {
    pub(super) id: Uuid,
    pub(super) lines: Vec<OrderLine>,
    pub(super) total_cents: i64,
    pub(super) request: &'a OrderRequest,
    /// Microsecond precision, as PostgreSQL stores it, so replays compare equal.
    pub(super) now: chrono::DateTime<Utc>,
}

/// One kind of placement: an order (stock sold now) or a hold (stock set aside for a
/// while). The path is the same for both; these are the points where they differ.
pub(super) trait Kind: Serialize + DeserializeOwned + Send + Sync + Sized {
    /// What a batch job of this kind asks for.
    const WANT: Want;

    /// The one a batch made for a job of this kind.
    fn from_batch(answer: BatchAnswer) -> Option<Self>;

    /// Moves `quantity` of `sku` inside the transaction: `on_hand −= q` for an order,
    /// `reserved += q` for a hold; conditional, fenced.
    async fn take(
        tx: &mut PgConnection,
        settings: &Settings,
        line: (&Sku, i32),
        fence: Option<i64>,
        reference: &str,
        actor: &str,
    ) -> sqlx::Result<Take>;

    /// Writes the made thing and its lines under the key; `None` when the key already has
    /// one (from before its record was purged).
    async fn insert(
        tx: &mut PgConnection,
        settings: &Settings,
        draft: Draft<'_>,
        keyed: &Keyed<'_>,
    ) -> sqlx::Result<Option<Self>>;

    /// Why the shopper may not have this one on top of what they keep already (a hold:
    /// their live holds of a product counted together, [`holds::cap`]); run under the
    /// stock rows' locks. `None`: they may.
    async fn over_cap(
        tx: &mut PgConnection,
        settings: &Settings,
        request: &OrderRequest,
        products: &[order_rows::OrderProduct],
    ) -> sqlx::Result<Option<String>>;

    /// The event told to the outside world when one is made.
    fn event(&self) -> Event;

    fn id(&self) -> Uuid;

    /// The one with this id, as it is now.
    async fn find(db: &PgPool, id: Uuid) -> sqlx::Result<Option<Self>>;

    /// The one made under the key, if any.
    async fn for_key(db: &PgPool, scope: &str, key: &str) -> sqlx::Result<Option<Uuid>>;
}

impl Kind for Order {
    const WANT: Want = Want::Order;

    fn from_batch(answer: BatchAnswer) -> Option<Self> {
        match answer {
            BatchAnswer::Placed(order) => Some(order),
            _ => None,
        }
    }

    async fn take(
        tx: &mut PgConnection,
        settings: &Settings,
        (sku, q): (&Sku, i32),
        fence: Option<i64>,
        reference: &str,
        actor: &str,
    ) -> sqlx::Result<Take> {
        if settings.order_strategy == OrderStrategy::NaiveUnsafe {
            stock::take_stock_naive(tx, sku, q, reference, actor).await
        } else {
            stock::take_stock(tx, sku, q, fence, reference, actor).await
        }
    }

    async fn insert(
        tx: &mut PgConnection,
        _: &Settings,
        draft: Draft<'_>,
        keyed: &Keyed<'_>,
    ) -> sqlx::Result<Option<Self>> {
        let order = Order {
            id: draft.id,
            status: OrderStatus::Placed,
            total_cents: draft.total_cents,
            lines: draft.lines,
            email: draft.request.email().map(str::to_string),
            customer_name: draft.request.name().map(str::to_string),
            created_at: draft.now,
        };
        let (scope, key) = (keyed.scope.as_str(), keyed.key.as_str());
        let shopper = draft.request.shopper().identities();
        match order_rows::insert_order(tx, &order, scope, key, shopper).await {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(None),
            other => other.map(|()| Some(order)),
        }
    }

    async fn over_cap(
        _: &mut PgConnection,
        _: &Settings,
        _: &OrderRequest,
        _: &[order_rows::OrderProduct],
    ) -> sqlx::Result<Option<String>> {
        Ok(None)
    }

    fn event(&self) -> Event {
        Event::order_placed(self)
    }

    fn id(&self) -> Uuid {
        self.id
    }

    async fn find(db: &PgPool, id: Uuid) -> sqlx::Result<Option<Self>> {
        order_rows::find_order(db, id).await
    }

    async fn for_key(db: &PgPool, scope: &str, key: &str) -> sqlx::Result<Option<Uuid>> {
        order_rows::order_for_key(db, scope, key).await
    }
}

impl Kind for Hold {
    const WANT: Want = Want::Hold;

    fn from_batch(answer: BatchAnswer) -> Option<Self> {
        match answer {
            BatchAnswer::Held(hold) => Some(hold),
            _ => None,
        }
    }

    async fn take(
        tx: &mut PgConnection,
        _: &Settings,
        (sku, q): (&Sku, i32),
        fence: Option<i64>,
        reference: &str,
        actor: &str,
    ) -> sqlx::Result<Take> {
        stock::reserve_stock(tx, sku, q, fence, reference, actor).await
    }

    async fn insert(
        tx: &mut PgConnection,
        settings: &Settings,
        draft: Draft<'_>,
        keyed: &Keyed<'_>,
    ) -> sqlx::Result<Option<Self>> {
        let mut hold = Hold {
            id: draft.id,
            state: HoldState::Active,
            expires_at: draft.now,
            lines: draft.lines,
            total_cents: draft.total_cents,
            email: draft.request.email().map(str::to_string),
            customer_name: draft.request.name().map(str::to_string),
            order_id: None,
        };
        let (scope, key) = (keyed.scope.as_str(), keyed.key.as_str());
        let shopper = draft.request.shopper().identities();
        let ttl = settings.hold_ttl;
        match holds::db::insert_hold(tx, &hold, ttl, scope, key, shopper).await {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(None),
            other => {
                // Expiry by the database's clock, the one the sweeper uses.
                hold.expires_at = other?;
                Ok(Some(hold))
            }
        }
    }

    async fn over_cap(
        tx: &mut PgConnection,
        settings: &Settings,
        request: &OrderRequest,
        products: &[order_rows::OrderProduct],
    ) -> sqlx::Result<Option<String>> {
        use holds::cap::{Ask, Caps, held_by, refusal};
        let (persons, addresses) = request.shopper().hold_identities();
        let lines = request.lines();
        let asks: Vec<Ask> = lines
            .iter()
            .map(|l| Ask {
                sku: l.sku.as_str(),
                persons: &persons,
                addresses: &addresses,
            })
            .collect();
        let held = held_by(tx, &asks).await?;
        let caps = Caps::of(settings);
        Ok(lines.iter().zip(held).find_map(|(line, held)| {
            let name = products
                .iter()
                .find(|p| p.sku == line.sku.as_str())
                .map_or(line.sku.as_str(), |p| p.name.as_str());
            refusal(name, line.quantity.get(), held, caps)
        }))
    }

    fn event(&self) -> Event {
        Event::hold_placed(self)
    }

    fn id(&self) -> Uuid {
        self.id
    }

    async fn find(db: &PgPool, id: Uuid) -> sqlx::Result<Option<Self>> {
        holds::db::find_hold(db, id).await
    }

    async fn for_key(db: &PgPool, scope: &str, key: &str) -> sqlx::Result<Option<Uuid>> {
        holds::db::hold_for_key(db, scope, key).await
    }
}
