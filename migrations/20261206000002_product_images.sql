-- One picture per product, stored in PostgreSQL beside the product: every app instance
-- serves it without a shared disk, it is backed up and replicated with the catalogue, and
-- an upload replaces it in one transaction. The bytes are what the app re-encoded (never
-- the upload as sent), a full-size picture and a thumbnail, each with its content hash as
-- the HTTP ETag.
create table product_images (
    sku          text primary key references products (sku) on delete cascade,
    image        bytea not null,
    image_etag   text not null,
    thumb        bytea not null,
    thumb_etag   text not null,
    content_type text not null check (content_type in ('image/jpeg', 'image/png', 'image/webp')),
    width        integer not null check (width > 0),
    height       integer not null check (height > 0),
    updated_at   timestamptz not null default now(),
    updated_by   text not null
);
