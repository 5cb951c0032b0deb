-- Admins, their sessions, failed logins (for throttling), and a note on ledger rows so
-- every manual change says why.

create table admin_users (
    id            bigint generated always as identity primary key,
    username      text not null unique check (username ~ '^[a-z0-9][a-z0-9._-]{2,31}$'),
    -- argon2id, PHC string format
    password_hash text not null,
    created_at    timestamptz not null default now()
);

-- The cookie carries a random token; only its SHA-256 is stored, so a copy of this table
-- does not log anyone in.
create table admin_sessions (
    token_hash text primary key,
    user_id    bigint not null references admin_users (id) on delete cascade,
    csrf_token text not null,
    created_at timestamptz not null default now(),
    expires_at timestamptz not null
);
create index admin_sessions_expiry on admin_sessions (expires_at);

-- Failed logins per account and per client address, counted over a sliding window.
create table login_failures (
    id      bigint generated always as identity primary key,
    kind    text not null check (kind in ('account', 'client')),
    subject text not null,
    at      timestamptz not null default now()
);
create index login_failures_lookup on login_failures (kind, subject, at);

-- Why a person changed stock (restock, adjust, cancel); the reason column says what kind.
alter table stock_movements add column note text check (length(note) <= 500);

create index orders_status_created on orders (status, created_at desc);
