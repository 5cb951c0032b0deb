//! The admin's drops: scheduling, the live view, and buttons that apply once.

use super::*;

/// The `key` of the form posting to `action` on an admin `page`.
fn form_key(page: &str, action: &str) -> String {
    let form = &page[page.find(&format!("action=\"{action}\"")).expect(action)..];
    let at = form.find("name=\"key\" value=\"").unwrap() + "name=\"key\" value=\"".len();
    form[at..at + form[at..].find('"').unwrap()].to_string()
}

/// `POST /api/v1/admin/drops` with `body`, as the logged-in admin whose token is `csrf`.
async fn schedule_through_the_api(app: &TestApp, csrf: &str, body: Value) -> reqwest::Response {
    app.client
        .post(app.url("/api/v1/admin/drops"))
        .header("X-CSRF-Token", csrf)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_admin_schedules_a_drop_watches_it_live_and_each_button_applies_once() {
    let app = spawn_app().await;
    app.add_product("DROP-M", "Drop M", 1000, 10).await;
    let csrf = app.login_admin().await;
    let schedule = |body: Value| schedule_through_the_api(&app, &csrf, body);
    let drop = serde_json::json!({"sku": "DROP-M", "opens_at": "+3600", "prequeue_seconds": 7200,
                                  "queueing": "fifo", "admit_per_minute": 1});
    let res = schedule(drop.clone()).await;
    assert_eq!(res.status().as_u16(), 201);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Refused in words, and nothing made: a time that is none, a second live drop.
    let mut bad = drop.clone();
    bad["opens_at"] = "yesterday".into();
    let res = schedule(bad).await;
    assert_eq!(res.status().as_u16(), 422);
    assert!(res.text().await.unwrap().contains("is not a time"));
    assert_eq!(schedule(drop).await.status().as_u16(), 409);
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
    // Its product by name, and where it stands by the clock: the queue open, not selling.
    assert!(page.contains("<h1>Drop of Drop M"), "{page}");
    assert!(page.contains("id=\"drop-status\">pre-queue<"), "{page}");
    assert_eq!(live["phase"], "pre-queue", "{live}");
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

/// The contract equals the server: what the admin API's `opens_at` pattern and `queueing`
/// enum refuse, the server refuses (the audit found each accepted), and so does the form
/// a `+5` where a whole number goes; each in words, nothing made. The served contract
/// declares the drop headers on every operation that reads them.
#[tokio::test]
async fn the_drop_api_and_form_refuse_what_their_contract_refuses() {
    let app = spawn_app().await;
    app.add_product("DROP-C", "Drop C", 1000, 10).await;
    let csrf = app.login_admin().await;
    let doc: Value = app.get("/api/v1/openapi.json").await.json().await.unwrap();
    let schema = &doc["components"]["schemas"]["NewDropBody"]["properties"];
    let pattern = regex::Regex::new(schema["opens_at"]["pattern"].as_str().unwrap()).unwrap();
    let ok = serde_json::json!({"sku": "DROP-C", "opens_at": "+3600", "queueing": "fifo",
                                "admit_per_minute": 1});
    let schedule = |body: Value| schedule_through_the_api(&app, &csrf, body);
    for opens_at in [
        "+1234567890",
        "2027-12-24 18:00:00Z",
        "2027-12-24t18:00:00Z",
        "2027-12-24T18:00:00z",
        " +300",
    ] {
        assert!(
            !pattern.is_match(opens_at),
            "the pattern takes {opens_at:?}"
        );
        let mut bad = ok.clone();
        bad["opens_at"] = opens_at.into();
        let res = schedule(bad).await;
        assert_eq!(res.status().as_u16(), 422, "opens_at {opens_at:?}");
        assert!(
            res.text().await.unwrap().contains("not"),
            "a sentence for {opens_at:?}"
        );
    }
    let queueing: Vec<&str> = doc["components"]["schemas"]["Queueing"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for name in ["FIFO", " lottery ", "Lottery"] {
        assert!(!queueing.contains(&name));
        let mut bad = ok.clone();
        bad["queueing"] = name.into();
        let res = schedule(bad).await;
        assert_eq!(res.status().as_u16(), 422, "queueing {name:?}");
    }
    let form_csrf = app.admin_csrf().await;
    let res = app
        .admin_post(
            "/admin/drops",
            &[
                ("csrf", &form_csrf),
                ("key", &Uuid::new_v4().to_string()),
                ("sku", "DROP-C"),
                ("opens_at", "+3600"),
                ("queueing", "fifo"),
                ("admit_per_minute", "+5"),
            ],
        )
        .await;
    assert_eq!(res.status().as_u16(), 422);
    assert!(res.text().await.unwrap().contains("whole number"));
    assert_eq!(app.count("select count(*) from drops").await, 0);
    // The one that fits the contract is taken.
    assert_eq!(schedule(ok).await.status().as_u16(), 201);

    for (path, method) in [
        ("/api/v1/orders", "post"),
        ("/api/v1/holds", "post"),
        ("/api/v1/holds/{id}/confirm", "post"),
    ] {
        let names: Vec<&str> = doc["paths"][path][method]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect();
        for header in ["Drop-Pass", "Drop-Shopper"] {
            assert!(
                names.contains(&header),
                "{method} {path} does not declare {header}"
            );
        }
    }
}

#[tokio::test]
async fn an_address_naming_no_drop_action_or_ticket_is_404_in_words_and_changes_nothing() {
    let app = spawn_app().await;
    let drop = sold_in_a_drop_soon(&app, "DROP-A").await.id;
    let csrf = app.login_admin().await;
    let api_change = |path: String| {
        app.client
            .post(app.url(&path))
            .header("X-CSRF-Token", &csrf)
            .send()
    };
    let no_drop = "There is no such drop.";
    let no_action = "A drop can be paused, resumed or ended.";
    for (path, says) in [
        (format!("/api/v1/admin/drops/{drop}/explode"), no_action),
        (format!("/api/v1/admin/drops/{drop}/Pause"), no_action),
        ("/api/v1/admin/drops/not-a-drop/pause".to_string(), no_drop),
        (
            format!("/api/v1/admin/drops/{}/end", Uuid::new_v4()),
            no_drop,
        ),
    ] {
        let res = api_change(path.clone()).await.unwrap();
        assert_eq!(res.status().as_u16(), 404, "{path}");
        assert!(res.text().await.unwrap().contains(says), "{path}");
    }
    for (path, says) in [
        (format!("/admin/drops/{drop}/explode"), no_action),
        ("/admin/drops/not-a-drop/pause".to_string(), no_drop),
    ] {
        let form_csrf = app.admin_csrf().await;
        let key = Uuid::new_v4().to_string();
        let res = app
            .admin_post(&path, &[("csrf", &form_csrf), ("key", &key)])
            .await;
        assert_eq!(res.status().as_u16(), 404, "{path}");
        assert!(res.text().await.unwrap().contains(says), "{path}");
    }
    let status: String = sqlx::query_scalar("select status from drops where id = $1")
        .bind(drop)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(status, "scheduled");

    let buyer = Buyer {
        key: key(&app, false).await,
        shopper: None,
    };
    let base = &app.address;
    let (status, joined) = buyer.join(base, drop).await;
    assert_eq!(status, 201, "{joined}");
    let ticket = joined["ticket"].as_str().unwrap().to_string();
    let no_ticket = "There is no such ticket in this drop's queue for you";
    for (drop, ticket, says) in [
        (drop.to_string(), "not-a-ticket".to_string(), no_ticket),
        (drop.to_string(), Uuid::new_v4().to_string(), no_ticket),
        (
            "not-a-drop".to_string(),
            ticket.clone(),
            "There is no drop at this address.",
        ),
    ] {
        let res = buyer
            .request(helpers_client().get(format!("{base}/api/v1/drops/{drop}/queue/{ticket}")))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 404, "{drop}/{ticket}");
        assert!(res.text().await.unwrap().contains(says), "{drop}/{ticket}");
    }
    // Another caller's ticket reads as none; the caller's own is found.
    let other = Buyer {
        key: key(&app, false).await,
        shopper: None,
    };
    let (status, _) = other.poll(base, drop, &ticket).await;
    assert_eq!(status, 404);
    let (status, body) = buyer.poll(base, drop, &ticket).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn the_drop_form_takes_a_date_and_time_and_comes_back_filled_in_when_refused() {
    let app = spawn_app().await;
    app.add_product("DROP-F", "Drop F", 1000, 10).await;
    app.login_admin().await;
    let csrf = app.admin_csrf().await;
    let post = |fields: Vec<(&'static str, String)>| {
        let mut form = vec![
            ("csrf", csrf.clone()),
            ("key", Uuid::new_v4().to_string()),
            ("queueing", "fifo".to_string()),
            ("admit_per_minute", "60".to_string()),
            ("prequeue_seconds", "120".to_string()),
        ];
        form.extend(fields);
        app.client.post(app.url("/admin/drops")).form(&form).send()
    };
    // A mistyped SKU and a bad time: the form again, as typed, with the reason at it.
    let res = post(vec![
        ("sku", "DROP-G".into()),
        ("opens_at", "+300+40".into()),
    ])
    .await
    .unwrap();
    assert_eq!(res.status().as_u16(), 422);
    let page = res.text().await.unwrap();
    assert!(page.contains("id=\"drop-form-error\""), "{page}");
    assert!(page.contains("+300+40"), "the time as typed: {page}");
    assert!(page.contains("value=\"DROP-G\""), "{page}");
    assert!(page.contains("value=\"60\""), "{page}");
    let res = post(vec![("sku", "DROP-G".into()), ("opens_at", "+300".into())])
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 422);
    let page = res.text().await.unwrap();
    assert!(page.contains("DROP-G"), "{page}");
    assert!(page.contains("id=\"drop-form-error\""), "{page}");
    assert_eq!(app.count("select count(*) from drops").await, 0);
    // A date and time (the browser's datetime-local field), taken as UTC.
    let res = post(vec![
        ("sku", "DROP-F".into()),
        ("opens_at", "+300".into()),
        ("opens_at_local", "2030-12-24T18:00".into()),
    ])
    .await
    .unwrap();
    assert_eq!(res.status().as_u16(), 303);
    let opens: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select opens_at from drops where sku = 'DROP-F'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(opens.to_rfc3339(), "2030-12-24T18:00:00+00:00");
}
