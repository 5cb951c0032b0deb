-- Drops: a product released at a set time through a waiting room. The queue itself lives
-- in Redis (positions, admission); PostgreSQL keeps what must outlast it: the drop, its
-- state, the key that signs its passes, and every admission (checker I8 counts each order
-- of a drop's product against them).

create table drops (
    id               uuid primary key,
    sku              text not null references products (sku),
    opens_at         timestamptz not null,
    -- Joining opens this long before `opens_at`; a lottery draws its places among them.
    prequeue_seconds integer not null check (prequeue_seconds between 0 and 604800),
    queueing         text not null check (queueing in ('fifo', 'lottery')),
    admit_per_minute integer not null check (admit_per_minute between 1 and 1000000),
    max_active       integer check (max_active between 1 and 1000000),
    session_seconds  integer not null check (session_seconds between 30 and 86400),
    status           text not null default 'scheduled'
                     check (status in ('scheduled', 'paused', 'ended', 'sold_out')),
    -- The drop binds its product (no hold or order without a pass) from this moment: by
    -- then every process has read it (see `drops::registry`).
    binds_at         timestamptz not null,
    -- When `drop.opened` was recorded; when the drop ended or sold out.
    opened_at        timestamptz,
    ended_at         timestamptz,
    -- Signs the drop's passes (HMAC-SHA256); never shown.
    secret           bytea not null check (length(secret) = 32),
    created_at       timestamptz not null default now(),
    check ((status in ('ended', 'sold_out')) = (ended_at is not null))
);
-- One drop at a time per product.
create unique index drops_one_live_per_sku on drops (sku) where ended_at is null;
create index drops_recent on drops (created_at desc);

-- A shopper let in: their ticket, who the pass is bound to, and the owner part of the
-- idempotency keys their orders and holds are placed under.
create table drop_admissions (
    drop_id     uuid not null references drops (id),
    ticket      uuid not null,
    identity    text not null check (length(identity) <= 200),
    key_owner   text not null check (length(key_owner) <= 100),
    admitted_at timestamptz not null,
    expires_at  timestamptz not null,
    primary key (drop_id, ticket)
);
create index drop_admissions_owner on drop_admissions (drop_id, key_owner, admitted_at);
-- One admission per identity and drop: a ticket let in again after Redis lost some of its
-- queue (a failover) is answered with the admission already recorded.
create unique index drop_admissions_one_per_identity on drop_admissions (drop_id, identity);

alter table events drop constraint events_type_check;
alter table events add constraint events_type_check check (type in (
    'order.placed', 'order.cancelled',
    'hold.placed', 'hold.confirmed', 'hold.released', 'hold.expired',
    'stock.low', 'stock.sold_out', 'stock.adjusted',
    'drop.opened', 'drop.sold_out', 'drop.ended'));
