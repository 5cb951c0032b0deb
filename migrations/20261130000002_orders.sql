-- Orders, their lines, and idempotency records. An order, its lines, its ledger rows and
-- its idempotency record are written in one transaction (DESIGN.md section 2).

create table orders (
    id                uuid primary key,
    status            text not null default 'placed' check (status in ('placed', 'cancelled')),
    customer_name     text check (length(customer_name) <= 200),
    email             text check (length(email) <= 254),
    total_cents       bigint not null check (total_cents >= 0),
    -- The key the order was placed under; unique, so no key can ever yield two orders (I3),
    -- even after its idempotency record has been purged.
    idempotency_scope text not null,
    idempotency_key   text not null,
    created_at        timestamptz not null default now(),
    unique (idempotency_scope, idempotency_key)
);
create index orders_created_at on orders (created_at);

create table order_lines (
    order_id         uuid not null references orders (id),
    sku              text not null references products (sku),
    quantity         integer not null check (quantity > 0),
    -- the price when the order was placed, whatever the product costs later
    unit_price_cents bigint not null check (unit_price_cents >= 0),
    primary key (order_id, sku)
);
create index order_lines_sku on order_lines (sku);

-- One row per (scope, key). 'in_flight' while a request works on it; 'completed' with the
-- response to replay. A request that dies in flight leaves a row whose lease (locked_at)
-- runs out; the next retry takes it over, and since nothing commits without completing
-- the row in the same transaction, a taken-over key never has an order.
create table idempotency_keys (
    scope           text not null,
    key             text not null,
    fingerprint     text not null,
    state           text not null check (state in ('in_flight', 'completed')),
    owner           uuid not null,
    response_status smallint,
    response_body   jsonb,
    created_at      timestamptz not null default now(),
    locked_at       timestamptz not null default now(),
    completed_at    timestamptz,
    primary key (scope, key),
    check ((state = 'completed') = (response_status is not null))
);
create index idempotency_keys_created_at on idempotency_keys (created_at);
