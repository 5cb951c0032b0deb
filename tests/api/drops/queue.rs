//! Places, pacing and fairness: across servers, with a lottery, paused, sold out, with
//! Redis stopped, and from one address.

use super::*;

/// The admission times of drop `id`'s tickets, from Redis: ticket → ms.
async fn admitted_at(app: &TestApp, id: Uuid) -> HashMap<String, i64> {
    let mut redis = app.redis().await;
    let key = format!("{}drop:{}:admt", app.settings.redis_prefix, id.simple());
    let pairs: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut redis)
        .await
        .unwrap();
    pairs.into_iter().map(|(t, s)| (t, s as i64)).collect()
}

#[tokio::test]
async fn two_servers_admit_one_queue_in_arrival_order_at_the_drops_rate_without_admitting_anyone_twice()
 {
    let app = spawn_app().await;
    let other = serve_app(&app, &[], &[]).await;
    app.add_product("DROP-C", "Drop C", 1000, 1000).await;
    // 1,200 a minute: 20 a second.
    let drop = schedule(
        &app,
        "DROP-C",
        Duration::from_secs(10),
        Duration::from_secs(60),
        Queueing::Fifo,
        1200,
        None,
    )
    .await;
    let key = key(&app, true).await;
    let bases = [app.address.clone(), other.address.clone()];
    let buyers: Vec<Buyer> = (0..60)
        .map(|i| Buyer {
            key: key.clone(),
            shopper: Some(format!("s{i}")),
        })
        .collect();
    // Joined one after another, through both servers in turn: the arrival order is known.
    let mut tickets = Vec::new();
    for (i, b) in buyers.iter().enumerate() {
        let (status, body) = b.join(&bases[i % 2], drop.id).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["position"], i as u64 + 1, "{body}");
        tickets.push(body["ticket"].as_str().unwrap().to_string());
    }
    sleep_until(drop.opens_at).await;
    // Every shopper polls through both servers until let in.
    let mut passes = Vec::new();
    let polls = buyers.iter().zip(&tickets).enumerate().map(|(i, (b, t))| {
        let base = bases[(i + 1) % 2].clone();
        async move {
            b.wait_for_pass(&base, drop.id, t, Duration::from_secs(30))
                .await
        }
    });
    passes.extend(futures_util::future::join_all(polls).await);
    assert_eq!(passes.len(), 60);

    let at = admitted_at(&app, drop.id).await;
    assert_eq!(at.len(), 60, "each ticket admitted once");
    let times: Vec<i64> = tickets.iter().map(|t| at[t]).collect();
    // FIFO: admission times never go backwards along the arrival order.
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // The rate: by any moment, at most 20/s since the opening (plus one token).
    let opens = drop.opens_at.timestamp_millis();
    for (n, t) in times.iter().enumerate() {
        let allowed = ((t - opens) as f64 / 1000.0 * 20.0).floor() as usize + 1;
        assert!(
            n < allowed,
            "admission {} at +{} ms: the rate allows {allowed}",
            n + 1,
            t - opens
        );
    }
    // And it did not dawdle: 60 at 20/s take about 3 s.
    let span = times.last().unwrap() - opens;
    assert!(span < 6_000, "60 admissions took {span} ms");
    // Each shopper's pass buys through either server.
    for (i, (b, pass)) in buyers.iter().zip(&passes).enumerate() {
        let (status, body) = b.place(&bases[i % 2], "orders", "DROP-C", Some(pass)).await;
        assert_eq!(status, 201, "{body}");
    }
    assert!(i8(&app).await.pass);
}

/// Kendall's τ between the position sequences `a` and `b` of the same items.
fn kendall(a: &[usize], b: &[usize]) -> f64 {
    let n = a.len();
    let mut concordant = 0i64;
    for i in 0..n {
        for j in i + 1..n {
            let s = (a[i] as i64 - a[j] as i64).signum() * (b[i] as i64 - b[j] as i64).signum();
            concordant += s;
        }
    }
    concordant as f64 / (n * (n - 1) / 2) as f64
}

