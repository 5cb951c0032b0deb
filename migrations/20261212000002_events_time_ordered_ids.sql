-- Events get time-ordered ids (UUIDv7: 48 bits of milliseconds, then random bits with the
-- version and variant set), as orders and holds do (`orders::new_id`): each insert lands on
-- the primary key's last page instead of a random page of an index as big as the outbox.
create function uuid_v7() returns uuid
language sql volatile parallel safe as $$
    select encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    placing substring(int8send(floor(extract(epoch from clock_timestamp()) * 1000)::bigint) from 3)
                    from 1 for 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

alter table events alter column id set default uuid_v7();
