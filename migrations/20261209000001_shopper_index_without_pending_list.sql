-- The shopper indexes take each new entry into their trees at once, instead of into a
-- pending list. With a pending list, an insert is cheap until the list passes its limit
-- (4 MB); then the insert that passed it moves the whole list into the tree, reading and
-- rewriting hundreds of pages while its transaction waits. In a sale that is one order
-- batch in every few thousand orders stalling for tens of milliseconds, and every order
-- queued behind it waiting as long. Without the list every insert pays a little more, and
-- none pays for the others.

-- What is pending goes into the trees first, under a lock that lets inserts go on. Then the
-- setting changes, which locks the index until this migration commits (with little left to
-- do by then), and keeps new entries out of the list; it does not empty the list, so what
-- came in between is moved by the second call.
select gin_clean_pending_list('orders_shopper'::regclass);
select gin_clean_pending_list('holds_shopper'::regclass);
alter index orders_shopper set (fastupdate = off);
alter index holds_shopper set (fastupdate = off);
select gin_clean_pending_list('orders_shopper'::regclass);
select gin_clean_pending_list('holds_shopper'::regclass);
