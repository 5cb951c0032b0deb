//! Retention: delivered events past `STOCKADE_EVENT_RETENTION_DAYS` go, with their
//! deliveries; pending and recent ones stay; processes purge side by side; and the
//! checker's I7 asks for the events of orders within the window only. Released and
//! expired holds, completed idempotency records and login failures past their windows go
//! too; confirmed and active holds stay.

use std::time::Duration;

use futures_util::future::join_all;
use sqlx::PgPool;
use stockade::config::Settings;
use stockade::retention::{Purged, Windows};

use crate::helpers::{TestApp, spawn_app_with, test_settings};

const DAY: Duration = Duration::from_secs(86_400);
const RETENTION: Duration = Duration::from_secs(30 * 86_400);
const WINDOWS: Windows = Windows {
    idempotency: DAY,
    holds: Duration::from_secs(7 * 86_400),
    events: RETENTION,
};

/// Places an order of one unit, routes its event and gives it one webhook delivery of
/// `status`, all dated `days_ago`; returns the order's id.
async fn order_delivered(app: &TestApp, key: &str, status: &str, days_ago: i32) -> String {
    let res = app.post_order(key, &[("KEEP-1", 1)]).await;
    assert_eq!(res.status().as_u16(), 201);
    let body: serde_json::Value = res.json().await.unwrap();
    let id = body["id"].as_str().unwrap().to_string();
    // The order, its event and the event's delivery, all moved back by one statement.
    sqlx::query(
        "with dated as (
             update orders set created_at = now() - make_interval(days => $2)
              where id::text = $1),
         event as (
             update events set created_at = now() - make_interval(days => $2),
                               routed_at = now() - make_interval(days => $2)
              where type = 'order.placed' and payload->>'order_id' = $1
             returning id, created_at)
         insert into deliveries (event_id, channel, endpoint_id, status, created_at)
         select id, 'webhook', $4, $3, created_at from event",
    )
    .bind(&id)
    .bind(days_ago)
    .bind(status)
    .bind(endpoint(&app.db).await)
    .execute(&app.db)
    .await
    .unwrap();
    id
}

/// The one webhook endpoint the deliveries above go to: one that wants only an event
/// these tests never cause, so the app's dispatcher routes nothing to it itself.
async fn endpoint(db: &PgPool) -> uuid::Uuid {
    let id = uuid::Uuid::from_u128(1);
    sqlx::query(
        "insert into webhook_endpoints (id, url, event_types, secret)
         values ($1, 'https://receiver.example/hook', '{hold.expired}', 'whsec_test')
         on conflict (id) do nothing",
    )
    .bind(id)
    .execute(db)
    .await
    .unwrap();
    id
}

async fn events_of(db: &PgPool, order: &str) -> (i64, i64) {
    sqlx::query_as(
        "select count(distinct e.id), count(d.id) from events e
           left join deliveries d on d.event_id = e.id
          where e.type = 'order.placed' and e.payload->>'order_id' = $1",
    )
    .bind(order)
    .fetch_one(db)
    .await
    .unwrap()
}

async fn i7(db: &PgPool) -> stockade::loadtest::check::Verdict {
    let stale_after = stockade::loadtest::check::default_stale_after();
    stockade::loadtest::check::check(db, None, None, stale_after)
        .await
        .unwrap()
        .into_iter()
        .find(|v| v.id == "I7")
        .expect("I7 is checked")
}

#[tokio::test]
async fn delivered_events_past_the_retention_go_with_their_deliveries_and_the_rest_stay() {
    let app = spawn_app_with(test_settings().await).await;
    app.add_product("KEEP-1", "Kept", 1_000, 100).await;
    let sent_old = order_delivered(&app, "sent-old", "sent", 31).await;
    let failed_old = order_delivered(&app, "failed-old", "failed", 45).await;
    let pending_old = order_delivered(&app, "pending-old", "pending", 40).await;
    let sent_recent = order_delivered(&app, "sent-recent", "sent", 29).await;
    // Many more old delivered ones, for several batches and two purges at once.
    let many = stockade::retention::BATCH as usize + 200;
    sqlx::query(
        "with made as (
             insert into events (type, payload, created_at, routed_at)
             select 'stock.adjusted', jsonb_build_object('n', n),
                    now() - interval '60 days', now() - interval '60 days'
               from generate_series(1, $1) n
             returning id, created_at)
         insert into deliveries (event_id, channel, endpoint_id, status, created_at)
         select id, 'webhook', $2, 'sent', created_at from made",
    )
    .bind(many as i32)
    .bind(endpoint(&app.db).await)
    .execute(&app.db)
    .await
    .unwrap();

    let purged: u64 = purged_side_by_side(&app)
        .await
        .iter()
        .map(|p| p.events)
        .sum();
    assert_eq!(purged, many as u64 + 2, "each purgeable event purged once");

    assert_eq!(events_of(&app.db, &sent_old).await, (0, 0));
    assert_eq!(events_of(&app.db, &failed_old).await, (0, 0));
    assert_eq!(
        events_of(&app.db, &pending_old).await,
        (1, 1),
        "still to be sent"
    );
    assert_eq!(
        events_of(&app.db, &sent_recent).await,
        (1, 1),
        "within the window"
    );
    assert_eq!(
        app.count("select count(*) from events where type = 'stock.adjusted' and payload ? 'n'")
            .await,
        0
    );
    assert_eq!(
        app.count("select count(*) from deliveries where event_id not in (select id from events)")
            .await,
        0
    );
    // The orders whose events went are past the window: I7 asks nothing of them.
    let verdict = i7(&app.db).await;
    assert!(verdict.pass, "I7: {:?}", verdict.rows);

    // An order within the window that lost its event is still found.
    sqlx::query(
        "delete from deliveries where event_id in (select id from events
            where type = 'order.placed' and payload->>'order_id' = $1)",
    )
    .bind(&sent_recent)
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query("delete from events where type = 'order.placed' and payload->>'order_id' = $1")
        .bind(&sent_recent)
        .execute(&app.db)
        .await
        .unwrap();
    let verdict = i7(&app.db).await;
    assert!(!verdict.pass, "an order of 29 days ago without its event");
    assert!(verdict.rows[0].contains(&sent_recent), "{:?}", verdict.rows);
}

