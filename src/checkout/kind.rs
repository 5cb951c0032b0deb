//! Where an order and a hold differ on their one path: how stock moves, which rows are
//! written, how a limit is counted, how one is read back for a replay. Each is a method
//! of [`Want`], chosen by what the request asks for.

use chrono::Utc;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::placement::{Keyed, Made, Want};
use super::request::OrderRequest;
use crate::catalog::Sku;
use crate::config::{OrderStrategy, Settings};
use crate::holds::{self, Hold, HoldState};
use crate::inventory::db::{self as stock, Take};
use crate::orders::db as order_rows;
use crate::orders::{Order, OrderStatus};

/// What an order or a hold is made of, before the kind decides the rest.
pub struct Draft<'a> {
    pub id: Uuid,
    pub lines: Vec<crate::orders::OrderLine>,
    pub total_cents: i64,
    pub request: &'a OrderRequest,
    /// Microsecond precision, as PostgreSQL stores it, so replays compare equal.
    pub now: chrono::DateTime<Utc>,
}

impl Want {
    /// Moves `quantity` of `sku` inside the transaction: `on_hand −= q` for an order,
    /// `reserved += q` for a hold; conditional, fenced.
    pub async fn take(
        self,
        tx: &mut PgConnection,
        settings: &Settings,
        (sku, q): (&Sku, i32),
        fence: Option<i64>,
        reference: &str,
        actor: &str,
    ) -> sqlx::Result<Take> {
        match self {
            Self::Order if settings.order_strategy == OrderStrategy::NaiveUnsafe => {
                stock::take_stock_naive(tx, sku, q, reference, actor).await
            }
            Self::Order => stock::take_stock(tx, sku, q, fence, reference, actor).await,
            Self::Hold => stock::reserve_stock(tx, sku, q, fence, reference, actor).await,
        }
    }

    /// Writes the made thing and its lines under the key; `None` when the key already has
    /// one (from before its record was purged).
    pub async fn insert(
        self,
        tx: &mut PgConnection,
        settings: &Settings,
        draft: Draft<'_>,
        keyed: &Keyed<'_>,
    ) -> sqlx::Result<Option<Made>> {
        let (scope, key) = (keyed.scope.as_str(), keyed.key.as_str());
        let shopper = draft.request.shopper().identities();
        let email = draft.request.email().map(str::to_string);
        let customer_name = draft.request.name().map(str::to_string);
        let inserted = match self {
            Self::Order => {
                let number = crate::orders::db::draw_number(tx).await?;
                let order = Order {
                    id: draft.id,
                    number,
                    status: OrderStatus::Placed,
                    total_cents: draft.total_cents,
                    lines: draft.lines,
                    email,
                    customer_name,
                    shipping_address: draft.request.shipping_address().cloned().map(Box::new),
                    created_at: draft.now,
                    payment: None,
                };
                order_rows::insert_order(tx, &order, scope, key, shopper)
                    .await
                    .map(|()| Made::Order(order))
            }
            Self::Hold => {
                let mut hold = Hold {
                    id: draft.id,
                    state: HoldState::Active,
                    expires_at: draft.now,
                    lines: draft.lines,
                    total_cents: draft.total_cents,
                    email,
                    customer_name,
                    order_id: None,
                };
                let ttl = settings.hold_ttl;
                holds::db::insert_hold(tx, &hold, ttl, scope, key, shopper)
                    .await
                    .map(|expires_at| {
                        // Expiry by the database's clock, the one the sweeper uses.
                        hold.expires_at = expires_at;
                        Made::Hold(hold)
                    })
            }
        };
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(None),
            other => other.map(Some),
        }
    }

    /// Why the shopper may not have this one on top of what they keep already (a hold:
    /// their live holds of a product counted together, [`holds::cap`]; an order has no
    /// such cap); run under the stock rows' locks. `None`: they may.
    pub async fn over_cap(
        self,
        tx: &mut PgConnection,
        settings: &Settings,
        request: &OrderRequest,
        products: &[order_rows::OrderProduct],
    ) -> sqlx::Result<Option<String>> {
        use holds::cap::{Ask, Caps, held_by, refusal};
        if self == Self::Order {
            return Ok(None);
        }
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

    /// The one with this id, as it is now.
    pub async fn find(self, db: &PgPool, id: Uuid) -> sqlx::Result<Option<Made>> {
        Ok(match self {
            Self::Order => order_rows::find_order(db, id).await?.map(Made::Order),
            Self::Hold => holds::db::find_hold(db, id).await?.map(Made::Hold),
        })
    }

    /// The one made under the key, if any.
    pub async fn for_key(self, db: &PgPool, scope: &str, key: &str) -> sqlx::Result<Option<Uuid>> {
        match self {
            Self::Order => order_rows::order_for_key(db, scope, key).await,
            Self::Hold => holds::db::hold_for_key(db, scope, key).await,
        }
    }
}
