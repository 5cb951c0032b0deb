-- One order of one unit, written as the app writes it, in one transaction.
\set k random(1, 9000000000000000000)

begin;
insert into idempotency_keys (scope, key, fingerprint, state, owner)
     values ('api', 'pgbench-' || :client_id::text || '-' || :k::text, 'pgbench', 'in_flight', gen_random_uuid())
     on conflict (scope, key) do nothing;
update stock set on_hand = on_hand - 1, updated_at = now()
 where sku = 'BENCH-HOT' and on_hand - reserved >= 1;
insert into stock_movements (sku, delta, reason, reference, actor)
     values ('BENCH-HOT', -1, 'order', md5('pgbench-' || :client_id::text || '-' || :k::text), 'pgbench');
insert into orders (id, total_cents, idempotency_scope, idempotency_key)
     values (md5('pgbench-' || :client_id::text || '-' || :k::text)::uuid, 1000, 'api',
             'pgbench-' || :client_id::text || '-' || :k::text);
insert into order_lines (order_id, sku, quantity, unit_price_cents)
     values (md5('pgbench-' || :client_id::text || '-' || :k::text)::uuid, 'BENCH-HOT', 1, 1000);
update idempotency_keys
   set state = 'completed', response_status = 201, response_body = '{}', completed_at = now()
 where scope = 'api' and key = 'pgbench-' || :client_id::text || '-' || :k::text and state = 'in_flight';
commit;
