-- Events out: the outbox, webhook endpoints, and one delivery per (event, destination).
--
-- An event is inserted in the same transaction as the change it reports, so a committed
-- change always has its event and a rolled-back one never does. Dispatchers (one per
-- process) route new events to deliveries and send those, claiming rows with
-- `for update skip locked`; a delivery is sent at least once, and its event id lets the
-- receiver drop a repeat.

create table events (
    id         uuid primary key default gen_random_uuid(),
    -- Insertion order, for routing oldest first.
    seq        bigint generated always as identity unique,
    type       text not null check (type in (
                   'order.placed', 'order.cancelled',
                   'hold.placed', 'hold.confirmed', 'hold.released', 'hold.expired',
                   'stock.low', 'stock.sold_out', 'stock.adjusted')),
    -- Version of the payload's shape for this type; bumped when a field changes meaning.
    version    smallint not null default 1,
    payload    jsonb not null,
    created_at timestamptz not null default now(),
    -- When a dispatcher turned it into deliveries; null until then.
    routed_at  timestamptz
);
create index events_unrouted on events (seq) where routed_at is null;
create index events_order_placed on events ((payload->>'order_id')) where type = 'order.placed';

create table webhook_endpoints (
    id          uuid primary key,
    url         text not null check (length(url) <= 2000),
    event_types text[] not null check (cardinality(event_types) > 0),
    -- `whsec_` + base64 of the signing key (Standard Webhooks); shown to the admin once.
    secret      text not null,
    description text not null default '' check (length(description) <= 200),
    created_at  timestamptz not null default now()
);

create table deliveries (
    id              bigint generated always as identity primary key,
    event_id        uuid not null references events (id),
    channel         text not null check (channel in ('webhook', 'mail')),
    endpoint_id     uuid references webhook_endpoints (id) on delete cascade,
    status          text not null default 'pending' check (status in ('pending', 'sent', 'failed')),
    attempts        integer not null default 0,
    -- Not claimable before this: the next retry, or the lease of the dispatcher sending it
    -- (a dispatcher that dies mid-send leaves the row to be claimed again when it passes).
    next_attempt_at timestamptz not null default now(),
    last_status     smallint,
    last_response   text,
    last_error      text,
    created_at      timestamptz not null default now(),
    sent_at         timestamptz,
    check ((channel = 'webhook') = (endpoint_id is not null)),
    unique nulls not distinct (event_id, channel, endpoint_id)
);
create index deliveries_due on deliveries (next_attempt_at) where status = 'pending';
create index deliveries_recent on deliveries (id desc);
-- The dashboard counts the last day's deliveries (polled every second: never a full scan).
create index deliveries_created_at on deliveries (created_at);
create index deliveries_event on deliveries (event_id);

-- stock.low and stock.sold_out are emitted when what is available (on_hand - reserved)
-- crosses a product's threshold or reaches zero. Every path that changes stock (single
-- orders, batches, holds, the sweeper, cancels, admin counts) updates this row, so the
-- row's own trigger sees each crossing once, inside the transaction that caused it.
alter table stock add column low_stock_at integer not null default 5 check (low_stock_at >= 0);

create function stock_events() returns trigger language plpgsql as $$
declare
    before_available integer := old.on_hand - old.reserved;
    after_available  integer := new.on_hand - new.reserved;
begin
    if after_available = 0 and before_available > 0 then
        insert into events (type, payload)
        values ('stock.sold_out', jsonb_build_object(
            'sku', new.sku, 'on_hand', new.on_hand, 'reserved', new.reserved, 'available', 0));
    elsif after_available > 0 and after_available < new.low_stock_at
          and before_available >= new.low_stock_at then
        insert into events (type, payload)
        values ('stock.low', jsonb_build_object(
            'sku', new.sku, 'on_hand', new.on_hand, 'reserved', new.reserved,
            'available', after_available, 'threshold', new.low_stock_at));
    end if;
    return null;
end
$$;

create trigger stock_events after update of on_hand, reserved on stock
    for each row when (old.on_hand - old.reserved is distinct from new.on_hand - new.reserved)
    execute function stock_events();
