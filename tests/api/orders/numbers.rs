//! Order numbers: one per order, never repeated, whichever process places it and however
//! many orders share a millisecond.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::future::join_all;

use crate::helpers::{post_lines, post_order_to, serve_app, spawn_app};

#[tokio::test]
async fn orders_placed_at_once_by_two_processes_many_in_one_millisecond_get_different_numbers() {
    let app = spawn_app().await;
    // One SKU per process: orders of one SKU take turns under its lease, while two SKUs'
    // batches run side by side, as two processes' orders of different products do.
    const SKUS: [&str; 2] = ["NUM-1", "NUM-2"];
    app.add_product(SKUS[0], "Numbered thing", 1_000, 100_000)
        .await;
    app.add_product(SKUS[1], "Other numbered thing", 1_000, 100_000)
        .await;
    let servers = [
        serve_app(&app, &[], &[]).await,
        serve_app(&app, &[], &[]).await,
    ];
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(200)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    // Each process warm (its pool's connections open, its statements prepared) before the
    // burst, so that neither spends the burst starting up while the other serves it all.
    for (n, server) in servers.iter().enumerate() {
        let res = post_order_to(
            &client,
            &server.address,
            &format!("warm-{n}"),
            &[(SKUS[n], 1)],
        )
        .await;
        assert_eq!(res.status().as_u16(), 201);
    }
    // (number, process, when it was placed) of every order answered: orders and holds
    // confirmed into orders (the confirmation lots' path), all at once on both processes.
    let mut placed: Vec<(i64, usize, chrono::DateTime<chrono::Utc>)> = Vec::new();
    let orders = join_all((0..160).map(|i| {
        let (client, base) = (client.clone(), servers[i % 2].address.clone());
        async move {
            let res = post_order_to(&client, &base, &format!("n-{i}"), &[(SKUS[i % 2], 1)]).await;
            assert_eq!(res.status().as_u16(), 201);
            (i % 2, res.json::<serde_json::Value>().await.unwrap())
        }
    }));
    let holds = join_all((0..40).map(|i| {
        let (client, base) = (client.clone(), servers[i % 2].address.clone());
        async move {
            let url = format!("{base}/api/v1/holds");
            let res = post_lines(&client, &url, &format!("h-{i}"), &[(SKUS[i % 2], 1)]).await;
            assert_eq!(res.status().as_u16(), 201);
            let hold: serde_json::Value = res.json().await.unwrap();
            let res = client
                .post(format!(
                    "{base}/api/v1/holds/{}/confirm",
                    hold["id"].as_str().unwrap()
                ))
                .json(&serde_json::json!({}))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status().as_u16(), 201);
            (i % 2, res.json::<serde_json::Value>().await.unwrap())
        }
    }));
    let (orders, holds) = tokio::join!(orders, holds);
    for (process, order) in orders.into_iter().chain(holds) {
        let number = order["number"]
            .as_i64()
            .expect("every order answer has its number");
        let at = order["created_at"].as_str().unwrap().parse().unwrap();
        placed.push((number, process, at));
    }
    // Many orders shared a millisecond (a batch's orders are placed at one moment). Both
    // processes were sent their orders at once; whether they placed them over the same
    // stretch of time, or one millisecond held orders of both, is up to the scheduler (a
    // loaded machine once ran one process's burst wholly before the other's), so it is
    // counted, not required.
    let mut by_millisecond: BTreeMap<i64, BTreeSet<usize>> = BTreeMap::new();
    let mut in_millisecond: BTreeMap<i64, usize> = BTreeMap::new();
    for (_, process, at) in &placed {
        by_millisecond
            .entry(at.timestamp_millis())
            .or_default()
            .insert(*process);
        *in_millisecond.entry(at.timestamp_millis()).or_default() += 1;
    }
    let crowded = in_millisecond.values().max().copied().unwrap_or(0);
    assert!(
        crowded >= 2,
        "no millisecond held two orders: {in_millisecond:?}"
    );
    let span = |process: usize| {
        let times = placed.iter().filter(|p| p.1 == process).map(|p| p.2);
        (times.clone().min().unwrap(), times.max().unwrap())
    };
    let (a, b) = (span(0), span(1));
    assert_eq!(
        placed.iter().filter(|p| p.1 == 0).count(),
        100,
        "each process placed its half"
    );
    println!(
        "{} orders; at most {crowded} in one millisecond; the processes placed theirs over \
         {a:?} and {b:?} (overlapping: {}); {} milliseconds held orders of both",
        placed.len(),
        a.0 <= b.1 && b.0 <= a.1,
        by_millisecond.values().filter(|p| p.len() == 2).count()
    );
    let numbers: BTreeSet<i64> = placed.iter().map(|(n, _, _)| *n).collect();
    assert_eq!(
        numbers.len(),
        placed.len(),
        "two orders answered with one number"
    );
    // The database agrees, with its own guard (the two warm-up orders too).
    let distinct = app.count("select count(distinct number) from orders").await;
    let all = app.count("select count(*) from orders").await;
    let made = placed.len() as i64 + 2;
    assert_eq!((distinct, all), (made, made));
    let constraint = app
        .count("select count(*) from pg_constraint where conname = 'orders_number_key' and contype = 'u'")
        .await;
    assert_eq!(
        constraint, 1,
        "the database refuses a repeated number itself"
    );
    // Numbers a person reads start at 1001.
    assert!(numbers.first().is_some_and(|n| *n >= 1001));
    // The order's page shows the number, and the admin finds the order by it.
    let (number, _, _) = &placed[0];
    let id: uuid::Uuid = sqlx::query_scalar("select id from orders where number = $1")
        .bind(number)
        .fetch_one(&app.db)
        .await
        .unwrap();
    let (status, page) = app.get_text(&format!("/orders/{id}")).await;
    assert_eq!(status, 200);
    assert!(page.contains(&format!("Order #{number}")), "{page}");
    app.login_admin().await;
    let (status, list) = app.get_text(&format!("/admin/orders?q=%23{number}")).await;
    assert_eq!(status, 200);
    assert!(list.contains(&format!(">#{number}</a>")), "{list}");
    let rows = list.matches("<a href=\"/admin/orders/").count();
    assert_eq!(rows, 1, "one order found: {list}");
    assert!(
        list.contains("Numbered thing (NUM-1)"),
        "the product by name: {list}"
    );
}