#[tokio::test]
async fn a_lottery_places_the_pre_queue_independently_of_when_each_joined_and_later_arrivals_behind_in_order()
 {
    let app = spawn_app().await;
    app.add_product("DROP-D", "Drop D", 1000, 10).await;
    // One a minute: at the opening nobody is let in for a while, so every place shows.
    // It opens in an hour, for as long as the joins take; then sooner (below).
    let drop = schedule(
        &app,
        "DROP-D",
        Duration::from_secs(3600),
        Duration::from_secs(7200),
        Queueing::Lottery,
        1,
        None,
    )
    .await;
    let key = key(&app, true).await;
    let n = 1000;
    let buyers: Vec<Buyer> = (0..n + 5)
        .map(|i| Buyer {
            key: key.clone(),
            shopper: Some(format!("s{i}")),
        })
        .collect();
    // Joined eight at a time in index order: each joins within eight places of its index.
    use futures_util::StreamExt as _;
    let base = app.address.clone();
    let joined: Vec<(u16, Value)> = futures_util::stream::iter(&buyers[..n])
        .map(|b| b.join(&base, drop.id))
        .buffered(8)
        .collect()
        .await;
    let mut tickets = Vec::new();
    for (status, body) in joined {
        assert_eq!(status, 201, "{body}");
        // The draw is not shown before the opening.
        assert!(body["position"].is_null(), "{body}");
        tickets.push(body["ticket"].as_str().unwrap().to_string());
    }
    // The opening, brought forward: the servers read it again within a second.
    let opens_at: chrono::DateTime<Utc> = sqlx::query_scalar(
        "update drops set opens_at = now() + interval '1 second' where id = $1 returning opens_at",
    )
    .bind(drop.id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    sleep_until(opens_at + chrono::Duration::seconds(1)).await;
    for b in &buyers[n..] {
        let (status, body) = b.join(&app.address, drop.id).await;
        assert_eq!(status, 201, "{body}");
        tickets.push(body["ticket"].as_str().unwrap().to_string());
    }
    let mut places = Vec::new();
    for (b, t) in buyers.iter().zip(&tickets) {
        let (status, body) = b.poll(&app.address, drop.id, t).await;
        assert_eq!(status, 200, "{body}");
        places.push(body["position"].as_u64().unwrap_or(0) as usize);
    }
    // Nobody let in yet (at one a minute, the first token needs a minute): places 1..=1005.
    let mut sorted = places.clone();
    sorted.sort();
    assert_eq!(sorted, (1..=n + 5).collect::<Vec<_>>());
    // Later arrivals: behind the whole pre-queue, in the order they came.
    assert_eq!(&places[n..], &(n + 1..=n + 5).collect::<Vec<_>>()[..]);
    // The pre-queue's places against its join order. For a random order Kendall's τ has a
    // standard deviation of about 0.021; |τ| > 0.15 is seven of them. An order kept by
    // join time (FIFO) gives τ = 1.
    let joined: Vec<usize> = (0..n).collect();
    let tau = kendall(&joined, &places[..n]);
    assert!(tau.abs() < 0.15, "Kendall τ = {tau}");
    // Deciles of join time against deciles of place: 10 × 10 cells of 10 expected; the
    // chi-square statistic (81 degrees of freedom) passes 185 with p < 1e-9 by chance.
    let mut cells = [[0f64; 10]; 10];
    for (i, p) in places[..n].iter().enumerate() {
        cells[i * 10 / n][(p - 1) * 10 / n] += 1.0;
    }
    let chi2: f64 = cells
        .iter()
        .flatten()
        .map(|o| (o - 10.0).powi(2) / 10.0)
        .sum();
    assert!(chi2 < 185.0, "chi-square {chi2}");
}

#[tokio::test]
async fn pausing_stops_admission_resuming_restarts_it_and_selling_out_closes_the_queue_with_its_events()
 {
    let app = spawn_app().await;
    app.add_product("DROP-E", "Drop E", 1000, 2).await;
    let drop = schedule(
        &app,
        "DROP-E",
        Duration::from_secs(6),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let key = key(&app, true).await;
    let buyers: Vec<Buyer> = (0..4)
        .map(|i| Buyer {
            key: key.clone(),
            shopper: Some(format!("s{i}")),
        })
        .collect();
    let mut tickets = Vec::new();
    for b in &buyers {
        tickets.push(
            b.join(&app.address, drop.id).await.1["ticket"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // Paused before the opening: nobody is let in after it.
    assert!(
        drops::db::change(&app.db, drop.id, drops::db::Change::Pause, "test")
            .await
            .unwrap()
    );
    assert!(
        !drops::db::change(&app.db, drop.id, drops::db::Change::Pause, "test")
            .await
            .unwrap()
    );
    sleep_until(drop.opens_at + chrono::Duration::seconds(1)).await;
    let (_, body) = buyers[0].poll(&app.address, drop.id, &tickets[0]).await;
    assert_eq!(body["state"], "waiting", "{body}");
    assert_eq!(body["paused"], true, "{body}");
    assert_eq!(admitted_at(&app, drop.id).await.len(), 0);

    drops::db::change(&app.db, drop.id, drops::db::Change::Resume, "test")
        .await
        .unwrap();
    let mut passes = Vec::new();
    for (b, t) in buyers.iter().zip(&tickets).take(2) {
        passes.push(
            b.wait_for_pass(&app.address, drop.id, t, Duration::from_secs(10))
                .await,
        );
    }
    for (b, pass) in buyers.iter().zip(&passes) {
        assert_eq!(
            b.place(&app.address, "orders", "DROP-E", Some(pass))
                .await
                .0,
            201
        );
    }
    // Sold out: the drop ends by itself and everyone still waiting is told.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = buyers[3].poll(&app.address, drop.id, &tickets[3]).await;
        if body["state"] == "closed" {
            break;
        }
        assert!(std::time::Instant::now() < until, "still {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status: String = sqlx::query_scalar("select status from drops where id = $1")
        .bind(drop.id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(status, "sold_out");
    let events: Vec<String> = sqlx::query_scalar(
        "select type from events where type like 'drop.%' and payload->>'drop_id' = $1 order by seq",
    )
    .bind(drop.id.to_string())
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(events, ["drop.opened", "drop.sold_out"]);
    // Resuming an ended drop is refused in words.
    let err = drops::db::change(&app.db, drop.id, drops::db::Change::Resume, "test")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("has ended"), "{err}");
    app.assert_invariants().await;
}

#[tokio::test]
async fn with_redis_stopped_nobody_joins_or_is_let_in_while_passes_given_and_the_rest_of_the_shop_keep_selling()
 {
    let mut app = spawn_app_with_own_redis().await;
    app.add_product("DROP-F", "Drop F", 1000, 10).await;
    app.add_product("PLAIN-F", "Plain F", 1000, 10).await;
    let drop = schedule(
        &app,
        "DROP-F",
        Duration::from_secs(5),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let key = key(&app, true).await;
    let ada = Buyer {
        key: key.clone(),
        shopper: Some("ada".into()),
    };
    let bob = Buyer {
        key: key.clone(),
        shopper: Some("bob".into()),
    };
    let ticket = ada.join(&app.address, drop.id).await.1["ticket"]
        .as_str()
        .unwrap()
        .to_string();
    let pass = ada
        .wait_for_pass(&app.address, drop.id, &ticket, Duration::from_secs(10))
        .await;

    app.stop_redis();
    let (status, body) = bob.join(&app.address, drop.id).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("nobody is let in"),
        "{body}"
    );
    assert_eq!(ada.poll(&app.address, drop.id, &ticket).await.0, 503);
    assert_eq!(
        ada.place(&app.address, "orders", "DROP-F", Some(&pass))
            .await
            .0,
        201
    );
    assert_eq!(
        bob.place(&app.address, "orders", "DROP-F", None).await.0,
        403
    );
    assert_eq!(
        bob.place(&app.address, "orders", "PLAIN-F", None).await.0,
        201
    );

    app.restart_redis().await;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let ticket = loop {
        let (status, body) = bob.join(&app.address, drop.id).await;
        if status == 201 {
            break body["ticket"].as_str().unwrap().to_string();
        }
        assert!(std::time::Instant::now() < until, "{status} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pass = bob
        .wait_for_pass(&app.address, drop.id, &ticket, Duration::from_secs(10))
        .await;
    assert_eq!(
        bob.place(&app.address, "orders", "DROP-F", Some(&pass))
            .await
            .0,
        201
    );
    assert!(i8(&app).await.pass);
}

#[tokio::test]
async fn one_address_takes_at_most_its_places_and_joining_twice_keeps_one() {
    let mut settings = test_settings().await;
    settings.drop_places_per_address = 3;
    let app = spawn_app_with(settings).await;
    app.add_product("DROP-G", "Drop G", 1000, 10).await;
    let drop = schedule(
        &app,
        "DROP-G",
        Duration::from_secs(60),
        Duration::from_secs(60),
        Queueing::Fifo,
        60,
        None,
    )
    .await;
    let key = key(&app, true).await;
    for i in 0..3 {
        let b = Buyer {
            key: key.clone(),
            shopper: Some(format!("s{i}")),
        };
        assert_eq!(b.join(&app.address, drop.id).await.0, 201);
        assert_eq!(
            b.join(&app.address, drop.id).await.0,
            201,
            "the same place again"
        );
    }
    let fourth = Buyer {
        key,
        shopper: Some("s3".into()),
    };
    let (status, body) = fourth.join(&app.address, drop.id).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("from your network"),
        "{body}"
    );
}
