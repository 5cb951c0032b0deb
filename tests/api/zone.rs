//! The shop's time zone: a server started with `STOCKADE_TIME_ZONE` shows every time a
//! person reads in it, with the zone's abbreviation, and reads the drop form's date and time
//! in it. (The zone is one per process, so the zoned server is a process of its own.)

use chrono::{TimeZone, Utc};

use crate::helpers::{serve_app, spawn_app};

#[tokio::test]
async fn a_shop_in_berlin_shows_its_times_in_berlin_and_reads_the_drop_form_there() {
    let app = spawn_app().await;
    app.add_product("TZ-1", "Zoned thing", 1_000, 5).await;
    let berlin = serve_app(&app, &[("STOCKADE_TIME_ZONE", "Europe/Berlin".into())], &[]).await;
    let res =
        crate::helpers::post_order_to(&app.client, &berlin.address, "tz-1", &[("TZ-1", 1)]).await;
    assert_eq!(res.status().as_u16(), 201);
    let order: serde_json::Value = res.json().await.unwrap();
    let placed: chrono::DateTime<Utc> = order["created_at"].as_str().unwrap().parse().unwrap();
    let shown = placed
        .with_timezone(&chrono_tz::Europe::Berlin)
        .format("%Y-%m-%d %H:%M %Z")
        .to_string();
    let page = app
        .client
        .get(format!(
            "{}/orders/{}",
            berlin.address,
            order["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(&format!("placed {shown}")),
        "{shown} in {page}"
    );
    assert!(shown.ends_with("CET") || shown.ends_with("CEST"), "{shown}");
    // The same order from a server in UTC says UTC.
    let (_, page) = app
        .get_text(&format!("/orders/{}", order["id"].as_str().unwrap()))
        .await;
    assert!(page.contains(" UTC</p>"), "{page}");

    // The drop form's date and time is Berlin's: 18:00 on Christmas Eve is 17:00 UTC.
    app.login_admin().await;
    let csrf = app.admin_csrf().await;
    let res = app
        .client
        .post(format!("{}/admin/drops", berlin.address))
        .form(&[
            ("csrf", csrf.as_str()),
            ("key", &uuid::Uuid::new_v4().to_string()),
            ("sku", "TZ-1"),
            ("opens_at_local", "2030-12-24T18:00"),
            ("queueing", "fifo"),
            ("admit_per_minute", "60"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 303, "{}", res.text().await.unwrap());
    let opens: chrono::DateTime<Utc> = sqlx::query_scalar("select opens_at from drops")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(opens, Utc.with_ymd_and_hms(2030, 12, 24, 17, 0, 0).unwrap());

    // The operator's listing says the same time, in the same zone.
    let listed = crate::helpers::processes::clean_stockade_command()
        .args(["drop", "list"])
        .env(
            "DATABASE_URL",
            app.settings.database_url.as_deref().unwrap(),
        )
        .env("STOCKADE_TIME_ZONE", "Europe/Berlin")
        .env("STOCKADE_LOG", "error")
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("2030-12-24 18:00:00 CET"), "{listed}");
}
