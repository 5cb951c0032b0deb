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

/// The audit's bypass: holds taken before a drop was announced and left to expire were
/// confirmed without a pass, before the drop even opened. An expired hold buys from free
/// stock, as a new order does, so it meets the drop's rule as a new order does: swept by
/// the sweeper or only past its time, it needs a pass; with none nothing is sold and its
/// state does not change.
#[tokio::test]
async fn an_expired_hold_from_before_a_drop_is_not_confirmed_without_a_pass() {
    // No sweeper of the app's own: the test sweeps when it means to, so one hold stays
    // past its time without being swept.
    let mut settings = crate::helpers::test_settings().await;
    settings.sweep_interval = Duration::from_secs(3600);
    let app = crate::helpers::spawn_app_with(settings).await;
    app.add_product("DROP-X", "Drop X", 1000, 20).await;
    let bot = Buyer {
        key: key(&app, false).await,
        shopper: None,
    };
    let mut holds = Vec::new();
    for _ in 0..3 {
        let (status, hold) = bot.place(&app.address, "holds", "DROP-X", None).await;
        assert_eq!(status, 201, "{hold}");
        holds.push(hold["id"].as_str().unwrap().to_string());
    }
    // One swept by the sweeper, one past its time but not yet swept, one still live.
    sqlx::query(
        "update holds set expires_at = now() - interval '1 second' where id = any($1::uuid[])",
    )
    .bind(&holds[..2])
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query("update holds set expires_at = now() + interval '1 hour' where id = $1::uuid")
        .bind(&holds[1])
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(app.sweep_holds().await, 1);
    sqlx::query("update holds set expires_at = now() - interval '1 second' where id = $1::uuid")
        .bind(&holds[1])
        .execute(&app.db)
        .await
        .unwrap();
    // The drop is announced two minutes ahead: it binds its product now.
    schedule(
        &app,
        "DROP-X",
        Duration::from_secs(120),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let (status, body) = bot.place(&app.address, "orders", "DROP-X", None).await;
    assert_eq!(status, 403, "a plain order: {body}");
    for (hold, what) in holds.iter().zip(["swept", "past its time", "live"]) {
        let res = bot
            .request(helpers_client().post(format!("{}/api/v1/holds/{hold}/confirm", app.address)))
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 403, "the {what} hold: {body}");
        assert!(
            body["detail"].as_str().unwrap_or("").contains("Drop X") || body["queue"].is_string(),
            "the {what} hold's refusal names the queue: {body}"
        );
    }
    // Another client confirming the live one: not found, as its `GET` answers, rather than
    // a refusal that would say what it holds and which drop.
    let other = Buyer {
        key: key(&app, false).await,
        shopper: None,
    };
    let res = other
        .request(
            helpers_client().post(format!("{}/api/v1/holds/{}/confirm", app.address, holds[2])),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 404, "{}", res.text().await.unwrap());
    assert_eq!(app.count("select count(*) from orders").await, 0);
    let states: Vec<String> = sqlx::query_scalar(
        "select state::text from holds where id = any($1::uuid[]) order by state",
    )
    .bind(&holds)
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(states, ["active", "active", "expired"]);
}

/// The same bypass through the shop: a checkout's hold from before the drop, expired,
/// is sent to the drop's queue, not to an order page.
#[tokio::test]
async fn an_expired_checkout_from_before_a_drop_is_sent_to_the_queue_not_ordered() {
    use crate::shop::{add_to_cart, post_form};
    let app = spawn_app().await;
    app.add_product("DROP-S", "Drop S", 1000, 20).await;
    assert_eq!(
        add_to_cart(&app, "DROP-S", "1").await.status().as_u16(),
        303
    );
    let (_, cart) = app.get_text("/cart").await;
    let start = crate::shop::form(&[
        ("key", &crate::helpers::hidden(&cart, "key")),
        ("lines", &crate::helpers::hidden(&cart, "lines")),
    ]);
    let (status, hold_page) = post_form(&app, "/checkout", &start).await;
    assert!(
        status == 303 && hold_page.starts_with("/checkout/"),
        "{status} {hold_page}"
    );
    let hold = hold_page.trim_start_matches("/checkout/").to_string();
    sqlx::query("update holds set expires_at = now() - interval '1 second' where id = $1::uuid")
        .bind(&hold)
        .execute(&app.db)
        .await
        .unwrap();
    let drop = schedule(
        &app,
        "DROP-S",
        Duration::from_secs(120),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let details = crate::shop::ada_details();
    let (status, location) = post_form(&app, &format!("/checkout/{hold}/confirm"), &details).await;
    assert_eq!(status, 303, "{location}");
    assert!(
        location.contains(&drop.id.to_string()) && !location.starts_with("/orders/"),
        "sent to {location}, not the drop's queue"
    );
    assert_eq!(app.count("select count(*) from orders").await, 0);
}
