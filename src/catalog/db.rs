//! Catalogue queries. Availability is always `on_hand − reserved`. Every read takes the
//! pool it reads from, so the storefront's reads can move to a replica.

use sqlx::PgPool;

use super::browse::{Browse, Search, Sort};
use super::{ProductView, Sku};

/// A page of active products and how many match in all.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub products: Vec<ProductView>,
    pub total: i64,
}

#[derive(sqlx::FromRow)]
struct ListedRow {
    #[sqlx(flatten)]
    view: ProductView,
    total: i64,
}

/// One page of a search, a category or the whole catalogue, in `browse`'s order.
///
/// A search reads the GIN index on `products.search` (the query text is a prefix tsquery
/// made of letters and digits only: [`Browse::tsquery`]); one statement per order keeps
/// each one a plain literal that PostgreSQL plans well.
#[tracing::instrument(skip_all, fields(sort = browse.sort.as_str(), page = browse.page))]
pub async fn browse(pool: &PgPool, browse: &Browse, per_page: i64) -> sqlx::Result<Listing> {
    macro_rules! listing {
        ($order:literal) => {
            concat!(
                "select p.sku, p.name, p.description, p.price_cents, p.purchase_limit, ",
                "p.category, i.image_etag as image, coalesce(s.on_hand - s.reserved, 0) as available, ",
                "count(*) over () as total ",
                "from products p left join stock s on s.sku = p.sku ",
                "left join product_images i on i.sku = p.sku ",
                "where p.active and ($1::text is null or p.category = $1) ",
                "order by ",
                $order,
                " limit $2 offset $3"
            )
        };
    }
    macro_rules! searched {
        ($order:literal) => {
            concat!(
                "select p.sku, p.name, p.description, p.price_cents, p.purchase_limit, ",
                "p.category, i.image_etag as image, coalesce(s.on_hand - s.reserved, 0) as available, ",
                "count(*) over () as total ",
                "from products p left join stock s on s.sku = p.sku ",
            "left join product_images i on i.sku = p.sku ",
                // In the WHERE clause, not a FROM item: the planner folds it to a constant
                // and can read the GIN index.
                "where p.active and p.search @@ to_tsquery('english', $4) ",
                "and ($1::text is null or p.category = $1) ",
                "order by ",
                $order,
                " limit $2 offset $3"
            )
        };
    }
    let tsquery = match browse.search() {
        // Nothing to search for finds nothing, without asking the database.
        Search::Nothing => return Ok(Listing::default()),
        Search::Everything => None,
        Search::Terms(terms) => Some(terms),
    };
    let sql = match (tsquery.is_some(), browse.effective_sort()) {
        (false, Sort::Relevance | Sort::Name) => listing!("p.name, p.sku"),
        (false, Sort::PriceLow) => listing!("p.price_cents, p.name, p.sku"),
        (false, Sort::PriceHigh) => listing!("p.price_cents desc, p.name, p.sku"),
        (false, Sort::Newest) => listing!("p.created_at desc, p.sku"),
        (true, Sort::Relevance) => {
            searched!("ts_rank(p.search, to_tsquery('english', $4)) desc, p.name, p.sku")
        }
        (true, Sort::Name) => searched!("p.name, p.sku"),
        (true, Sort::PriceLow) => searched!("p.price_cents, p.name, p.sku"),
        (true, Sort::PriceHigh) => searched!("p.price_cents desc, p.name, p.sku"),
        (true, Sort::Newest) => searched!("p.created_at desc, p.sku"),
    };
    // Runtime-checked: the statement is chosen from nine by the sort and the search, and
    // binds a fourth parameter only when searching.
    let mut query = sqlx::query_as::<_, ListedRow>(sql)
        .bind(browse.category.as_deref())
        .bind(per_page)
        .bind((browse.page - 1) * per_page);
    if let Some(tsquery) = &tsquery {
        query = query.bind(tsquery);
    }
    let rows = query.fetch_all(pool).await?;
    let total = match rows.first() {
        Some(row) => row.total,
        // Past the last page the window has no row to count on.
        None if browse.page > 1 => {
            let first = Browse {
                page: 1,
                ..browse.clone()
            };
            Box::pin(self::browse(pool, &first, 1)).await?.total
        }
        None => 0,
    };
    Ok(Listing {
        products: rows.into_iter().map(|r| r.view).collect(),
        total,
    })
}

