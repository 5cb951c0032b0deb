-- `stockade check --quick`: the invariants checked incrementally, cheap enough for every
-- minute on a live shop, and the verdicts of every check for the dashboard.

-- Per SKU: the stock ledger summed through `ledger_cursor.through_id`.
create table ledger_checkpoints (
    sku text primary key,
    on_hand bigint not null,
    reserved bigint not null,
    sold bigint not null,
    supplied bigint not null
);

-- One row: how far the checkpoints reach, and the ledger position the next quick check may
-- move them to once every transaction that was running when it was noted has ended
-- (`pending_xmax`: the xmax of that check's snapshot).
create table ledger_cursor (
    only_row boolean primary key default true check (only_row),
    through_id bigint not null default 0,
    pending_id bigint,
    pending_xmax xid8,
    -- Where the last quick check's look at recent orders started.
    orders_from timestamptz
);
insert into ledger_cursor default values;

create table check_runs (
    id bigint generated always as identity primary key,
    kind text not null check (kind in ('quick', 'full')),
    started_at timestamptz not null,
    finished_at timestamptz not null default clock_timestamp(),
    passed boolean not null,
    -- [{id, name, pass, rows, violations}], as `stockade check` prints them.
    verdicts jsonb not null,
    -- What it looked at, in words ("1,204 ledger rows and 300 orders since the last check").
    covered text not null check (length(covered) <= 500)
);
create index check_runs_by_age on check_runs (finished_at);
