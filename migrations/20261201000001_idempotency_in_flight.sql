-- In-flight idempotency records are purged every second or two once stale; this index
-- holds only those (a handful at any time), so the purge never scans completed keys.
create index idempotency_keys_in_flight on idempotency_keys (locked_at) where state = 'in_flight';
