//! The admin's drops: scheduling, the live view, and buttons that apply once.

use super::*;

/// The `key` of the form posting to `action` on an admin `page`.
fn form_key(page: &str, action: &str) -> String {
    let form = &page[page.find(&format!("action=\"{action}\"")).expect(action)..];
    let at = form.find("name=\"key\" value=\"").unwrap() + "name=\"key\" value=\"".len();
    form[at..at + form[at..].find('"').unwrap()].to_string()
}

#[tokio::test]
async fn an_admin_schedules_a_drop_watches_it_live_and_each_button_applies_once() {
    let app = spawn_app().await;
    app.add_product("DROP-M", "Drop M", 1000, 10).await;
    let csrf = app.login_admin().await;
    let schedule = |body: Value| {
        app.client
            .post(app.url("/api/v1/admin/drops"))
            .header("X-CSRF-Token", &csrf)
            .json(&body)
            .send()
    };
    let drop = serde_json::json!({"sku": "DROP-M", "opens_at": "+3600", "prequeue_seconds": 7200,
                                  "queueing": "fifo", "admit_per_minute": 1});
    let res = schedule(drop.clone()).await.unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Refused in words, and nothing made: a time that is none, a second live drop.
    let mut bad = drop.clone();
    bad["opens_at"] = "yesterday".into();
    let res = schedule(bad).await.unwrap();
    assert_eq!(res.status().as_u16(), 422);
    assert!(res.text().await.unwrap().contains("is not a time"));
    assert_eq!(schedule(drop).await.unwrap().status().as_u16(), 409);
    assert_eq!(app.count("select count(*) from drops").await, 1);

    // Two shoppers queue; the live figures say so, in the API and on the page.
    let id = Uuid::parse_str(&id).unwrap();
    let key = key(&app, true).await;
    for shopper in ["ada", "bob"] {
        let buyer = Buyer {
            key: key.clone(),
            shopper: Some(shopper.into()),
        };
        assert_eq!(buyer.join(&app.address, id).await.0, 201);
    }
    let live: Value = app
        .client
        .get(app.url(&format!("/api/v1/admin/drops/{id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (live["waiting"].as_u64(), live["admitted"].as_u64()),
        (Some(2), Some(0)),
        "{live}"
    );
    let page_path = format!("/admin/drops/{id}");
    let page = app
        .client
        .get(app.url(&page_path))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("id=\"drop-waiting\">2<"), "{page}");
    assert_eq!(
        page.matches("http-equiv=\"refresh\"").count(),
        page.matches("<noscript><meta http-equiv=\"refresh\"")
            .count(),
        "a refresh only without JavaScript (axe-core counts a meta refresh as critical)"
    );

    // Each button's form, pressed twice, changes the drop once.
    async fn press(app: &TestApp, csrf: &str, id: Uuid, action: &str, page: &str) {
        let key = form_key(page, &format!("/admin/drops/{id}/{action}"));
        let form = [("csrf", csrf.to_string()), ("key", key)];
        let url = app.url(&format!("/admin/drops/{id}/{action}"));
        for _ in 0..2 {
            let res = app.client.post(&url).form(&form).send().await.unwrap();
            assert_eq!(res.status().as_u16(), 303, "{action}");
        }
    }
    let status = || async {
        sqlx::query_scalar::<_, String>("select status from drops where id = $1")
            .bind(id)
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    press(&app, &csrf, id, "pause", &page).await;
    assert_eq!(status().await, "paused");
    let page = app
        .client
        .get(app.url(&page_path))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    press(&app, &csrf, id, "resume", &page).await;
    assert_eq!(status().await, "scheduled");
    press(&app, &csrf, id, "end", &page).await;
    assert_eq!(status().await, "ended");
    assert_eq!(
        app.count("select count(*) from events where type = 'drop.ended'")
            .await,
        1,
        "one drop.ended, however often the button was pressed"
    );
    // Ended: the queue is closed to a waiting shopper.
    let ada = Buyer {
        key,
        shopper: Some("ada".into()),
    };
    let (status, body) = ada.join(&app.address, id).await;
    assert_eq!(status, 409, "{body}");
}
