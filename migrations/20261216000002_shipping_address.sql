-- Where an order is shipped, as the checkout took it: {name, line1, line2?, city,
-- postal_code?, country} (checked by the app; see orders::address). None for orders placed
-- without one (API clients that ship elsewhere, and every order from before).
alter table orders
  add column shipping_address jsonb
  check (shipping_address is null or jsonb_typeof(shipping_address) = 'object');
