-- Payments: each checkout hold's one PaymentIntent at the provider (Stripe), authorized
-- when the shopper pays and captured only once the order has committed (src/payments).
-- The provider's idempotency keys are not relied on: these rows are the guard.

create table payments (
    -- One payment per hold. Not a foreign key: holds are purged after their retention,
    -- and a payment is a financial record that stays.
    hold_id         uuid primary key,
    -- The provider's intent; null only while it is being made (status 'creating').
    payment_intent  text unique check (length(payment_intent) <= 255),
    client_secret   text check (length(client_secret) <= 255),
    -- From the server's prices when the intent was made; never from a client.
    amount_cents    bigint not null check (amount_cents > 0),
    currency        text not null check (currency ~ '^[a-z]{3}$'),
    -- The intent's status as last read from the provider (Stripe's names), or 'creating'.
    status          text not null check (status in ('creating', 'requires_payment_method',
                        'requires_confirmation', 'requires_action', 'processing',
                        'requires_capture', 'succeeded', 'canceled')),
    -- The order it paid for: one order per payment, one payment per order.
    order_id        uuid unique references orders (id),
    -- Declined confirmations so far: the next confirmation's idempotency key.
    attempt         integer not null default 0 check (attempt >= 0),
    -- The last decline, as the provider worded it.
    decline_code    text check (length(decline_code) <= 100),
    decline_message text check (length(decline_message) <= 500),
    -- The hold's time was extended once, when paying started.
    extended        boolean not null default false,
    -- What was captured, once; what was refunded, once.
    captured_cents  bigint check (captured_cents > 0),
    refund_id       text unique check (length(refund_id) <= 255),
    refunded_cents  bigint check (refunded_cents > 0),
    -- Nothing is left to do: cancelled, or captured for a live order, or refunded.
    settled         boolean not null default false,
    -- When the reconciler looks at an unsettled payment next.
    reconcile_at    timestamptz not null default now(),
    created_at      timestamptz not null default now(),
    updated_at      timestamptz not null default now(),
    check ((status = 'creating') = (payment_intent is null)),
    check (captured_cents is null or status = 'succeeded'),
    check ((refund_id is null) = (refunded_cents is null)),
    check (refund_id is null or captured_cents is not null)
);
-- What the reconciler scans.
create index payments_to_reconcile on payments (reconcile_at) where not settled;

-- Provider events already handled, by the provider's event id (deliveries repeat).
create table payment_events (
    id          text primary key check (length(id) <= 255),
    type        text not null check (length(type) <= 100),
    received_at timestamptz not null default now()
);
create index payment_events_by_age on payment_events (received_at);

-- API clients that may order without paying (load tests; customers invoiced elsewhere).
alter table api_clients add column unpaid_orders boolean not null default false;
