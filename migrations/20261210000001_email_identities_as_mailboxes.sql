-- A shopper's email is counted as the mailbox it reaches (`orders::limits::email_identity`):
-- a `+tag` after the local part is dropped, and at Gmail (gmail.com, googlemail.com) dots
-- go and the domain is gmail.com. Identities stored before that rule are folded the same
-- way here, so an allowance used as `alice+1@x` before the change still counts against
-- `alice@x` after it. The stored identities are already trimmed and lower-cased. The
-- function mirrors the Rust one step by step and is dropped at the end: only this
-- migration needs it.
create function stockade_folded_email(id text) returns text
language sql immutable as $$
    select case
        when id not like 'email:%' or position('@' in id) = 0 then id
        else (
            with parts as (
                select regexp_replace(substr(id, 7), '@[^@]*$', '') as local,
                       substring(substr(id, 7) from '@([^@]*)$') as domain
            ), tagless as (
                -- Up to the first '+', unless nothing comes before it.
                select case when position('+' in local) > 1 then split_part(local, '+', 1)
                            else local end as local,
                       domain
                  from parts
            )
            select case
                when domain in ('gmail.com', 'googlemail.com') then
                    'email:' || case when replace(local, '.', '') = '' then local
                                     else replace(local, '.', '') end || '@gmail.com'
                else 'email:' || local || '@' || domain
            end
              from tagless
        )
    end
$$;

update orders set shopper = array(select stockade_folded_email(s) from unnest(shopper) s)
 where exists (select 1 from unnest(shopper) s
                where s like 'email:%' and s is distinct from stockade_folded_email(s));
update holds set shopper = array(select stockade_folded_email(s) from unnest(shopper) s)
 where exists (select 1 from unnest(shopper) s
                where s like 'email:%' and s is distinct from stockade_folded_email(s));

drop function stockade_folded_email(text);
