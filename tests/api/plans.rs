//! A statement PostgreSQL keeps prepared is planned once for all values after a few runs.
//! Planned while a table was empty, a join against it reads the whole table ever after,
//! and the tables a sale writes grow by the thousand every second. The set-based lookups
//! on those tables are planned afresh on each run; this proves it on the busiest one.

use sqlx::{Connection, PgConnection};

use crate::helpers::fresh_database;

/// Sequential and index scans of `idempotency_keys` so far, as the statistics say.
async fn scans(conn: &mut PgConnection) -> (i64, i64) {
    // A session hands its counts over when it goes idle, at most once a second unless told.
    sqlx::query("select pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_as(
        "select seq_scan, coalesce(idx_scan, 0) from pg_stat_user_tables
          where relname = 'idempotency_keys'",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// The lookup under test, run the way a batch runs it: on one connection, again and again.
async fn present(conn: &mut PgConnection, keys: &[(&str, &str)]) -> Vec<bool> {
    stockade::idempotency::present(&mut *conn, keys)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_batch_of_keys_is_looked_up_by_the_index_however_much_the_table_grew() {
    let mut conn = PgConnection::connect(&fresh_database().await)
        .await
        .unwrap();
    let keys = [("anon", "first"), ("anon", "second")];
    // Runs enough for PostgreSQL to settle on a plan it keeps, while the table is empty.
    for _ in 0..10 {
        assert_eq!(present(&mut conn, &keys).await, [false, false]);
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
    let (seq_before, idx_before) = scans(&mut conn).await;
    let found = present(
        &mut conn,
        &[("anon", "key-7"), ("anon", "nope"), ("anon", "key-20000")],
    )
    .await;
    assert_eq!(found, [true, false, true]);
    let (seq_after, idx_after) = scans(&mut conn).await;
    assert_eq!(seq_after, seq_before, "the lookup read the whole table");
    assert!(idx_after > idx_before, "the lookup did not use the index");
}
