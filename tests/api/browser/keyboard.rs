//! The shop with a keyboard alone: from the catalogue to a placed order with Tab, Enter,
//! Space (and typing), every stop where it should be and visibly focused; and a hold's
//! countdown that a screen reader hears once a minute, not every second.

use fantoccini::Locator;
use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;

use super::save_screenshot;
use crate::helpers::{browser, spawn_app, spawn_app_with, test_settings};

/// Presses each key in turn, as a keyboard does (down, then up), wherever the focus is.
async fn press(b: &fantoccini::Client, keys: &[char]) {
    let mut actions = KeyActions::new("keyboard".into());
    for &value in keys {
        actions = actions
            .then(KeyAction::Down { value })
            .then(KeyAction::Up { value });
    }
    b.perform_actions(actions).await.unwrap();
}

/// Types `text` into whatever has the focus.
async fn type_text(b: &fantoccini::Client, text: &str) {
    press(b, &text.chars().collect::<Vec<_>>()).await;
}

/// Presses Tab and checks the focus landed on `expected` (a CSS selector), visibly.
async fn tab_to(b: &fantoccini::Client, expected: &str) {
    press(b, &[Key::Tab.into()]).await;
    assert_focused(b, expected).await;
}

/// The focused element matches `expected`, matches `:focus-visible`, and shows an
/// outline or a ring that nothing around it cuts off, on screen.
async fn assert_focused(b: &fantoccini::Client, expected: &str) {
    let found = b
        .execute(
            r#"
            const el = document.activeElement;
            const s = getComputedStyle(el);
            const r = el.getBoundingClientRect();
            const outline = s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0;
            const ring = s.boxShadow !== 'none';
            // How far the indicator reaches past the element (an inset one: not at all).
            const reach = outline ? Math.max(0, parseFloat(s.outlineWidth) + parseFloat(s.outlineOffset)) : 0;
            let clippedBy = null;
            for (let p = el.parentElement; p && p !== document.documentElement; p = p.parentElement) {
              const ps = getComputedStyle(p);
              if (ps.overflowX === 'visible' && ps.overflowY === 'visible') continue;
              const c = p.getBoundingClientRect();
              if (r.left - reach < c.left - 0.5 || r.right + reach > c.right + 0.5 ||
                  r.top - reach < c.top - 0.5 || r.bottom + reach > c.bottom + 0.5) {
                clippedBy = p.tagName.toLowerCase() + (p.className ? '.' + p.className : '');
                break;
              }
            }
            return {
              matches: el.matches(arguments[0]),
              what: el.outerHTML.slice(0, 160),
              visible: el.matches(':focus-visible') && (outline || ring),
              clippedBy,
              onScreen: r.width > 0 && r.height > 0 && r.top >= 0 && r.left >= 0 &&
                r.bottom <= innerHeight + 1 && r.right <= innerWidth + 1,
            };
            "#,
            vec![serde_json::json!(expected)],
        )
        .await
        .unwrap();
    assert_eq!(
        found["matches"], true,
        "expected the focus on {expected}, found {}",
        found["what"]
    );
    assert_eq!(
        found["visible"], true,
        "{expected} has no visible focus indicator"
    );
    assert!(
        found["clippedBy"].is_null(),
        "{expected}'s focus indicator is cut off by {}",
        found["clippedBy"]
    );
    assert_eq!(found["onScreen"], true, "{expected} is focused off screen");
}

/// The page's first Tab stop is the skip link; Enter on it moves the focus to the
/// page's content, from where the next Tab goes on.
async fn skip_to_content(b: &fantoccini::Client) {
    skip_to_content_pictured(b, None).await;
}

/// [`skip_to_content`], saving a screenshot (`name`) while the skip link has the focus.
async fn skip_to_content_pictured(b: &fantoccini::Client, name: Option<&str>) {
    tab_to(b, "a.skip[href='#main']").await;
    let text = b.active_element().await.unwrap().text().await.unwrap();
    assert_eq!(text, "Skip to content");
    if let Some(name) = name {
        save_screenshot(b, name).await;
    }
    press(b, &[Key::Enter.into()]).await;
    // The content is a landmark, not a control: it takes the focus without a ring.
    let on_main = b
        .execute("return document.activeElement.id === 'main';", vec![])
        .await
        .unwrap();
    assert_eq!(on_main, true, "the skip link moved the focus to <main>");
}

