//! Carts (orders and holds of several SKUs) under group commit: each is taken all or
//! nothing, beside single-SKU orders of the same SKUs, across processes.

use futures_util::future::join_all;

use crate::helpers::{post_lines, serve_app, spawn_app};

#[tokio::test]
async fn carts_sharing_a_hot_sku_are_placed_all_or_nothing_across_two_processes() {
    let app = spawn_app().await;
    app.add_product("CART-HOT", "The drop", 5_000, 20).await;
    for i in 0..4 {
        app.add_product(&format!("CART-W{i}"), "A side", 500, 100)
            .await;
    }
    let servers = [
        serve_app(&app, &[], &[]).await,
        serve_app(&app, &[], &[]).await,
    ];
    stockade::install_tls_provider();
    let client = reqwest::Client::new();
    // Sixty requests at once: carts of the hot SKU and a side, orders of the hot SKU
    // alone, and holds of both, through either process.
    let answers = join_all((0..60).map(|i| {
        let (client, base) = (client.clone(), servers[i % 2].address.clone());
        async move {
            let side = format!("CART-W{}", i % 4);
            let (path, lines) = match i % 3 {
                0 => ("orders", vec![("CART-HOT", 1), (side.as_str(), 2)]),
                1 => ("orders", vec![("CART-HOT", 1)]),
                _ => ("holds", vec![("CART-HOT", 1), (side.as_str(), 1)]),
            };
            let url = format!("{base}/api/v1/{path}");
            let res = post_lines(&client, &url, &format!("cart-{i}"), &lines).await;
            let status = res.status().as_u16();
            let body: serde_json::Value = res.json().await.unwrap();
            (i, status, body)
        }
    }))
    .await;
    let placed: Vec<&(usize, u16, serde_json::Value)> =
        answers.iter().filter(|(_, s, _)| *s == 201).collect();
    assert_eq!(placed.len(), 20, "twenty units of the drop: {answers:?}");
    for (i, status, body) in &answers {
        match status {
            201 => {
                let lines = body["lines"].as_array().unwrap();
                let expected = if i % 3 == 1 { 1 } else { 2 };
                assert_eq!(lines.len(), expected, "request {i}: {body}");
            }
            409 => {
                // Refused whole, naming the drop; the side is never short.
                let short = body["shortages"].as_array().unwrap();
                assert_eq!(short.len(), 1, "request {i}: {body}");
                assert_eq!(short[0]["sku"], "CART-HOT", "request {i}: {body}");
            }
            other => panic!("request {i} answered {other}: {body}"),
        }
    }
    // Each side lost exactly what the placed carts and holds took of it.
    for w in 0..4 {
        let sku = format!("CART-W{w}");
        let (mut sold, mut held) = (0, 0);
        for (i, _, _) in placed.iter().filter(|(i, _, _)| i % 4 == w) {
            match i % 3 {
                0 => sold += 2,
                2 => held += 1,
                _ => {}
            }
        }
        assert_eq!(app.stock(&sku).await, (100 - sold, held), "{sku}");
    }
    let orders = placed.iter().filter(|(i, _, _)| i % 3 != 2).count() as i64;
    let holds = 20 - orders;
    assert_eq!(app.count("select count(*) from orders").await, orders);
    assert_eq!(
        app.count("select count(*) from holds where state = 'active'")
            .await,
        holds
    );
    assert_eq!(
        app.stock("CART-HOT").await,
        (20 - orders as i32, holds as i32)
    );
    assert_eq!(
        app.count("select count(*) from events where type = 'hold.placed'")
            .await,
        holds
    );
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_cart_with_one_short_line_takes_nothing_of_the_others() {
    let app = spawn_app().await;
    app.add_product("CART-A", "Plenty", 1_000, 10).await;
    app.add_product("CART-B", "Scarce", 1_000, 1).await;
    let res = app
        .post_order("short-cart", &[("CART-A", 3), ("CART-B", 2)])
        .await;
    assert_eq!(res.status().as_u16(), 409);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["shortages"][0]["sku"], "CART-B", "{body}");
    assert_eq!(body["shortages"][0]["available"], 1, "{body}");
    assert_eq!(app.stock("CART-A").await, (10, 0));
    assert_eq!(app.stock("CART-B").await, (1, 0));
    // Replayed with the same key: the same answer.
    let again = app
        .post_order("short-cart", &[("CART-A", 3), ("CART-B", 2)])
        .await;
    assert_eq!(again.status().as_u16(), 409);
    let res = app
        .post_order("fits", &[("CART-A", 3), ("CART-B", 1)])
        .await;
    assert_eq!(res.status().as_u16(), 201);
    assert_eq!(app.stock("CART-A").await, (7, 0));
    assert_eq!(app.stock("CART-B").await, (0, 0));
    app.assert_invariants().await;
}
