-- The shopper indexes take each new entry into their trees at once, instead of into a
-- pending list. With a pending list, an insert is cheap until the list passes its limit
-- (4 MB); then the insert that passed it moves the whole list into the tree, reading and
-- rewriting hundreds of pages while its transaction waits. In a sale that is one order
-- batch in every few thousand orders stalling for tens of milliseconds, and every order
-- queued behind it waiting as long. Without the list every insert pays a little more, and
-- none pays for the others.
alter index orders_shopper set (fastupdate = off);
alter index holds_shopper set (fastupdate = off);

-- Whatever is pending already goes into the trees now (the setting keeps new entries out
-- of the list; it does not empty it).
select gin_clean_pending_list('orders_shopper'::regclass);
select gin_clean_pending_list('holds_shopper'::regclass);
