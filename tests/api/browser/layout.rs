//! Every page fits a phone, a desktop, a 320 px screen and a desktop zoomed to 200 %, and
//! passes axe-core's WCAG 2.1 A/AA rules; the README's screenshots.
//!
//! Zoom is emulated by the window's size in CSS pixels: a 1280×900 window at 200 % lays
//! out as a 640×450 one (the same media queries, the same text in CSS pixels; only the
//! rendering's pixel density differs), and 320 px is WCAG's reflow width (1280 px at
//! 400 %, or a 640 px window at 200 %).

use fantoccini::Locator;

use super::{axe, log_in, save_screenshot};
use crate::helpers::{TestApp, browser, spawn_app};

/// The window sizes: a small phone, a phone, a desktop at 200 %, a desktop.
const WINDOWS: [(u32, u32); 4] = [(320, 640), (390, 844), (640, 450), (1280, 900)];

#[tokio::test]
async fn every_page_fits_a_phone_and_a_desktop() {
    let app = spawn_app().await;
    let (order, hold) = shop_with_an_order_and_a_hold(&app).await;

    let b = browser().await;
    let mut blocking = Vec::new();
    // Error pages and the login form, before the cart and the admin session exist.
    let before_login = ["/products/NO-SUCH-SKU", "/no-such-page", "/admin/login"];
    // A cart with lines, and an admin session.
    for sku in ["CB-BRAID-2M", "DM-WALNUT-90"] {
        b.goto(&app.url(&format!("/products/{sku}"))).await.unwrap();
        b.find(Locator::Id("add-to-cart"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        b.wait()
            .for_element(Locator::Css("table.lines"))
            .await
            .unwrap();
    }
    let mut wider = Vec::new();
    for (width, height) in WINDOWS {
        b.set_window_size(width, height).await.unwrap();
        for page in before_login {
            b.goto(&app.url(page)).await.unwrap();
            wider.extend(overflow(&b, page, width).await);
            if width == 390 || width == 1280 {
                blocking.extend(axe::audit(&b, &format!("{page} at {width} px")).await);
            }
        }
    }
    b.goto(&app.url("/admin")).await.unwrap();
    log_in(&b).await;
    b.wait().for_element(Locator::Css(".stats")).await.unwrap();

    let pages = [
        "/".to_string(),
        "/?q=coffee&category=Coffee&sort=price-high".into(),
        "/products/CB-BRAID-2M".into(),
        "/cart".into(),
        format!("/checkout/{hold}"),
        format!("/orders/{order}"),
        "/admin".into(),
        "/admin/products".into(),
        "/admin/products/new".into(),
        "/admin/products/KB-ALPINE-75".into(),
        "/admin/products/KB-ALPINE-75/ledger".into(),
        "/admin/orders".into(),
        "/admin/orders?q=braid".into(),
        format!("/admin/orders/{order}"),
        "/admin/holds".into(),
        "/admin/api-clients".into(),
        "/admin/webhooks".into(),
        "/admin/deliveries".into(),
    ];
    for (width, height) in WINDOWS {
        b.set_window_size(width, height).await.unwrap();
        for page in &pages {
            b.goto(&app.url(page)).await.unwrap();
            wider.extend(overflow(&b, page, width).await);
            // axe-core on a phone and on a desktop (the zoomed sizes change only layout,
            // which the overflow checks cover).
            if width == 390 || width == 1280 {
                blocking.extend(axe::audit(&b, &format!("{page} at {width} px")).await);
            }
            // The README's screenshots: each page on a phone and on a desktop.
            let shown = match page.as_str() {
                "/" => Some("catalogue"),
                "/products/CB-BRAID-2M" => Some("product"),
                "/cart" => Some("cart"),
                "/admin" => Some("dashboard"),
                "/admin/orders?q=braid" => Some("admin-order-search"),
                checkout if checkout.starts_with("/checkout/") => Some("checkout"),
                _ => None,
            };
            if let Some(name) = shown
                && (width == 390 || width == 1280)
            {
                let device = if width == 390 { "phone" } else { "desktop" };
                save_screenshot(&b, &format!("{name}-{device}.png")).await;
            }
        }
    }
    b.set_window_size(1280, 900).await.unwrap();
    b.close().await.unwrap();
    assert!(
        wider.is_empty() && blocking.is_empty(),
        "wider than the screen: {wider:#?}\nserious or critical WCAG violations: {blocking:#?}"
    );
}

/// The demo catalogue, an admin, an order of two products and a hold of two, and a webhook
/// endpoint with a delivery of the order: every admin list has a row for axe to read.
async fn shop_with_an_order_and_a_hold(app: &TestApp) -> (String, String) {
    app.seed_demo().await;
    app.create_admin().await;
    let types = [stockade::events::EventType::parse("order.placed").unwrap()];
    let url = "https://hooks.example.com/stockade/orders";
    stockade::events::db::insert_endpoint(&app.db, url, &types, "fulfilment", "whsec_layout")
        .await
        .unwrap();
    let order: serde_json::Value = app
        .post_order("fit-order", &[("CB-BRAID-2M", 1), ("MS-DRIFT-WL", 2)])
        .await
        .json()
        .await
        .unwrap();
    let hold: serde_json::Value = app
        .place_hold("fit-hold", &[("LT-ARC-LAMP", 1), ("CF-BEANS-ETH", 3)])
        .await;
    app.wait_for_a_row("select count(*) from deliveries").await;
    (
        order["id"].as_str().unwrap().to_string(),
        hold["id"].as_str().unwrap().to_string(),
    )
}

/// What does not fit the window on the page shown: the page scrolling sideways, an
/// element reaching past either edge (unless a scrolling box it sits in holds it, as a
/// wide table scrolls inside its card), a box cutting off its own content, and a menu
/// too narrow for its chosen option's label.
async fn overflow(b: &fantoccini::Client, page: &str, width: u32) -> Vec<String> {
    let found = b
        .execute(
            r#"
            const vw = document.documentElement.clientWidth;
            const out = [];
            if (window.innerWidth > arguments[0]) out.push(`the window is ${window.innerWidth} px wide`);
            if (document.documentElement.scrollWidth > vw)
              out.push(`the page is ${document.documentElement.scrollWidth} px wide`);
            const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
              (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\s+/).join('.') : '');
            // Deliberately off-screen or clipped: the skip link until focused, text for
            // screen readers only.
            const hidden = (el) => el.closest('.skip, .visually-hidden, [hidden]') ||
              getComputedStyle(el).clip !== 'auto';
            const scrolls = (el) => {
              for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
                const x = getComputedStyle(p).overflowX;
                if (x === 'auto' || x === 'scroll') return true;
              }
              return false;
            };
            for (const el of document.body.querySelectorAll('*')) {
              if (hidden(el)) continue;
              const r = el.getBoundingClientRect();
              if (r.width <= 1 && r.height <= 1) continue;
              if ((r.right > vw + 0.5 || r.left < -0.5) && !scrolls(el))
                out.push(`${name(el)} spans ${Math.round(r.left)}–${Math.round(r.right)} px`);
              const style = getComputedStyle(el);
              const clips = ['hidden', 'clip'].includes(style.overflowX);
              if (clips && el.scrollWidth > el.clientWidth + 1)
                out.push(`${name(el)} cuts off ${el.scrollWidth - el.clientWidth} px of its content`);
            }
            // A menu's label is drawn inside it; measure the chosen option's text in the
            // menu's font, with its padding and arrow.
            const canvas = document.createElement('canvas').getContext('2d');
            for (const select of document.querySelectorAll('select')) {
              const style = getComputedStyle(select);
              canvas.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
              const label = select.options[select.selectedIndex]?.text ?? '';
              const needed = canvas.measureText(label).width + parseFloat(style.paddingLeft) +
                parseFloat(style.paddingRight) + 20;
              if (select.clientWidth < needed - 1)
                out.push(`${name(select)} shows ${Math.round(select.clientWidth)} px of “${label}”, which needs ${Math.round(needed)}`);
            }
            return out;
            "#,
            vec![serde_json::json!(width)],
        )
        .await
        .unwrap();
    found
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("{page} at {width} px: {}", f.as_str().unwrap()))
        .collect()
}
