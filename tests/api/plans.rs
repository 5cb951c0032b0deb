//! A statement PostgreSQL keeps prepared is planned once for all values after a few runs.
//! Planned while a table was empty, a join against it reads the whole table ever after,
//! and the tables a sale writes grow by the thousand every second. The set-based lookups
//! on those tables are planned afresh on each run; this proves it on the busiest one.

use sqlx::{Connection, PgConnection};

use crate::helpers::fresh_database;

/// Sequential scans of `idempotency_keys`, index scans of it, and index entries those
/// read, so far, as the statistics say.
async fn scans(conn: &mut PgConnection) -> (i64, i64, i64) {
    // A session hands its counts over when it goes idle, at most once a second unless told.
    sqlx::query("select pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_as(
        "select t.seq_scan, coalesce(t.idx_scan, 0), i.idx_tup_read
           from pg_stat_user_tables t
           join pg_stat_user_indexes i
             on i.relid = t.relid and i.indexrelname = 'idempotency_keys_pkey'
          where t.relname = 'idempotency_keys'",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// The lookups under test, run the way a batch runs them: on one connection, again and
/// again. `batch_read` is the batch's one read, which finds its keys the same way.
async fn present(conn: &mut PgConnection, keys: &[(&str, &str)], batch_read: bool) -> Vec<bool> {
    if !batch_read {
        return stockade::idempotency::present(&mut *conn, keys)
            .await
            .unwrap();
    }
    let asked = stockade::checkout::batch::db::Asked {
        skus: vec!["PLAN-1"],
        scopes: keys.iter().map(|(s, _)| *s).collect(),
        keys: keys.iter().map(|(_, k)| *k).collect(),
        orders: 0,
    };
    let rows = asked.read(&mut *conn).await.unwrap();
    let recorded = &rows[0].recorded;
    (1..=keys.len() as i64)
        .map(|i| recorded.contains(&i))
        .collect()
}

#[tokio::test]
async fn a_batch_of_keys_is_looked_up_by_the_index_however_much_the_table_grew() {
    for batch_read in [false, true] {
        keys_are_looked_up_by_the_index(batch_read).await;
    }
}

async fn keys_are_looked_up_by_the_index(batch_read: bool) {
    let mut conn = PgConnection::connect(&fresh_database().await)
        .await
        .unwrap();
    // Whether PostgreSQL keeps a generic plan depends on its cost estimates; here it must.
    sqlx::raw_sql(
        "set plan_cache_mode = force_generic_plan;
         insert into products (sku, name, price_cents) values ('PLAN-1', 'Plan', 100);
         insert into stock (sku, on_hand) values ('PLAN-1', 5);",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let keys = [("anon", "first"), ("anon", "second")];
    // Runs enough for PostgreSQL to settle on a plan it keeps, while the table is empty.
    for _ in 0..10 {
        assert_eq!(present(&mut conn, &keys, batch_read).await, [false, false]);
    }
    // A sale's worth of keys later (and no ANALYZE yet, as during a sale)...
    sqlx::query(
        "insert into idempotency_keys
                (scope, key, fingerprint, state, owner, response_status, response_body,
                 completed_at)
         select 'anon', 'key-' || n, 'f', 'completed', gen_random_uuid(), 409, '{}', now()
           from generate_series(1, 20000) as n",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let (seq_before, idx_before, read_before) = scans(&mut conn).await;
    let found = present(
        &mut conn,
        &[("anon", "key-7"), ("anon", "nope"), ("anon", "key-20000")],
        batch_read,
    )
    .await;
    assert_eq!(found, [true, false, true]);
    let (seq_after, idx_after, read_after) = scans(&mut conn).await;
    let which = if batch_read {
        "the batch's read"
    } else {
        "the lookup"
    };
    assert_eq!(seq_after, seq_before, "{which} read the whole table");
    assert!(idx_after > idx_before, "{which} did not use the index");
    // Two of the three keys are there: a probe per key reads about that many entries; a
    // scan of every key of the scope reads all 20,000.
    let read = read_after - read_before;
    assert!(read <= 10, "{which} read {read} index entries for 3 keys");
}
