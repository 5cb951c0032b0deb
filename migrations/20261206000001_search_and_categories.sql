-- Browsing a large catalogue: a category per product and full-text search over the name
-- and description.
--
-- The search vector is a generated column, so it can never disagree with the text it is
-- made from, and a GIN index over it answers `search @@ query` without reading every row.
-- Names weigh more than descriptions (A over B), so a product called "Keyboard" ranks
-- above one that only mentions keyboards. The 'english' configuration stems words
-- ("keyboards" finds "keyboard"); prefixes ("keyb:*") are matched by the query side.
alter table products
    add column category text check (category ~ '^[^[:cntrl:]]{1,40}$'),
    add column search tsvector generated always as (
        setweight(to_tsvector('english', name), 'A')
        || setweight(to_tsvector('english', description), 'B')
    ) stored;

create index products_search on products using gin (search);
-- Listing one category in name or price order.
create index products_category on products (category, name) where active;
