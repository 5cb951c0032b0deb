//! A primary that turns into a standby under the app (a failover demoting it): writes
//! meet `read_only_sql_transaction`, which the app answers as "unavailable for now" (503
//! with `Retry-After`), never as a server error, and orders resume once the database
//! takes writes again, without a restart.

use crate::helpers::{serve_app, spawn_app};

/// Sets whether new sessions of the app's database are read-only, and ends the app's
/// sessions so that its pools reconnect under the setting.
async fn read_only(app: &crate::helpers::TestApp, on: bool) {
    let db: String = sqlx::query_scalar("select current_database()")
        .fetch_one(&app.db)
        .await
        .unwrap();
    // Runtime strings: a database name is an identifier, and `set` takes no parameters.
    let set = if on {
        "set default_transaction_read_only = on"
    } else {
        "reset default_transaction_read_only"
    };
    // In a read-write transaction of its own: the test's pool may have reconnected since
    // the database turned read-only, and its sessions then start read-only too.
    let mut tx = app.db.begin().await.unwrap();
    sqlx::query("set transaction read write")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        r#"alter database "{db}" {set}"#
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    sqlx::query(
        "select pg_terminate_backend(pid) from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid()",
    )
    .execute(&app.db)
    .await
    .unwrap();
}

#[tokio::test]
async fn orders_to_a_database_that_turned_read_only_answer_503_and_resume_once_it_takes_writes() {
    let app = spawn_app().await;
    app.add_product("RO-1", "Read-only 1", 1000, 50).await;
    let server = serve_app(&app, &[], &[]).await;
    let client = reqwest::Client::new();
    let order = |key: String| {
        let (client, base) = (client.clone(), server.address.clone());
        async move { crate::helpers::post_order_to(&client, &base, &key, &[("RO-1", 1)]).await }
    };
    assert_eq!(order("before".into()).await.status().as_u16(), 201);

    read_only(&app, true).await;
    // Orders and holds, one at a time and side by side (one lot): each is 503 with
    // Retry-After, whether its connection was cut (the sessions ended) or came back
    // read-only.
    for round in 0..3 {
        let answers =
            futures_util::future::join_all((0..6).map(|i| order(format!("ro-{round}-{i}")))).await;
        for res in answers {
            let status = res.status().as_u16();
            let retry = res.headers().contains_key("retry-after");
            let body = res.text().await.unwrap();
            assert_eq!((status, retry), (503, true), "{body}");
            assert!(
                !body.contains("read-only transaction"),
                "no database text: {body}"
            );
        }
    }
    let hold = client
        .post(format!("{}/api/v1/holds", server.address))
        .header("Idempotency-Key", "ro-hold")
        .json(&serde_json::json!({"lines": [{"sku": "RO-1", "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(hold.status().as_u16(), 503);

    // Writable again (the new primary): orders go on, the same process.
    read_only(&app, false).await;
    let resumed = std::time::Instant::now();
    loop {
        let res = order(format!("after-{}", resumed.elapsed().as_millis())).await;
        if res.status().as_u16() == 201 {
            break;
        }
        assert_eq!(res.status().as_u16(), 503);
        assert!(
            resumed.elapsed() < std::time::Duration::from_secs(10),
            "orders resume"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    app.assert_invariants().await;
}
