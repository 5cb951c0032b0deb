-- Order numbers a person can read aloud (#1001, #1002 …), one per order, never repeated:
-- drawn from one sequence, so two processes placing orders in the same millisecond still
-- get two numbers. A number drawn by a transaction that rolled back is not used again (a
-- gap, never a repeat). Orders placed before numbers existed get theirs in the order they
-- were placed.
create sequence order_numbers start with 1001;

alter table orders add column number bigint;

update orders o
   set number = n.number
  from (select id, 1000 + row_number() over (order by created_at, id) as number
          from orders) n
 where o.id = n.id;

select setval('order_numbers', coalesce((select max(number) from orders), 1000) + 1, false);

alter table orders
  alter column number set default nextval('order_numbers'),
  alter column number set not null,
  add constraint orders_number_key unique (number);

alter sequence order_numbers owned by orders.number;