#[tokio::test]
async fn a_server_purges_at_start_what_its_retention_setting_lets_go() {
    let settings = test_settings().await;
    let app = spawn_app_with(settings.clone()).await;
    app.add_product("KEEP-1", "Kept", 1_000, 100).await;
    let eight_days = order_delivered(&app, "eight-days", "sent", 8).await;
    let six_days = order_delivered(&app, "six-days", "sent", 6).await;
    // A second process, kept for a week: it purges when it starts.
    let _week = spawn_app_with(Settings {
        event_retention_days: 7,
        ..settings
    })
    .await;
    let since = std::time::Instant::now();
    while events_of(&app.db, &eight_days).await != (0, 0) {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "the event of 8 days ago is still there"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(events_of(&app.db, &six_days).await, (1, 1));
}

/// Two purge rounds side by side (as two processes run them), each on its own
/// connections; what each deleted.
async fn purged_side_by_side(app: &TestApp) -> Vec<Purged> {
    let other = PgPool::connect(app.settings.database_url.as_deref().unwrap())
        .await
        .unwrap();
    join_all([&app.db, &other].map(|db| stockade::retention::purge(db, WINDOWS))).await
}

/// How many rows `sql` counts.
async fn count(db: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn finished_holds_keys_and_login_failures_go_after_their_windows_and_nothing_else() {
    let app = crate::helpers::spawn_app().await;
    app.add_product("KEEP-1", "Kept", 1_000, 100).await;
    let hold = |key: &'static str| {
        let app = &app;
        async move {
            app.place_hold(key, &[("KEEP-1", 1)]).await["id"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let (released_old, expired_old, confirmed_old, active, released_new) = (
        hold("released-old").await,
        hold("expired-old").await,
        hold("confirmed-old").await,
        hold("active").await,
        hold("released-new").await,
    );
    for id in [&released_old, &expired_old, &released_new] {
        let res = app
            .client
            .delete(app.url(&format!("/api/v1/holds/{id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 204);
    }
    let res = app
        .client
        .post(app.url(&format!("/api/v1/holds/{confirmed_old}/confirm")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    // One of the released ones counts as expired (the purge reads only state and age; its
    // stock went back when it was released). The old ones changed state eight days ago.
    sqlx::query(
        "update holds set state = case when id::text = $2 then 'expired' else state end,
                          updated_at = now() - interval '8 days'
          where id::text = any($1)",
    )
    .bind(vec![
        released_old.clone(),
        expired_old.clone(),
        confirmed_old.clone(),
        active.clone(),
    ])
    .bind(&expired_old)
    .execute(&app.db)
    .await
    .unwrap();
    // Many more old released and expired holds with two lines each (placed under keys
    // whose records are gone), for several batches.
    let many = 2_345;
    app.add_product("KEEP-2", "Kept too", 1_000, 100).await;
    sqlx::query(
        "with made as (
             insert into holds (id, state, expires_at, idempotency_scope, idempotency_key,
                                created_at, updated_at)
             select gen_random_uuid(), case when n % 2 = 0 then 'released' else 'expired' end,
                    now() - interval '9 days', 'hold',
                    'bulk-' || n, now() - interval '9 days', now() - interval '9 days'
               from generate_series(1, $1) n
             returning id)
         insert into hold_lines (hold_id, sku, quantity, unit_price_cents)
         select id, sku, 1, 1000 from made, unnest('{KEEP-1,KEEP-2}'::text[]) sku",
    )
    .bind(many)
    .execute(&app.db)
    .await
    .unwrap();
    // Idempotency records: two days old (past the one-day TTL) and fresh.
    sqlx::query(
        "update idempotency_keys set created_at = now() - interval '2 days'
          where key like '%released-old' or key like '%active'",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let keys_before = count(&app.db, "select count(*) from idempotency_keys").await;
    let old_keys = count(
        &app.db,
        "select count(*) from idempotency_keys where created_at < now() - interval '1 day'",
    )
    .await;
    assert!(old_keys >= 2, "{old_keys} old keys");
    // Login failures: one of two days ago, one now.
    sqlx::query(
        "insert into login_failures (kind, subject, at)
         values ('account', 'old', now() - interval '2 days'), ('account', 'new', now())",
    )
    .execute(&app.db)
    .await
    .unwrap();

    let rounds = purged_side_by_side(&app).await;
    let sum = |f: fn(&Purged) -> u64| rounds.iter().map(f).sum::<u64>();
    assert_eq!(
        sum(|p| p.holds),
        many as u64 + 1,
        "each old finished hold purged once"
    );
    assert_eq!(
        sum(|p| p.idempotency_keys),
        old_keys as u64,
        "each old key purged once"
    );
    assert_eq!(sum(|p| p.login_failures), 1);

    let left = |id: String| {
        let db = &app.db;
        async move {
            count(
                db,
                &format!("select count(*) from holds where id::text = '{id}'"),
            )
            .await
                + count(
                    db,
                    &format!("select count(*) from hold_lines where hold_id::text = '{id}'"),
                )
                .await
        }
    };
    assert_eq!(
        left(released_old).await,
        0,
        "an old released hold goes with its line"
    );
    assert_eq!(
        left(expired_old).await,
        2,
        "an old hold whose key's record is still kept stays (a replay must find it)"
    );
    assert_eq!(
        left(confirmed_old).await,
        2,
        "a confirmed hold stays with its order"
    );
    assert_eq!(left(active).await, 2, "an active hold is the sweeper's");
    assert_eq!(left(released_new).await, 2, "a recent released hold stays");
    assert_eq!(
        count(
            &app.db,
            "select count(*) from holds where idempotency_key like 'bulk-%'"
        )
        .await,
        0
    );
    assert_eq!(
        count(&app.db, "select count(*) from hold_lines l where not exists (select 1 from holds h where h.id = l.hold_id)").await,
        0,
        "no line outlives its hold"
    );
    assert_eq!(
        count(&app.db, "select count(*) from idempotency_keys").await,
        keys_before - old_keys
    );
    assert_eq!(
        count(
            &app.db,
            "select count(*) from login_failures where subject = 'old'"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &app.db,
            "select count(*) from login_failures where subject = 'new'"
        )
        .await,
        1
    );
    // The purge changed no stock: I1–I7 hold.
    let stale_after = stockade::loadtest::check::default_stale_after();
    let verdicts = stockade::loadtest::check::check(&app.db, None, None, stale_after)
        .await
        .unwrap();
    assert!(verdicts.iter().all(|v| v.pass), "{verdicts:?}");
}

#[tokio::test]
async fn a_resend_racing_the_purge_keeps_the_event_or_finds_it_gone() {
    let app = spawn_app_with(test_settings().await).await;
    app.add_product("KEEP-1", "Kept", 1_000, 100).await;
    let order = order_delivered(&app, "resent", "failed", 40).await;
    let (event, delivery): (uuid::Uuid, i64) = sqlx::query_as(
        "select e.id, d.id from events e join deliveries d on d.event_id = e.id
          where e.payload->>'order_id' = $1",
    )
    .bind(&order)
    .fetch_one(&app.db)
    .await
    .unwrap();
    // The purge has chosen the event (its row lock, as `events::db::purge` takes it) and
    // is about to delete it with its deliveries when the admin presses "Resend".
    let mut purge = app.db.begin().await.unwrap();
    sqlx::query("select 1 from events where id = $1 for update")
        .bind(event)
        .execute(&mut *purge)
        .await
        .unwrap();
    let db = app.db.clone();
    let resend = tokio::spawn(async move { stockade::events::db::resend(&db, delivery).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    sqlx::query(
        "with gone as (delete from deliveries where event_id = $1)
         delete from events where id = $1",
    )
    .bind(event)
    .execute(&mut *purge)
    .await
    .unwrap();
    purge.commit().await.unwrap();
    let resent = resend.await.unwrap().unwrap();
    assert!(!resent, "told resent, but the purge took the delivery");
    assert_eq!(events_of(&app.db, &order).await, (0, 0));

    // And the other way round: resent first, the purge then leaves the event alone.
    let order = order_delivered(&app, "resent-first", "failed", 40).await;
    let delivery: i64 = sqlx::query_scalar(
        "select d.id from events e join deliveries d on d.event_id = e.id
          where e.payload->>'order_id' = $1",
    )
    .bind(&order)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert!(
        stockade::events::db::resend(&app.db, delivery)
            .await
            .unwrap()
    );
    stockade::retention::purge(&app.db, WINDOWS).await;
    assert_eq!(
        events_of(&app.db, &order).await,
        (1, 1),
        "a pending delivery stays"
    );
}
