//! Stock forms (restock, count, cancel, release) apply once however often, and however
//! many at once, they are sent; a key belongs to the admin whose page made it.

use std::time::Duration;

use futures_util::future::join_all;

use crate::helpers::{TestApp, client, spawn_app, spawn_app_with, test_settings};

use super::{ledger_rows, log_in_as};

/// The value of field `name` in the form of `html` that posts to `action`.
pub(super) fn field(html: &str, action: &str, name: &str) -> String {
    let start = html
        .find(&format!(r#"action="{action}""#))
        .unwrap_or_else(|| panic!("no form posts to {action}"));
    let form = &html[start..];
    let form = &form[..form.find("</form>").unwrap()];
    let marker = format!(r#"name="{name}" value=""#);
    let start = form
        .find(&marker)
        .unwrap_or_else(|| panic!("the {action} form has no {name}"))
        + marker.len();
    form[start..].split('"').next().unwrap().to_string()
}

/// Opens `page` and returns the idempotency key of its form that posts to `action`.
pub(crate) async fn form_key(app: &TestApp, page: &str, action: &str) -> String {
    let (status, html) = app.get_text(page).await;
    assert_eq!(status, 200, "{page}");
    let key = field(&html, action, "key");
    assert_eq!(key.len(), 36, "a generated key: {key}");
    key
}

pub(crate) fn location(res: &reqwest::Response) -> String {
    res.headers()["location"].to_str().unwrap().to_string()
}

/// Asserts that every answer is 303 to `page?done=key`, and that this page shows `notice`.
async fn assert_all_show(
    app: &TestApp,
    answers: Vec<reqwest::Response>,
    page: &str,
    key: &str,
    notice: &str,
) {
    let expected = format!("{page}?done={key}");
    for res in &answers {
        assert_eq!(res.status().as_u16(), 303, "answered {res:?}");
        assert_eq!(location(res), expected);
    }
    let (status, html) = app.get_text(&expected).await;
    assert_eq!(status, 200);
    assert!(
        html.contains(&format!(r#"id="notice">{notice}</p>"#)),
        "{expected} does not show {notice:?}: {html}"
    );
}

/// Sends `form` to `path` `times` times at once.
async fn send_at_once(
    app: &TestApp,
    path: &str,
    form: &[(&str, &str)],
    times: usize,
) -> Vec<reqwest::Response> {
    join_all((0..times).map(|_| app.admin_post(path, form))).await
}

async fn count_where(app: &TestApp, sql: &str, value: &str) -> i64 {
    // Runtime: the statement is the caller's.
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(value)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// Ledger rows of `sku` written for `reason`.
async fn movements(app: &TestApp, sku: &str, reason: &str) -> i64 {
    sqlx::query_scalar!(
        r#"select count(*) as "count!" from stock_movements where sku = $1 and reason = $2"#,
        sku,
        reason
    )
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// Stock and every ledger row: what a refused form must leave as it was.
async fn snapshot(app: &TestApp) -> (Vec<(String, i32, i32)>, i64) {
    let stock = sqlx::query!("select sku, on_hand, reserved from stock order by sku")
        .fetch_all(&app.db)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.sku, r.on_hand, r.reserved))
        .collect();
    (stock, ledger_rows(app).await)
}

#[tokio::test]
async fn a_restock_form_sent_twice_or_twice_at_once_adds_its_units_once() {
    let app = spawn_app().await;
    app.add_product("ONCE-1", "Once", 1_000, 10).await;
    let csrf = app.login_admin().await;
    let (page, path) = ("/admin/products/ONCE-1", "/admin/products/ONCE-1/restock");

    // A form without its key, or with a broken one, is refused: nothing changes.
    let before = snapshot(&app).await;
    for key in [None, Some(""), Some("bad\u{7f}key")] {
        let mut form = vec![("csrf", csrf.as_str()), ("units", "5"), ("reason", "x")];
        form.extend(key.map(|k| ("key", k)));
        let res = app.admin_post(path, &form).await;
        assert_eq!(res.status().as_u16(), 400, "key {key:?}");
        assert!(res.text().await.unwrap().contains("reload the page"));
    }
    // Bad values re-render the form with a message, change nothing, and spend no key.
    let key = form_key(&app, page, path).await;
    let res = app
        .admin_post(
            path,
            &[
                ("csrf", &csrf),
                ("key", &key),
                ("units", "0"),
                ("reason", "x"),
            ],
        )
        .await;
    assert_eq!(res.status().as_u16(), 422);
    let html = res.text().await.unwrap();
    assert!(
        html.contains("Units to add must be a whole number"),
        "{html}"
    );
    assert!(html.contains(r#"action="/admin/products/ONCE-1/restock""#));
    assert_eq!(snapshot(&app).await, before);

    // Sent, then sent again (a refresh, or back and submit): applied once.
    let form = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("units", "5"),
        ("reason", "delivery"),
    ];
    let first = app.admin_post(path, &form).await;
    let again = app.admin_post(path, &form).await;
    assert_all_show(
        &app,
        vec![first, again],
        page,
        &key,
        "Added 5 units; 15 on hand now.",
    )
    .await;
    assert_eq!(app.stock("ONCE-1").await, (15, 0));
    assert_eq!(movements(&app, "ONCE-1", "restock").await, 1);

    // A fresh form sent twice at once (a double click): applied once.
    let key = form_key(&app, page, path).await;
    let form = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("units", "7"),
        ("reason", "second delivery"),
    ];
    let answers = send_at_once(&app, path, &form, 2).await;
    assert_all_show(&app, answers, page, &key, "Added 7 units; 22 on hand now.").await;
    assert_eq!(app.stock("ONCE-1").await, (22, 0));
    assert_eq!(movements(&app, "ONCE-1", "restock").await, 2);

    // The same key with other values: 422, and nothing changes.
    let before = snapshot(&app).await;
    let res = app
        .admin_post(
            path,
            &[
                ("csrf", &csrf),
                ("key", &key),
                ("units", "8"),
                ("reason", "second delivery"),
            ],
        )
        .await;
    assert_eq!(res.status().as_u16(), 422);
    let html = res.text().await.unwrap();
    assert!(
        html.contains("already submitted with other values"),
        "{html}"
    );
    assert_eq!(snapshot(&app).await, before);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_count_form_sent_twice_or_twice_at_once_sets_the_count_once() {
    let app = spawn_app().await;
    app.add_product("COUNT-1", "Counted", 1_000, 10).await;
    let csrf = app.login_admin().await;
    let (page, path) = ("/admin/products/COUNT-1", "/admin/products/COUNT-1/adjust");

    // Sent, then again: the second does not meet "stock moved", it gets the first answer.
    let key = form_key(&app, page, path).await;
    let form = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("expected", "10"),
        ("on_hand", "12"),
        ("reason", "stocktake"),
    ];
    let first = app.admin_post(path, &form).await;
    let again = app.admin_post(path, &form).await;
    assert_all_show(&app, vec![first, again], page, &key, "On hand set to 12.").await;
    assert_eq!(app.stock("COUNT-1").await, (12, 0));
    assert_eq!(movements(&app, "COUNT-1", "adjust").await, 1);

    // Twice at once.
    let key = form_key(&app, page, path).await;
    let form = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("expected", "12"),
        ("on_hand", "7"),
        ("reason", "two broken"),
    ];
    let answers = send_at_once(&app, path, &form, 2).await;
    assert_all_show(&app, answers, page, &key, "On hand set to 7.").await;
    assert_eq!(app.stock("COUNT-1").await, (7, 0));
    assert_eq!(movements(&app, "COUNT-1", "adjust").await, 2);

    // The same key with another count: 422, nothing changes.
    let before = snapshot(&app).await;
    let mut other = form;
    other[3] = ("on_hand", "9");
    let res = app.admin_post(path, &other).await;
    assert_eq!(res.status().as_u16(), 422);
    assert_eq!(snapshot(&app).await, before);

    // A form that shows a stale count still gets the compare-and-set 409, with the new
    // figure in a fresh form, and changes nothing.
    let key = form_key(&app, page, path).await;
    let stale = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("expected", "12"),
        ("on_hand", "20"),
        ("reason", "late count"),
    ];
    for _ in 0..2 {
        let res = app.admin_post(path, &stale).await;
        assert_eq!(res.status().as_u16(), 409);
        let html = res.text().await.unwrap();
        assert!(
            html.contains("Stock moved while you were counting"),
            "{html}"
        );
        assert_eq!(field(&html, path, "expected"), "7");
        assert_ne!(field(&html, path, "key"), key, "a fresh form");
    }
    assert_eq!(snapshot(&app).await, before);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_cancel_form_sent_twice_or_twice_at_once_returns_the_units_once() {
    let app = spawn_app().await;
    app.add_product("BACK-1", "Returned", 1_000, 20).await;
    let mut orders = Vec::new();
    for i in 0..3 {
        let order: serde_json::Value = app
            .post_order(&format!("order-{i}"), &[("BACK-1", 2)])
            .await
            .json()
            .await
            .unwrap();
        orders.push(order["id"].as_str().unwrap().to_string());
    }
    assert_eq!(app.stock("BACK-1").await, (14, 0));
    let csrf = app.login_admin().await;
    let cancelled = "select count(*) from orders where id::text = $1 and status = 'cancelled'";

    // Sent, then again: the second shows what the first did (not "already cancelled").
    let page = format!("/admin/orders/{}", orders[0]);
    let path = format!("{page}/cancel");
    let key = form_key(&app, &page, &path).await;
    let form = [("csrf", csrf.as_str()), ("key", &key)];
    let first = app.admin_post(&path, &form).await;
    let again = app.admin_post(&path, &form).await;
    let notice = "Order cancelled; its units are back in stock.";
    assert_all_show(&app, vec![first, again], &page, &key, notice).await;
    assert_eq!(app.stock("BACK-1").await, (16, 0));
    assert_eq!(movements(&app, "BACK-1", "cancel").await, 1);

    // Twice at once.
    let page = format!("/admin/orders/{}", orders[1]);
    let path = format!("{page}/cancel");
    let key = form_key(&app, &page, &path).await;
    let form = [("csrf", csrf.as_str()), ("key", &key)];
    let answers = send_at_once(&app, &path, &form, 2).await;
    assert_all_show(&app, answers, &page, &key, notice).await;
    assert_eq!(app.stock("BACK-1").await, (18, 0));
    assert_eq!(movements(&app, "BACK-1", "cancel").await, 2);

    // A cancel form's key sent to another order's cancel: 422, that order stays placed.
    let before = snapshot(&app).await;
    let res = app
        .admin_post(&format!("/admin/orders/{}/cancel", orders[2]), &form)
        .await;
    assert_eq!(res.status().as_u16(), 422);
    assert_eq!(snapshot(&app).await, before);
    assert_eq!(count_where(&app, cancelled, &orders[2]).await, 0);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_release_form_sent_twice_or_twice_at_once_returns_the_units_once() {
    let app = spawn_app().await;
    app.add_product("HELD-1", "Held", 1_000, 20).await;
    let mut holds = Vec::new();
    for i in 0..3 {
        let res = crate::helpers::post_lines(
            &app.client,
            &app.url("/api/v1/holds"),
            &format!("hold-{i}"),
            &[("HELD-1", 2)],
        )
        .await;
        assert_eq!(res.status().as_u16(), 201);
        let hold: serde_json::Value = res.json().await.unwrap();
        holds.push(hold["id"].as_str().unwrap().to_string());
    }
    assert_eq!(app.stock("HELD-1").await, (20, 6));
    let csrf = app.login_admin().await;
    let page = "/admin/holds";
    let notice = "Hold released; its units are back on sale.";
    let released = "select count(*) from holds where id::text = $1 and state = 'released'";

    // Sent, then again.
    let path = format!("/admin/holds/{}/release", holds[0]);
    let key = form_key(&app, page, &path).await;
    let form = [("csrf", csrf.as_str()), ("key", &key)];
    let first = app.admin_post(&path, &form).await;
    let again = app.admin_post(&path, &form).await;
    assert_all_show(&app, vec![first, again], page, &key, notice).await;
    assert_eq!(app.stock("HELD-1").await, (20, 4));
    assert_eq!(movements(&app, "HELD-1", "release").await, 1);

    // Twice at once.
    let path = format!("/admin/holds/{}/release", holds[1]);
    let key = form_key(&app, page, &path).await;
    let form = [("csrf", csrf.as_str()), ("key", &key)];
    let answers = send_at_once(&app, &path, &form, 2).await;
    assert_all_show(&app, answers, page, &key, notice).await;
    assert_eq!(app.stock("HELD-1").await, (20, 2));
    assert_eq!(movements(&app, "HELD-1", "release").await, 2);

    // The key sent to another hold's release: 422, that hold keeps its units.
    let before = snapshot(&app).await;
    let res = app
        .admin_post(&format!("/admin/holds/{}/release", holds[2]), &form)
        .await;
    assert_eq!(res.status().as_u16(), 422);
    assert_eq!(snapshot(&app).await, before);
    assert_eq!(count_where(&app, released, &holds[2]).await, 0);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_stock_form_whose_first_send_is_still_running_gets_409_with_retry_after() {
    let mut settings = test_settings().await;
    // Room for the first send to wait on the row lock this test holds.
    settings.statement_timeout = Duration::from_secs(10);
    settings.tx_timeout = Duration::from_secs(11);
    settings.lease_ttl = Duration::from_secs(12);
    let app = spawn_app_with(settings).await;
    app.add_product("SLOW-1", "Slow", 1_000, 10).await;
    let csrf = app.login_admin().await;
    let (page, path) = ("/admin/products/SLOW-1", "/admin/products/SLOW-1/restock");
    let key = form_key(&app, page, path).await;
    let form = [
        ("csrf", csrf.as_str()),
        ("key", &key),
        ("units", "5"),
        ("reason", "delivery"),
    ];

    let mut lock = app.db.begin().await.unwrap();
    sqlx::query!("select on_hand from stock where sku = 'SLOW-1' for update")
        .fetch_one(&mut *lock)
        .await
        .unwrap();
    let first = app.admin_post(path, &form);
    let second = async {
        // Once the first send holds the key (and waits for the row), send it again.
        app.wait_for_a_row("select count(*) from idempotency_keys where state = 'in_flight'")
            .await;
        let res = app.admin_post(path, &form).await;
        lock.rollback().await.unwrap();
        res
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(second.status().as_u16(), 409);
    assert_eq!(second.headers()["retry-after"], "1");
    let html = second.text().await.unwrap();
    assert!(html.contains("first is still being applied"), "{html}");
    assert_all_show(
        &app,
        vec![first],
        page,
        &key,
        "Added 5 units; 15 on hand now.",
    )
    .await;
    // Sent once more now, it is answered like the first.
    let again = app.admin_post(path, &form).await;
    assert_all_show(
        &app,
        vec![again],
        page,
        &key,
        "Added 5 units; 15 on hand now.",
    )
    .await;
    assert_eq!(app.stock("SLOW-1").await, (15, 0));
    assert_eq!(movements(&app, "SLOW-1", "restock").await, 1);
    app.assert_invariants().await;
}

#[tokio::test]
async fn stock_form_keys_belong_to_one_admin() {
    let app = spawn_app().await;
    app.add_product("TWO-1", "Shared", 1_000, 10).await;
    let csrf = app.login_admin().await;
    let (page, path) = ("/admin/products/TWO-1", "/admin/products/TWO-1/restock");
    let key = form_key(&app, page, path).await;
    let form = [
        ("key", key.as_str()),
        ("units", "5"),
        ("reason", "delivery"),
    ];
    let with_csrf = |csrf| [&[("csrf", csrf)], &form[..]].concat();
    let res = app.admin_post(path, &with_csrf(&csrf)).await;
    assert_all_show(
        &app,
        vec![res],
        page,
        &key,
        "Added 5 units; 15 on hand now.",
    )
    .await;

    // Another admin, sending the very same key, makes a change of their own, and does not
    // see the first admin's result under it.
    stockade::admin::create_admin(&app.db, "grace", "another long passphrase")
        .await
        .unwrap();
    let other = client();
    let other_csrf = log_in_as(&app, &other, "grace", "another long passphrase").await;
    let res = other
        .post(app.url(path))
        .form(&with_csrf(&other_csrf))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 303);
    let html = other
        .get(app.url(&location(&res)))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("Added 5 units; 20 on hand now."), "{html}");
    assert_eq!(app.stock("TWO-1").await, (20, 0));
    let (_, html) = app.get_text(&format!("{page}?done={key}")).await;
    assert!(html.contains("Added 5 units; 15 on hand now."), "{html}");
    app.assert_invariants().await;
}
