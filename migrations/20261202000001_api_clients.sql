-- API clients: who places orders and holds through the API. A client sends its key as
-- `Authorization: Bearer sk_…`; only the key's SHA-256 is stored, so a copy of this table
-- authenticates no one. A revoked client keeps its row: its orders still name it (their
-- idempotency keys start with `<client id>:`).

create table api_clients (
    id                    bigint generated always as identity primary key,
    name                  text not null check (length(name) between 1 and 100),
    key_hash              text not null unique,
    -- the key's first characters, so people can tell keys apart in lists
    key_prefix            text not null,
    -- orders and holds per minute for this client; null: the shop's default
    rate_limit_per_minute integer check (rate_limit_per_minute between 1 and 1000000),
    -- never rate-limited (the load tools' own clients)
    unlimited             boolean not null default false,
    created_at            timestamptz not null default now(),
    revoked_at            timestamptz,
    check (not (unlimited and rate_limit_per_minute is not null))
);
-- A name picks one live client (for `stockade api-key revoke --name`).
create unique index api_clients_live_name on api_clients (name) where revoked_at is null;
