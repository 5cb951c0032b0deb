-- Categories are compared as people read them (`catalog::browse::parse_category`): NFKC
-- normalised, so a composed and a decomposed "Café", or a full-width "Ｄｅｓｋ", are the
-- category "Café" or "Desk"; without invisible formatting characters ("Desk" + U+200B
-- looked like a second "Desk"); and one spelling per category whatever its case, the one
-- already on the shelf. New values are written that way; this brings the stored ones in
-- line: invisible characters out (the common ones: soft hyphen, zero-width spaces and
-- joiners, direction marks and overrides, word joiners, isolates, the byte-order mark),
-- normalised, trimmed, and each group of spellings that differ only in case merged into
-- its first spelling. A category left empty is no category.
update products
   set category = nullif(btrim(normalize(regexp_replace(category,
           '[\u00AD\u061C\u180E\u200B-\u200F\u202A-\u202E\u2060-\u2064\u2066-\u206F\uFEFF]',
           '', 'g'), NFKC)), '')
 where category is not null
   and category is distinct from nullif(btrim(normalize(regexp_replace(category,
           '[\u00AD\u061C\u180E\u200B-\u200F\u202A-\u202E\u2060-\u2064\u2066-\u206F\uFEFF]',
           '', 'g'), NFKC)), '');

update products p
   set category = first.category
  from (select distinct on (lower(category)) lower(category) as folded, category
          from products where category is not null
         order by lower(category), category) first
 where lower(p.category) = first.folded and p.category <> first.category;

-- The spelling a category is written in for product `sku`: another product's, when one
-- already differs from it only in case (every write of a category goes through this:
-- `catalog::db`, `catalog::manage`). The product itself is left out, so the only product
-- on a shelf can still change its case.
create function shelf_category(wanted text, sku text) returns text
language sql stable as $$
    select coalesce((select o.category from products o
                      where lower(o.category) = lower(wanted) and o.sku <> shelf_category.sku
                      order by o.category limit 1), wanted)
$$;
create index products_category_folded on products (lower(category)) where category is not null;
