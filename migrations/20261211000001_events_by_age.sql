-- The retention purge (`events::db::purge`) takes the oldest events past the window, a
-- thousand at a time: by this index it reads only those, not every event kept. Events are
-- written in time order, so each insert lands on the index's last page.
create index events_created_at on events (created_at);
