//! Post/Redirect/Get: the page that answers a form sits at a GET address of its own, so
//! Back and reload never send the form again.

use crate::helpers::hidden;
use crate::helpers::{spawn_app, spawn_app_with_own_redis};
use crate::shop::{add_to_cart, form, post_form};

/// A client that stops at every redirect (a browser's cookie jar, a test's eyes).
fn stopping_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .cookie_store(true)
        .build()
        .unwrap()
}

/// The storefront CSRF token `client` got from the catalogue page.
async fn token(app: &crate::helpers::TestApp, client: &reqwest::Client) -> String {
    let page = client.get(app.url("/")).send().await.unwrap();
    let page = page.text().await.unwrap();
    crate::helpers::csrf_in(&page)
}

/// A checkout of 11 units, where 10 is the cap: refused.
async fn checkout_of_eleven(
    app: &crate::helpers::TestApp,
    client: &reqwest::Client,
    csrf: &str,
) -> reqwest::Response {
    client
        .post(app.url("/checkout"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[
            ("csrf", csrf),
            ("key", "k-1"),
            ("lines", "GOOD-1~11"),
        ]))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_refused_form_is_answered_at_an_address_that_reloads_and_only_for_its_browser() {
    let app = spawn_app().await;
    app.add_product("GOOD-1", "Good", 1_000, 50).await;
    let shopper = stopping_client();
    let csrf = token(&app, &shopper).await;
    let res = checkout_of_eleven(&app, &shopper, &csrf).await;
    assert_eq!(res.status(), 303, "a refused form is redirected");
    let location = res.headers()["location"].to_str().unwrap().to_string();
    let id = location
        .strip_prefix("/shown/")
        .expect("to a page of its own");
    assert_eq!(id.len(), 64, "{location}");
    assert!(res.text().await.unwrap().is_empty());

    // Loaded, and loaded again (a reload): the same answer, with the status it had.
    for _ in 0..2 {
        let page = shopper.get(app.url(&location)).send().await.unwrap();
        assert_eq!(page.status(), 422);
        assert_eq!(page.headers()["cache-control"], "no-store");
        let page = page.text().await.unwrap();
        assert!(page.contains("at most 10"), "{page}");
    }
    assert_eq!(app.count("select count(*) from holds").await, 0);

    // Another browser (another CSRF cookie) cannot read it.
    let stranger = stopping_client();
    token(&app, &stranger).await;
    let page = stranger.get(app.url(&location)).send().await.unwrap();
    assert_eq!(page.status(), 404);
    let page = page.text().await.unwrap();
    assert!(page.contains("answered a form"), "{page}");
    assert!(!page.contains("at most 10"), "{page}");
    // Nor can anyone at an address that was never given out.
    let made_up = format!("/shown/{}", "0".repeat(64));
    let res = shopper.get(app.url(&made_up)).send().await.unwrap();
    assert_eq!(res.status(), 404);
    let res = shopper.get(app.url("/shown/x")).send().await.unwrap();
    assert_eq!(res.status(), 404);

    // A forged form (no token) is refused where it was sent: nothing to keep.
    let res = shopper
        .post(app.url("/checkout"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("key", "k-2"), ("lines", "GOOD-1~1")]))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
}

#[tokio::test]
async fn without_redis_a_refused_form_is_answered_where_it_was_sent() {
    let mut app = spawn_app_with_own_redis().await;
    app.add_product("GOOD-1", "Good", 1_000, 50).await;
    let shopper = stopping_client();
    let csrf = token(&app, &shopper).await;
    app.stop_redis();
    let res = checkout_of_eleven(&app, &shopper, &csrf).await;
    assert_eq!(res.status(), 422);
    assert!(res.text().await.unwrap().contains("at most 10"));
    assert_eq!(app.count("select count(*) from holds").await, 0);
}

#[tokio::test]
async fn an_admins_kept_page_is_gone_once_the_session_is_and_a_post_to_no_route_is_not_kept() {
    let app = spawn_app().await;
    app.add_product("GOOD-1", "Good", 1_000, 50).await;
    let csrf = app.login_admin().await;
    let key = uuid::Uuid::new_v4().to_string();
    let res = app
        .admin_post(
            "/admin/products/GOOD-1/restock",
            &[
                ("csrf", &csrf),
                ("key", &key),
                ("units", "0"),
                ("reason", "delivery"),
            ],
        )
        .await;
    assert_eq!(res.status(), 422);
    let shown = res.url().path().to_string();
    assert!(shown.starts_with("/shown/"), "{shown}");
    assert_eq!(app.get(&shown).await.status(), 422, "kept for the session");
    let out = app.admin_post("/admin/logout", &[("csrf", &csrf)]).await;
    assert_eq!(out.status(), 303);
    let (status, page) = app.get_text(&shown).await;
    assert_eq!(status, 404, "after logout: {page}");

    // A form sent to no route is answered where it was sent: nothing kept.
    let csrf = app.csrf().await;
    let res = app
        .client
        .post(app.url("/no/such/form"))
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(res.url().path(), "/no/such/form");
}

#[tokio::test]
async fn a_kept_checkout_keeps_the_policy_that_lets_the_card_form_in() {
    let shop = crate::payments::paying_shop().await;
    let app = &shop.app;
    assert_eq!(
        add_to_cart(app, crate::payments::SKU, "1").await.status(),
        303
    );
    let (_, cart) = app.get_text("/cart").await;
    let start = form(&[
        ("key", &hidden(&cart, "key")),
        ("lines", &hidden(&cart, "lines")),
    ]);
    let (status, hold_page) = post_form(app, "/checkout", &start).await;
    assert_eq!(status, 303);
    let policy = |res: &reqwest::Response| {
        res.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_string()
    };
    let fresh = policy(&app.get(&hold_page).await);
    assert!(fresh.contains("script-src 'self' http"), "{fresh}");
    let csrf = app.csrf().await;
    let res = app
        .client
        .post(app.url(&format!("{hold_page}/confirm")))
        .form(&[("csrf", csrf.as_str()), ("name", "Ada"), ("email", "ada@")])
        .send()
        .await
        .unwrap();
    // Refused for its email, or for not being paid yet: a page the checkout made either way.
    assert!(
        [402, 422].contains(&res.status().as_u16()),
        "{}",
        res.status()
    );
    assert!(res.url().path().starts_with("/shown/"));
    assert_eq!(policy(&res), fresh, "the card form's script may load again");
}
