-- What the retention purge reads: released and expired holds, oldest state change first.
-- Confirmed holds stay with their orders (they tie an order to the API client that held
-- it); active ones are the sweeper's.
create index holds_finished_by_age on holds (updated_at) where state in ('released', 'expired');