/// The text of the element `css`, as the page holds it (WebDriver's own text turns
/// no-break spaces into spaces).
async fn text_of(b: &fantoccini::Client, css: &str) -> String {
    b.wait().for_element(Locator::Css(css)).await.unwrap();
    let text = b
        .execute(
            "return document.querySelector(arguments[0]).textContent;",
            vec![serde_json::json!(css)],
        )
        .await
        .unwrap();
    text.as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_shopper_checks_out_with_the_keyboard_alone() {
    let app = spawn_app().await;
    app.add_product("KB-MUG-350", "Stoneware Mug, 350 ml", 1_800, 4)
        .await;
    let b = browser().await;

    // The catalogue: past the header, through the search form, to the product.
    b.goto(&app.url("/")).await.unwrap();
    skip_to_content_pictured(&b, Some("focus-skip-link.png")).await;
    for field in ["#q", "#category", "#sort", "#search"] {
        tab_to(&b, field).await;
    }
    tab_to(&b, "a.card-link[href='/products/KB-MUG-350']").await;
    save_screenshot(&b, "focus-product-card.png").await;
    press(&b, &[Key::Enter.into()]).await;

    // The product: quantity, then Space on "Add to cart".
    b.wait()
        .for_element(Locator::Css("h1.product-name"))
        .await
        .unwrap();
    skip_to_content(&b).await;
    tab_to(&b, ".crumbs a[href='/']").await;
    tab_to(&b, "#quantity").await;
    tab_to(&b, "#add-to-cart").await;
    press(&b, &[Key::Space.into()]).await;

    // The cart: the line's link, quantity, Update, Remove, "Keep shopping", Checkout.
    b.wait()
        .for_element(Locator::Css("table.lines"))
        .await
        .unwrap();
    skip_to_content(&b).await;
    tab_to(&b, "table.lines a[href='/products/KB-MUG-350']").await;
    tab_to(&b, "#q-KB-MUG-350").await;
    tab_to(&b, ".inline-form button").await;
    tab_to(&b, "button.button-link").await;
    tab_to(&b, ".actions a[href='/']").await;
    tab_to(&b, "#checkout").await;
    press(&b, &[Key::Enter.into()]).await;

    // Checkout: a name, an email the server refuses, an address, and Enter on "Place
    // order".
    b.wait().for_element(Locator::Id("name")).await.unwrap();
    assert!(
        text_of(&b, "table.lines").await.contains("350\u{a0}ml"),
        "the name keeps its number and unit together"
    );
    skip_to_content(&b).await;
    tab_to(&b, "#name").await;
    type_text(&b, "Ada").await;
    tab_to(&b, "#email").await;
    type_text(&b, "ada@localhost").await;
    // The shipping address, field by field; the country chosen by typing its name.
    tab_to(&b, "#line1").await;
    type_text(&b, "12 St James's Square").await;
    tab_to(&b, "#line2").await;
    tab_to(&b, "#postal_code").await;
    type_text(&b, "SW1Y 4JH").await;
    tab_to(&b, "#city").await;
    type_text(&b, "London").await;
    tab_to(&b, "#country").await;
    type_text(&b, "United Kingdom").await;
    tab_to(&b, "#place-order").await;
    press(&b, &[Key::Enter.into()]).await;

    // Refused: the focus is back on the email field, which is marked invalid and
    // described by the reason beside it.
    b.wait()
        .for_element(Locator::Id("email-error"))
        .await
        .unwrap();
    assert_focused(&b, "#email[aria-invalid='true']").await;
    let described_by = b
        .execute(
            "const by = document.activeElement.getAttribute('aria-describedby');
             return by && document.getElementById(by)?.textContent;",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        described_by
            .as_str()
            .is_some_and(|t| t.contains("does not look like an email address")),
        "the email field is described by its error: {described_by}"
    );
    save_screenshot(&b, "focus-checkout-error.png").await;
    let name = b.find(Locator::Id("name")).await.unwrap();
    assert_eq!(name.prop("value").await.unwrap().as_deref(), Some("Ada"));
    assert_eq!(name.attr("aria-invalid").await.unwrap(), None);

    // Corrected, and placed with Space on "Place order".
    press(&b, &[Key::End.into()]).await;
    press(&b, &vec![Key::Backspace.into(); "localhost".len()]).await;
    type_text(&b, "example.com").await;
    // The address came back as typed.
    for field in ["#line1", "#line2", "#postal_code", "#city", "#country"] {
        tab_to(&b, field).await;
    }
    tab_to(&b, "#place-order").await;
    press(&b, &[Key::Space.into()]).await;

    b.wait().for_element(Locator::Id("order-id")).await.unwrap();
    assert!(text_of(&b, "h1").await.contains("Thank you, Ada!"));
    assert!(text_of(&b, "table.lines").await.contains("350\u{a0}ml"));
    tab_to(&b, "a.skip[href='#main']").await;
    let email: Option<String> = sqlx::query_scalar("select email from orders")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(email.as_deref(), Some("ada@example.com"));
    b.close().await.unwrap();
}

/// A checkout page for a hold of `ttl`, counting every change of its ticking figure and
/// of its status region from when it opened; returns the seconds it showed then.
async fn watched_checkout(
    ttl: std::time::Duration,
) -> (crate::helpers::TestApp, fantoccini::Client, u64) {
    let mut settings = test_settings().await;
    settings.hold_ttl = ttl;
    let app = spawn_app_with(settings).await;
    app.add_product("KB-CLOCK", "Desk Clock", 4_000, 2).await;
    let hold = app.place_hold("clock-hold", &[("KB-CLOCK", 1)]).await;
    let b = browser().await;
    b.goto(&app.url(&format!("/checkout/{}", hold["id"].as_str().unwrap())))
        .await
        .unwrap();
    let start = b
        .execute(
            "window.changes = {ticks: 0, spoken: []};
             const status = document.getElementById('countdown-status');
             new MutationObserver(() => changes.ticks++).observe(
               document.getElementById('time-left'), {childList: true, characterData: true, subtree: true});
             new MutationObserver(() => changes.spoken.push(status.textContent)).observe(
               status, {childList: true, characterData: true, subtree: true});
             return document.getElementById('time-left').textContent;",
            vec![],
        )
        .await
        .unwrap();
    let start = seconds(start.as_str().unwrap());
    (app, b, start)
}

/// `"1:05"` → 65.
fn seconds(shown: &str) -> u64 {
    let (m, s) = shown.split_once(':').unwrap();
    m.parse::<u64>().unwrap() * 60 + s.parse::<u64>().unwrap()
}

#[tokio::test]
async fn the_hold_countdown_speaks_once_a_minute_not_every_second() {
    // Past a minute's mark a few seconds after the page opens.
    let (_app, b, start) = watched_checkout(std::time::Duration::from_secs(75)).await;
    assert!(
        start > 60,
        "the page opened {start} s before the hold's end"
    );
    let spoken_at_first = b
        .execute(
            "return document.getElementById('minutes-left').textContent;",
            vec![],
        )
        .await
        .unwrap();

    // The figure ticks past the minute's mark, and a little further.
    let time_left = b.find(Locator::Id("time-left")).await.unwrap();
    let past = std::time::Instant::now() + std::time::Duration::from_secs(start + 30);
    loop {
        let shown = time_left.text().await;
        // `text()` is what is rendered; the figure is hidden only from screen readers.
        if shown.is_ok_and(|t| !t.is_empty() && seconds(&t) <= 57) {
            break;
        }
        assert!(std::time::Instant::now() < past, "the countdown stalled");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let changes = b.execute("return window.changes;", vec![]).await.unwrap();
    assert!(
        changes["ticks"].as_u64().unwrap() >= 3,
        "the figure ticked: {changes}"
    );
    assert_eq!(
        changes["spoken"],
        serde_json::json!(["1 minute left to place your order."]),
        "one announcement, at the minute's mark"
    );
    let roles = b
        .execute(
            "return [document.getElementById('time-left').getAttribute('aria-hidden'),
                     document.getElementById('countdown-status').getAttribute('role'),
                     document.getElementById('minutes-left').textContent];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(roles, serde_json::json!(["true", "status", "1 minute"]));
    assert_eq!(
        spoken_at_first, "2 minutes",
        "whole minutes for a screen reader"
    );
    b.close().await.unwrap();
}

#[tokio::test]
async fn the_hold_countdown_says_once_when_the_hold_runs_out() {
    let (_app, b, start) = watched_checkout(std::time::Duration::from_secs(8)).await;
    assert!(start > 0, "the page opened after the hold's end");
    b.wait()
        .at_most(std::time::Duration::from_secs(start + 30))
        .for_element(Locator::Css("#countdown-expired:not([hidden])"))
        .await
        .unwrap();
    let changes = b.execute("return window.changes;", vec![]).await.unwrap();
    let expired = text_of(&b, "#countdown-expired").await;
    assert!(expired.starts_with("Your reservation has expired."));
    assert_eq!(
        changes["spoken"],
        serde_json::json!([expired]),
        "said once, when it ran out: {changes}"
    );
    b.close().await.unwrap();
}
