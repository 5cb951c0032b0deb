-- Products, their stock, and the append-only ledger of every stock movement.
-- PostgreSQL is the arbiter of stock: the CHECKs below make overselling impossible whatever
-- the application does, and the ledger lets anyone recompute on_hand from scratch.

create table products (
    sku         text primary key check (sku ~ '^[A-Z0-9][A-Z0-9-]{1,31}$'),
    name        text not null check (length(name) between 1 and 200),
    description text not null default '' check (length(description) <= 5000),
    price_cents bigint not null check (price_cents >= 0),
    active      boolean not null default true,
    created_at  timestamptz not null default now()
);

create table stock (
    sku        text primary key references products (sku),
    on_hand    integer not null default 0 check (on_hand >= 0),
    reserved   integer not null default 0 check (reserved >= 0),
    -- highest lease fencing token that wrote this row; an older token is refused
    last_fence bigint not null default 0,
    updated_at timestamptz not null default now(),
    check (reserved <= on_hand)
);

-- One row per change of on_hand or reserved; never updated, never deleted.
-- sum(delta) per SKU equals stock.on_hand, sum(reserved_delta) equals stock.reserved.
create table stock_movements (
    id             bigint generated always as identity primary key,
    sku            text not null references products (sku),
    delta          integer not null,
    reserved_delta integer not null default 0,
    reason         text not null check (reason in
                     ('initial', 'restock', 'adjust', 'order', 'cancel', 'hold', 'release', 'expire')),
    reference      text,
    actor          text not null,
    created_at     timestamptz not null default now()
);
create index stock_movements_sku on stock_movements (sku, id);

create function stock_movements_append_only() returns trigger
language plpgsql as $$
begin
    raise exception 'stock_movements is append-only';
end;
$$;

create trigger stock_movements_append_only
    before update or delete on stock_movements
    for each statement execute function stock_movements_append_only();
