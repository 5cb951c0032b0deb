//! A drop's queue in the browser: joined from the product page, the place shown and moved
//! on by the page itself (its own refresh, not the test's), and the turn that opens the
//! product's "Add to cart" — at a phone's and a desktop's width; the README's pictures.

use std::time::{Duration, Instant};

use chrono::Utc;
use fantoccini::Locator;
use stockade::drops::{self, NewDrop, Queueing};

use super::{axe, body_text, save_screenshot};
use crate::helpers::{browser, spawn_app};

/// The queue page's state (`data-state`) and shown place, read without reloading it;
/// `None` while the page is between two loads.
async fn queue_state(b: &fantoccini::Client) -> Option<(String, Option<u64>)> {
    let script = "const s = document.getElementById('queue-state'); \
                  const p = document.getElementById('queue-position'); \
                  return s ? [s.dataset.state, p ? p.textContent : null] : null;";
    let value = b.execute(script, vec![]).await.ok()?;
    let pair = value.as_array()?;
    let state = pair.first()?.as_str()?.to_string();
    let place = pair.get(1)?.as_str().and_then(|p| p.trim().parse().ok());
    Some((state, place))
}

#[tokio::test]
async fn a_shopper_queues_sees_the_place_move_and_is_let_in_to_buy_at_phone_and_desktop_widths() {
    let app = spawn_app().await;
    app.add_product("DROP-KEYS", "Numbered Keycap Set", 12_900, 40)
        .await;
    // The browsers first, each with a page loaded: a fresh Chromium may take many seconds
    // over its first page on a busy machine.
    let phone = browser().await;
    phone.set_window_size(390, 844).await.unwrap();
    let desktop = browser().await;
    desktop.set_window_size(1280, 900).await.unwrap();
    for b in [&phone, &desktop] {
        b.goto(&app.url("/")).await.unwrap();
    }
    // First come, first served, one shopper every five seconds from the opening, twelve
    // seconds away (the first let in five seconds after it); the queue open from now.
    let drop = drops::db::create(
        &app.db,
        &NewDrop {
            sku: "DROP-KEYS".into(),
            opens_at: Utc::now() + chrono::Duration::seconds(12),
            prequeue_seconds: 600,
            queueing: Queueing::Fifo,
            admit_per_minute: 12,
            max_active: None,
            session_seconds: 300,
        },
    )
    .await
    .unwrap();
    tokio::time::sleep((drop.binds_at - Utc::now()).to_std().unwrap_or_default()).await;
    // Three shoppers ahead, through the API (a client acting for several buyers).
    let (_, key) = stockade::clients::create(&app.db, "ahead", stockade::clients::Limit::Unlimited)
        .await
        .unwrap();
    for i in 0..3 {
        let res = reqwest::Client::new()
            .post(app.url(&format!("/api/v1/drops/{}/queue", drop.id)))
            .bearer_auth(&key)
            .header("Drop-Shopper", format!("ahead-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 201);
    }

    let shoppers = [(&phone, "phone", 4), (&desktop, "desktop", 5)];
    for (b, width, place) in shoppers {
        // Before the opening: the countdown, and the queue to join.
        b.goto(&app.url("/products/DROP-KEYS")).await.unwrap();
        let text = body_text(b).await;
        assert!(text.contains("On sale at"), "{width}: {text}");
        // Nothing is on sale yet: no stock figure, and the time left counts down.
        assert!(!text.contains("available"), "{width}: {text}");
        assert!(text.contains("Coming soon"), "{width}: {text}");
        let left = b
            .find(Locator::Css("#drop-countdown-left .left"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(left.starts_with("0:00:"), "{width}: {left}");
        // (One selector for either outcome: finding waits for an element to appear.)
        let shown = b
            .find(Locator::Css("#add-to-cart, #join-queue"))
            .await
            .unwrap();
        assert_eq!(
            shown.attr("id").await.unwrap().as_deref(),
            Some("join-queue"),
            "{width}: nothing to add to the cart before the turn"
        );
        b.find(Locator::Id("join-queue"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        b.wait()
            .for_element(Locator::Id("queue-state"))
            .await
            .unwrap();
        assert_eq!(
            queue_state(b).await,
            Some(("waiting".into(), Some(place))),
            "{width}: {}",
            body_text(b).await
        );
        let text = body_text(b).await;
        assert!(
            text.contains(&format!("{} ahead of you", place - 1)),
            "{text}"
        );
        assert!(text.contains("Estimated wait"), "{text}");
    }
    for (b, width, _) in shoppers {
        let blocking = axe::audit(b, &format!("queue page at {width}")).await;
        assert!(blocking.is_empty(), "{width}: {blocking:#?}");
        save_screenshot(b, &format!("drop-queue-{width}.png")).await;
    }

    // The pages move on by themselves: every place they show, until the turn (the phone's
    // twenty seconds after the opening, the desktop's five more).
    let deadline = Instant::now() + Duration::from_secs(60);
    // From the places the join showed (checked above): on a loaded machine the first move
    // may come before this loop starts, and is still a move.
    let mut seen = [vec![shoppers[0].2], vec![shoppers[1].2]];
    let mut admitted = [false, false];
    while admitted.contains(&false) {
        assert!(
            Instant::now() < deadline,
            "not let in within a minute; places seen {seen:?}"
        );
        for (i, (b, _, _)) in shoppers.iter().enumerate() {
            match queue_state(b).await {
                Some((state, _)) if state == "admitted" => admitted[i] = true,
                Some((state, Some(place)))
                    if state == "waiting" && seen[i].last() != Some(&place) =>
                {
                    seen[i].push(place)
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (i, (_, width, _)) in shoppers.iter().enumerate() {
        assert!(
            seen[i].len() >= 2 && seen[i].windows(2).all(|w| w[1] < w[0]),
            "{width}: the place shown moved forward without a reload: {seen:?}"
        );
    }
    save_screenshot(&phone, "drop-admitted-phone.png").await;

    // The turn: the product page, "Add to cart" there, and the unit goes in the cart.
    for (b, width, _) in shoppers {
        b.find(Locator::Id("queue-shop"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        b.wait()
            .for_element(Locator::Id("drop-pass"))
            .await
            .unwrap();
        let add = b.find(Locator::Id("add-to-cart")).await.unwrap();
        assert!(add.is_enabled().await.unwrap(), "{width}");
        add.click().await.unwrap();
        b.wait()
            .for_element(Locator::Css("table.lines"))
            .await
            .unwrap();
        assert!(
            body_text(b).await.contains("Numbered Keycap Set"),
            "{width}"
        );
    }
    save_screenshot(&desktop, "drop-cart-desktop.png").await;

    // The admin's view of the drop while it sells: open, by the clock, under its name.
    app.create_admin().await;
    desktop
        .goto(&app.url(&format!("/admin/drops/{}", drop.id)))
        .await
        .unwrap();
    super::log_in(&desktop).await;
    desktop
        .wait()
        .for_element(Locator::Id("drop-status"))
        .await
        .unwrap();
    let status = desktop
        .find(Locator::Id("drop-status"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(status, "open");
    assert!(
        body_text(&desktop)
            .await
            .contains("Drop of Numbered Keycap Set")
    );
    save_screenshot(&desktop, "admin-drop-open.png").await;
    phone.close().await.unwrap();
    desktop.close().await.unwrap();
}
