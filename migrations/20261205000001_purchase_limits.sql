-- Purchase limits per shopper. A product may say "at most N per customer"; every order and
-- hold records who placed it as a set of identities (the API client, the browser, the
-- email, the client address), and a new order or hold for a limited product is refused
-- when the units already bought or held under any of its identities would pass the limit.
alter table products add column purchase_limit integer check (purchase_limit > 0);

alter table orders add column shopper text[] not null default '{}';
alter table holds add column shopper text[] not null default '{}';

-- Only rows with identities are ever counted; the rest cost the index nothing.
create index orders_shopper on orders using gin (shopper) where shopper <> '{}';
create index holds_shopper on holds using gin (shopper) where shopper <> '{}';