/// The categories with something on sale, by name, with how many products each has —
/// of those `search` finds, so that beside a search each count is what choosing that
/// category would show (0 for a category the search finds nothing in, which stays listed
/// so the category menu keeps every choice).
#[tracing::instrument(skip_all)]
pub async fn categories(pool: &PgPool, search: &Search) -> sqlx::Result<Vec<(String, i64)>> {
    let rows = sqlx::query!(
        r#"select category as "category!", count(*) as "products!" from products
            where active and category is not null
            group by category order by category"#,
    )
    .fetch_all(pool)
    .await?;
    let all = rows.into_iter().map(|r| (r.category, r.products));
    let found: Vec<(String, i64)> = match search {
        Search::Everything => return Ok(all.collect()),
        Search::Nothing => Vec::new(),
        // The matches by category, read through the search index like the listing.
        Search::Terms(terms) => sqlx::query!(
            r#"select category as "category!", count(*) as "products!" from products
                where active and category is not null
                  and search @@ to_tsquery('english', $1)
                group by category"#,
            terms,
        )
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|r| (r.category, r.products))
        .collect(),
    };
    Ok(all
        .map(|(category, _)| {
            let n = found
                .iter()
                .find(|(c, _)| *c == category)
                .map_or(0, |f| f.1);
            (category, n)
        })
        .collect())
}

/// Sets (or with `None` removes) `sku`'s category; false when there is no such product.
/// A category already on the shelf in another case keeps its spelling ("desk" joins
/// "Desk": the database's `shelf_category`), so spellings that differ only in case never
/// make two categories.
#[tracing::instrument(skip_all)]
pub async fn set_category(
    db: impl sqlx::PgExecutor<'_>,
    sku: &Sku,
    category: Option<&str>,
) -> sqlx::Result<bool> {
    let updated = sqlx::query!(
        "update products set category = shelf_category($2, $1) where sku = $1",
        sku.as_str(),
        category,
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(updated == 1)
}

/// One active product, or `None`.
#[tracing::instrument(skip_all, fields(sku = %sku))]
pub async fn find_product(pool: &PgPool, sku: &Sku) -> sqlx::Result<Option<ProductView>> {
    sqlx::query_as!(
        ProductView,
        r#"select p.sku as "sku: Sku", p.name, p.description, p.price_cents, p.purchase_limit,
                  p.category, i.image_etag as "image?",
                  coalesce(s.on_hand - s.reserved, 0) as "available!"
             from products p left join stock s on s.sku = p.sku
             left join product_images i on i.sku = p.sku
            where p.active and p.sku = $1"#,
        sku.as_str(),
    )
    .fetch_optional(pool)
    .await
}

/// Sets (or with `None` removes) `sku`'s purchase limit; false when there is no such product.
#[tracing::instrument(skip_all)]
pub async fn set_purchase_limit(
    db: impl sqlx::PgExecutor<'_>,
    sku: &Sku,
    limit: Option<i32>,
) -> sqlx::Result<bool> {
    let updated = sqlx::query!(
        "update products set purchase_limit = $2 where sku = $1",
        sku.as_str(),
        limit,
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(updated == 1)
}

/// A product to add, with no stock yet (its stock row is [`crate::inventory`]'s).
pub struct NewProduct<'a> {
    pub sku: &'a Sku,
    pub name: &'a str,
    pub description: &'a str,
    pub price_cents: i64,
    pub purchase_limit: Option<i32>,
    pub category: Option<&'a str>,
}

/// Adds `product` unless one with its SKU exists; whether it was added.
#[tracing::instrument(skip_all, fields(sku = %product.sku))]
pub async fn insert_product_if_new(
    db: impl sqlx::PgExecutor<'_>,
    product: &NewProduct<'_>,
) -> sqlx::Result<bool> {
    let inserted = sqlx::query!(
        r#"insert into products (sku, name, description, price_cents, purchase_limit, category)
           values ($1, $2, $3, $4, $5, shelf_category($6, $1))
           on conflict (sku) do nothing"#,
        product.sku.as_str(),
        product.name,
        product.description,
        product.price_cents,
        product.purchase_limit,
        product.category,
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

/// Whether `sku` has a picture.
#[tracing::instrument(skip_all, fields(sku = %sku))]
pub async fn has_picture(db: impl sqlx::PgExecutor<'_>, sku: &Sku) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select exists (select 1 from product_images where sku = $1) as "exists!""#,
        sku.as_str(),
    )
    .fetch_one(db)
    .await
}
