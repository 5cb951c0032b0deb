//! What a drop's product refuses without a pass, and whose a pass and a place are.

use super::*;

#[tokio::test]
async fn a_drops_product_refuses_holds_and_orders_without_a_valid_pass_and_sells_with_one() {
    let app = spawn_app().await;
    app.add_product("DROP-A", "Drop A", 1000, 20).await;
    app.add_product("PLAIN-A", "Plain A", 1000, 20).await;
    let drop = schedule(
        &app,
        "DROP-A",
        Duration::from_secs(6),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let (ada_id, ada_key) = client(&app, false).await;
    let ada = Buyer {
        key: ada_key,
        shopper: None,
    };
    let bob = Buyer {
        key: key(&app, false).await,
        shopper: None,
    };
    let base = &app.address;

    // Bound: no hold or order of the drop's product without a pass; other products sell.
    for what in ["orders", "holds"] {
        let (status, body) = ada.place(base, what, "DROP-A", None).await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["queue"], format!("/api/v1/drops/{}/queue", drop.id));
        assert!(
            body["detail"].as_str().unwrap().contains("sold in a drop"),
            "{body}"
        );
    }
    assert_eq!(ada.place(base, "orders", "PLAIN-A", None).await.0, 201);
    // A cart with both products is refused whole.
    let cart = ada
        .request(helpers_client().post(format!("{base}/api/v1/orders")))
        .header("Idempotency-Key", Uuid::new_v4().to_string())
        .json(&serde_json::json!({"lines": [{"sku": "PLAIN-A", "quantity": 1}, {"sku": "DROP-A", "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(cart.status(), 403);

    // Joining (in the pre-queue) gives a ticket; joining again, the same one.
    let (status, joined) = ada.join(base, drop.id).await;
    assert_eq!(status, 201, "{joined}");
    assert_eq!(joined["state"], "waiting");
    assert_eq!(joined["position"], 1);
    let ticket = joined["ticket"].as_str().unwrap().to_string();
    assert_eq!(ada.join(base, drop.id).await.1["ticket"], ticket.as_str());
    // Bob cannot read Ada's ticket.
    assert_eq!(bob.poll(base, drop.id, &ticket).await.0, 404);

    let pass = ada
        .wait_for_pass(base, drop.id, &ticket, Duration::from_secs(10))
        .await;
    // Another client's request with Ada's pass, a forged pass, a pass for another drop:
    // refused, and nothing changes.
    let before = app.stock("DROP-A").await;
    assert_eq!(
        bob.place(base, "orders", "DROP-A", Some(&pass)).await.0,
        403
    );
    // (Its last hex digit changed: to 1 if it was 0, else to 0.)
    let last = if pass.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{last}", &pass[..pass.len() - 1]);
    assert_eq!(
        ada.place(base, "orders", "DROP-A", Some(&forged)).await.0,
        403
    );
    // A pass signed with the drop's own key but expired (the test reads the key).
    let expired = drops::pass::sign(
        &drop.secret,
        drop.id,
        Uuid::parse_str(&ticket).unwrap(),
        Utc::now() - chrono::Duration::seconds(1),
        &ada_id.to_string(),
    );
    let (status, body) = ada.place(base, "orders", "DROP-A", Some(&expired)).await;
    assert_eq!(status, 403);
    assert!(
        body["detail"].as_str().unwrap().contains("expired"),
        "{body}"
    );
    assert_eq!(app.stock("DROP-A").await, before);

    // With the pass: an order and a hold.
    let (status, order) = ada.place(base, "orders", "DROP-A", Some(&pass)).await;
    assert_eq!(status, 201, "{order}");
    assert_eq!(ada.place(base, "holds", "DROP-A", Some(&pass)).await.0, 201);
    assert_eq!(app.stock("DROP-A").await, (19, 1));

    let admitted = app.count("select count(*) from drop_admissions").await;
    assert_eq!(admitted, 1);
    let verdict = i8(&app).await;
    assert!(verdict.pass, "{:?}", verdict.rows);
    // I8 can fail: an order of the product by a key owner nobody admitted.
    sqlx::query("insert into orders (id, total_cents, idempotency_scope, idempotency_key) values ($1, 1000, 'api', 'stranger:k')")
        .bind(Uuid::new_v4())
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("insert into order_lines (order_id, sku, quantity, unit_price_cents) select id, 'DROP-A', 1, 1000 from orders where idempotency_key = 'stranger:k'")
        .execute(&app.db)
        .await
        .unwrap();
    let verdict = i8(&app).await;
    assert!(!verdict.pass);
    assert!(verdict.rows[0].contains("stranger"), "{:?}", verdict.rows);
}

#[tokio::test]
async fn before_the_pre_queue_joining_is_refused_with_the_time_it_opens_and_nothing_sells_before_the_opening()
 {
    let app = spawn_app().await;
    app.add_product("DROP-B", "Drop B", 1000, 5).await;
    let drop = schedule(
        &app,
        "DROP-B",
        Duration::from_secs(3600),
        Duration::from_secs(600),
        Queueing::Fifo,
        60,
        None,
    )
    .await;
    let ada = Buyer {
        key: key(&app, false).await,
        shopper: None,
    };
    let (status, body) = ada.join(&app.address, drop.id).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("opens at"),
        "{body}"
    );
    assert!(body["queue_opens_at"].is_string(), "{body}");
    // Unknown drops and tickets are 404s in words.
    let (status, body) = ada.join(&app.address, Uuid::new_v4()).await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = ada.poll(&app.address, drop.id, "not-a-ticket").await;
    assert_eq!(status, 404);
    // Anonymous callers may not join (they share one identity).
    let res = helpers_client()
        .post(app.url(&format!("/api/v1/drops/{}/queue", drop.id)))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    // A limited client may not act for several buyers.
    let (status, body) = Buyer {
        key: ada.key.clone(),
        shopper: Some("x".into()),
    }
    .join(&app.address, drop.id)
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(app.count("select count(*) from drop_admissions").await, 0);
}

#[tokio::test]
async fn a_retried_order_is_answered_from_its_key_after_the_pass_is_gone_and_a_new_one_is_refused()
{
    let app = spawn_app().await;
    let drop = sold_in_a_drop_soon(&app, "DROP-R").await;
    let buyer = Buyer {
        key: key(&app, true).await,
        shopper: Some("retrier".into()),
    };
    let (status, body) = buyer.join(&app.address, drop.id).await;
    assert_eq!(status, 201, "{body}");
    let ticket = body["ticket"].as_str().unwrap().to_string();
    sleep_until(drop.opens_at).await;
    let pass = buyer
        .wait_for_pass(&app.address, drop.id, &ticket, Duration::from_secs(10))
        .await;
    let order = |pass: Option<String>, key: &'static str| {
        let mut rb = buyer
            .request(helpers_client().post(format!("{}/api/v1/orders", app.address)))
            .header("Idempotency-Key", key)
            .json(&serde_json::json!({"lines": [{"sku": "DROP-R", "quantity": 1}]}));
        if let Some(pass) = pass {
            rb = rb.header("Drop-Pass", pass);
        }
        async move {
            let res = rb.send().await.unwrap();
            let replayed = res.headers().contains_key("idempotency-replayed");
            (
                res.status().as_u16(),
                replayed,
                res.json::<Value>().await.unwrap(),
            )
        }
    };
    let (status, _, first) = order(Some(pass), "k-1").await;
    assert_eq!(status, 201, "{first}");
    // The retry comes after the pass is gone (expired, or a client that lost it): the
    // key's record answers it, the same order, rather than a refusal contradicting it.
    let (status, replayed, again) = order(None, "k-1").await;
    assert_eq!((status, replayed), (201, true), "{again}");
    assert_eq!(again["id"], first["id"]);
    // A new key without a pass is still refused, and changes nothing.
    let (status, _, refused) = order(None, "k-2").await;
    assert_eq!(status, 403, "{refused}");
    assert_eq!(app.count("select count(*) from orders").await, 1);
    assert!(i8(&app).await.pass);
}

#[tokio::test]
async fn a_hold_placed_before_the_drop_bound_its_product_is_confirmed_only_with_a_pass_and_held_units_keep_the_queue_open()
 {
    let app = spawn_app().await;
    app.add_product("DROP-H", "Drop H", 1000, 1).await;
    let ada = Buyer {
        key: key(&app, true).await,
        shopper: Some("ada".into()),
    };
    // The last unit held before any drop: the hold is Ada's, placed without a pass.
    let (status, hold) = ada.place(&app.address, "holds", "DROP-H", None).await;
    assert_eq!(status, 201, "{hold}");
    let hold = hold["id"].as_str().unwrap().to_string();
    let drop = schedule(
        &app,
        "DROP-H",
        Duration::from_secs(4),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let confirm = |pass: Option<String>| {
        let mut rb = ada
            .request(helpers_client().post(format!("{}/api/v1/holds/{hold}/confirm", app.address)));
        if let Some(pass) = pass {
            rb = rb.header("Drop-Pass", pass);
        }
        async move {
            let res = rb.send().await.unwrap();
            (res.status().as_u16(), res.json::<Value>().await.unwrap())
        }
    };
    // Bound: without a pass the hold does not become an order, and stays as it was.
    let (status, body) = confirm(None).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(app.count("select count(*) from orders").await, 0);
    // Every unit held, none sold: the drop stays open after the opening (the held unit may
    // come back), and Ada queues for her pass.
    let (status, joined) = ada.join(&app.address, drop.id).await;
    assert_eq!(status, 201, "{joined}");
    sleep_until(drop.opens_at).await;
    let pass = ada
        .wait_for_pass(
            &app.address,
            drop.id,
            joined["ticket"].as_str().unwrap(),
            Duration::from_secs(10),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status: String = sqlx::query_scalar("select status from drops where id = $1")
        .bind(drop.id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(
        status, "scheduled",
        "a drop whose units are held is not sold out"
    );
    let (status, order) = confirm(Some(pass)).await;
    assert_eq!(status, 201, "{order}");
    // Now every unit is sold: the queue closes.
    let closed = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let status: String = sqlx::query_scalar("select status from drops where id = $1")
            .bind(drop.id)
            .fetch_one(&app.db)
            .await
            .unwrap();
        if status == "sold_out" {
            break;
        }
        assert!(std::time::Instant::now() < closed, "still {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(i8(&app).await.pass);
}

#[tokio::test]
async fn a_shopper_let_in_again_under_a_new_ticket_after_redis_lost_the_first_keeps_one_admission()
{
    let app = spawn_app().await;
    let drop = sold_in_a_drop_soon(&app, "DROP-L").await;
    let ada = Buyer {
        key: key(&app, true).await,
        shopper: Some("ada".into()),
    };
    let (_, first) = ada.join(&app.address, drop.id).await;
    let first = first["ticket"].as_str().unwrap().to_string();
    sleep_until(drop.opens_at).await;
    let pass = ada
        .wait_for_pass(&app.address, drop.id, &first, Duration::from_secs(10))
        .await;
    // Redis forgets that Ada joined (a failover that lost the write): she joins again,
    // gets a new ticket, and is let in under it.
    let mut redis = app.redis().await;
    let ids = format!("{}drop:{}:ids", app.settings.redis_prefix, drop.id.simple());
    let _: i64 = redis::cmd("DEL")
        .arg(&ids)
        .query_async(&mut redis)
        .await
        .unwrap();
    let (status, second) = ada.join(&app.address, drop.id).await;
    assert_eq!(status, 201, "{second}");
    let second = second["ticket"].as_str().unwrap().to_string();
    assert_ne!(
        second, first,
        "a new ticket: Redis no longer knew the first"
    );
    let again = ada
        .wait_for_pass(&app.address, drop.id, &second, Duration::from_secs(10))
        .await;
    // One admission, the first: the second pass carries its ticket and expiry.
    let admissions: Vec<String> =
        sqlx::query_scalar("select ticket::text from drop_admissions where drop_id = $1")
            .bind(drop.id)
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(admissions, vec![first.clone()]);
    let simple = Uuid::parse_str(&first).unwrap().simple().to_string();
    assert!(again.contains(&simple), "{again} carries {simple}");
    assert_eq!(again, pass, "the same pass as before");
}
