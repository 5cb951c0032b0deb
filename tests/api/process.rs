//! Tests of the `stockade` binary as users run it.

use std::path::Path;

use crate::helpers::{serve, servers};

fn stockade(env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut cmd = crate::helpers::processes::clean_stockade_command();
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn malformed_or_unknown_settings_stop_startup_with_a_message_naming_the_variable() {
    for (var, value) in [
        ("STOCKADE_LISTEN", "not-an-address"),
        ("STOCKADE_ORDER_STRATEGY", "fastest"),
        ("STOCKADE_DB_POOL_SIZE", "-3"),
        ("REDIS_URL", "localhost:6379"),
        ("STOCKADE_LISTNE", "127.0.0.1:1"),
    ] {
        let out = stockade(&[(var, value)], &["serve"]);
        assert_eq!(out.status.code(), Some(2), "{var}={value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("configuration error"), "{stderr}");
        assert!(stderr.contains(var), "{var}: {stderr}");
    }
}

/// Every PostgreSQL and Redis process whose command line mentions `dir`.
fn processes_using(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmd| cmd.contains(&needle) && (cmd.contains("postgres") || cmd.contains("redis")))
        .collect()
}

#[tokio::test]
async fn local_mode_keeps_its_data_across_a_restart_and_leaves_no_servers_behind() {
    let root = servers().await.fresh_dir("local");
    let data_dir = root.join("data");
    let env = [
        ("STOCKADE_DATA_DIR", data_dir.display().to_string()),
        ("STOCKADE_LISTEN", "127.0.0.1:0".to_string()),
    ];

    let mut first = serve(&env, &[]).await;
    let db_url = first
        .printed("PostgreSQL")
        .expect("local mode prints its database");
    let (status, html) = fetch(&first.address, "/").await;
    assert_eq!(status, 200);
    assert!(
        html.contains("Alpine 75 Keyboard"),
        "demo catalogue seeded on first start"
    );

    let db = sqlx::PgPool::connect(&db_url).await.unwrap();
    sqlx::query!(
        "update products set name = 'Alpine 75 Keyboard, Second Batch' where sku = 'KB-ALPINE-75'"
    )
    .execute(&db)
    .await
    .unwrap();
    db.close().await;

    assert!(first.stop(), "clean exit on SIGTERM");
    assert!(
        processes_using(&data_dir).is_empty(),
        "left behind: {:?}",
        processes_using(&data_dir)
    );

    let mut second = serve(&env, &[]).await;
    let (status, html) = fetch(&second.address, "/").await;
    assert_eq!(status, 200);
    assert!(
        html.contains("Second Batch"),
        "the change survived the restart"
    );
    assert_eq!(
        second.printed("PostgreSQL").as_deref(),
        Some(db_url.as_str()),
        "the same DATABASE_URL as before (its port kept while free)"
    );
    let db = sqlx::PgPool::connect(&db_url).await.unwrap();
    let products = sqlx::query_scalar!(r#"select count(*) as "count!" from products"#)
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(
        products as usize,
        stockade::seed::DEMO_CATALOGUE.len(),
        "not seeded twice"
    );
    db.close().await;
    assert!(second.stop());
    assert!(processes_using(&data_dir).is_empty());
}

async fn fetch(base: &str, path: &str) -> (u16, String) {
    let res = reqwest::get(format!("{base}{path}")).await.unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}
