-- An event that no webhook endpoint subscribes to, and that cannot become a receipt, has
-- nothing to be routed to: it is written already routed, and no dispatcher touches it
-- again. (Routing it later would rewrite the whole row, with every index entry, for each
-- order of a sale in a shop that has no endpoints.) An endpoint receives the events
-- written after it exists.

-- Whether any webhook endpoint subscribes to events of this type.
create function event_subscribed(event_type text) returns boolean
language sql stable
as $$
    select exists (select 1 from webhook_endpoints w where event_type = any (w.event_types))
$$;

-- Whether an event of this type and payload may become a receipt: an order placed with an
-- email. (Whether this shop sends mail is the dispatchers' setting, so such an event is
-- always left to them.)
create function event_may_mail(event_type text, payload jsonb) returns boolean
language sql immutable
as $$
    select event_type = 'order.placed' and coalesce(payload ->> 'email', '') <> ''
$$;

-- When an event of this type and payload is routed as it is written: now, unless an
-- endpoint subscribes to its type (`subscribed`, looked up once per statement) or it may
-- become a receipt; then never (null), and the dispatchers route it.
create function event_routed_at(subscribed boolean, event_type text, payload jsonb)
returns timestamptz
language sql stable
as $$
    select case when subscribed or event_may_mail(event_type, payload) then null else now() end
$$;
