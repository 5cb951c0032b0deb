//! Answers to forms in Chromium: a refused form reloads and goes back without being sent
//! again (Post/Redirect/Get), and an expired checkout says once what is still possible.

use fantoccini::{Client, Locator};

use super::{body_text, fill_details, save_screenshot};
use crate::helpers::{TestApp, browser, spawn_app};

/// From a product page to the checkout's details form, `quantity` of `sku` in the cart.
async fn to_checkout(app: &TestApp, b: &Client, sku: &str, quantity: &str) {
    b.goto(&app.url(&format!("/products/{sku}"))).await.unwrap();
    let field = b.find(Locator::Id("quantity")).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(quantity).await.unwrap();
    click(b, "add-to-cart").await;
    b.wait().for_element(Locator::Id("checkout")).await.unwrap();
    click(b, "checkout").await;
    b.wait()
        .for_element(Locator::Id("place-order"))
        .await
        .unwrap();
}

async fn click(b: &Client, id: &str) {
    b.find(Locator::Id(id))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn path(b: &Client) -> String {
    b.current_url().await.unwrap().path().to_string()
}

async fn value(b: &Client, id: &str) -> String {
    let field = b.find(Locator::Id(id)).await.unwrap();
    field.prop("value").await.unwrap().unwrap_or_default()
}

#[tokio::test]
async fn a_refused_checkout_reloads_and_goes_back_without_sending_the_form_again() {
    let app = spawn_app().await;
    app.seed_demo().await;
    let b = browser().await;
    to_checkout(&app, &b, "NB-DOT-A5", "1").await;
    let form_page = path(&b).await;
    // The browser's own checks would stop `grace@` before it left; the server's are tested.
    b.execute(
        "document.querySelectorAll('form').forEach(f => f.noValidate = true)",
        vec![],
    )
    .await
    .unwrap();
    fill_details(&b, "grace@").await;
    click(&b, "place-order").await;
    b.wait()
        .for_element(Locator::Id("email-error"))
        .await
        .unwrap();
    let answer = path(&b).await;
    assert!(answer.starts_with("/shown/"), "{answer}");
    assert_eq!(
        value(&b, "name").await,
        "Grace",
        "the form comes back filled in"
    );

    // Reload: the same answer at the same address, and the form is not sent again (a
    // page at a POST's address would be, or would stop at the browser's question).
    b.refresh().await.unwrap();
    b.wait()
        .for_element(Locator::Id("email-error"))
        .await
        .unwrap();
    assert_eq!(path(&b).await, answer);
    assert_eq!(app.count("select count(*) from holds").await, 1);
    assert_eq!(app.count("select count(*) from orders").await, 0);

    // Back: the checkout as it was before the form was sent.
    b.back().await.unwrap();
    b.wait()
        .for_element(Locator::Id("place-order"))
        .await
        .unwrap();
    assert_eq!(path(&b).await, form_page);
    let email = b.find(Locator::Id("email")).await.unwrap();
    email.clear().await.unwrap();
    email.send_keys("grace@example.com").await.unwrap();
    // The browser may or may not have kept what was typed before the form was sent.
    if value(&b, "name").await.is_empty() {
        email.clear().await.unwrap();
        fill_details(&b, "grace@example.com").await;
    }
    click(&b, "place-order").await;
    b.wait().for_element(Locator::Id("order-id")).await.unwrap();
    assert_eq!(app.count("select count(*) from orders").await, 1);
    app.assert_invariants().await;
    b.close().await.unwrap();
}

#[tokio::test]
async fn an_expired_checkout_short_of_stock_says_once_what_is_left_to_do() {
    let app = spawn_app().await;
    app.add_product("EXP-1", "Enamel mug 350 ml", 1_200, 2)
        .await;
    let b = browser().await;
    to_checkout(&app, &b, "EXP-1", "2").await;
    // The hold runs out, and one of its two units is sold to someone else meanwhile.
    sqlx::query("update holds set expires_at = now() - interval '1 second'")
        .execute(&app.db)
        .await
        .unwrap();
    app.sweep_holds().await;
    let other = app.post_order("other", &[("EXP-1", 1)]).await;
    assert_eq!(other.status(), 201);
    fill_details(&b, "grace@example.com").await;
    click(&b, "place-order").await;
    b.wait()
        .for_element(Locator::Css("a[href='/cart']"))
        .await
        .unwrap();
    let text = body_text(&b).await;
    assert!(text.contains("no longer enough stock"), "{text}");
    assert!(text.contains("you asked for 2, only 1 left"), "{text}");
    assert!(!text.contains("You can still place the order"), "{text}");
    assert!(
        b.find(Locator::Id("place-order")).await.is_err(),
        "no button"
    );
    assert!(path(&b).await.starts_with("/shown/"));
    b.set_window_size(1280, 900).await.unwrap();
    save_screenshot(&b, "checkout-expired.png").await;
    b.set_window_size(390, 844).await.unwrap();
    save_screenshot(&b, "checkout-expired-phone.png").await;
    assert_eq!(app.count("select count(*) from orders").await, 1);
    app.assert_invariants().await;
    b.close().await.unwrap();
}

/// Waits (up to 10 s) until the browser is at a path starting with `prefix`.
async fn wait_for_path(b: &Client, prefix: &str) -> String {
    let since = std::time::Instant::now();
    loop {
        let at = path(b).await;
        if at.starts_with(prefix) {
            return at;
        }
        assert!(
            since.elapsed() < std::time::Duration::from_secs(10),
            "the browser stayed at {at}, not {prefix}…"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_wrong_password_reloaded_is_not_guessed_again() {
    let app = spawn_app().await;
    app.create_admin().await;
    let b = browser().await;
    b.goto(&app.url("/admin/login")).await.unwrap();
    for (id, text) in [
        ("username", crate::helpers::ADMIN_USER),
        ("password", "not the password"),
    ] {
        let field = b.find(Locator::Id(id)).await.unwrap();
        field.send_keys(text).await.unwrap();
    }
    click(&b, "log-in").await;
    let answer = wait_for_path(&b, "/shown/").await;
    b.wait().for_element(Locator::Id("log-in")).await.unwrap();
    // Each guess the server judges leaves rows; a form sent again would leave more.
    let failures = app.count("select count(*) from login_failures").await;
    assert!(failures > 0);
    for _ in 0..2 {
        b.refresh().await.unwrap();
        b.wait().for_element(Locator::Id("log-in")).await.unwrap();
        assert_eq!(path(&b).await, answer);
    }
    assert_eq!(
        app.count("select count(*) from login_failures").await,
        failures,
        "reloading sent the password again"
    );
    b.back().await.unwrap();
    wait_for_path(&b, "/admin/login").await;
    b.close().await.unwrap();
}
