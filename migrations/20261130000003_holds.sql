-- Checkout holds: stock reserved for a shopper for a while (DESIGN.md section 4).
-- Placing a hold raises stock.reserved; confirming turns it into an order; cancelling or
-- expiring lowers reserved again. Every change is a ledger row.

create table holds (
    id                uuid primary key,
    state             text not null check (state in ('active', 'confirmed', 'released', 'expired')),
    expires_at        timestamptz not null,
    email             text check (length(email) <= 254),
    customer_name     text check (length(customer_name) <= 200),
    order_id          uuid references orders (id),
    idempotency_scope text not null,
    idempotency_key   text not null,
    created_at        timestamptz not null default now(),
    updated_at        timestamptz not null default now(),
    unique (idempotency_scope, idempotency_key),
    check ((state = 'confirmed') = (order_id is not null))
);
-- What the sweeper scans: active holds by expiry.
create index holds_active_expiry on holds (expires_at) where state = 'active';

create table hold_lines (
    hold_id          uuid not null references holds (id),
    sku              text not null references products (sku),
    quantity         integer not null check (quantity > 0),
    -- the price shown to the shopper when the hold was placed; the order keeps it
    unit_price_cents bigint not null check (unit_price_cents >= 0),
    primary key (hold_id, sku)
);
