//! Findings of the outside audit on identities, text, search and pictures, each proved
//! against the real server: one email spelt many ways is one customer; invisible
//! characters are refused and look-alike categories are one; a search with nothing to
//! search finds nothing and says so, numbers glued to units find the spaced form, and the
//! category counts count what the search finds; a damaged JPEG is refused, quickly.

use std::time::{Duration, Instant};

use serde_json::Value;
use stockade::catalog::Sku;
use stockade::config::Settings;

use crate::helpers::{TestApp, spawn_app, spawn_app_with, test_settings};

/// An app behind a trusted proxy (so each test address is its own shopper), selling
/// `DROP-1` at one per customer.
async fn app_with_a_limited_drop() -> TestApp {
    let app = spawn_app_with(Settings {
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..test_settings().await
    })
    .await;
    app.add_product("DROP-1", "Numbered Drop", 9_900, 10).await;
    stockade::catalog::db::set_purchase_limit(&app.db, &Sku::parse("DROP-1").unwrap(), Some(1))
        .await
        .unwrap();
    app
}

/// An API order of one `DROP-1` from `address` as `email`: its status and body.
async fn order_as(app: &TestApp, key: &str, address: &str, email: &str) -> (u16, String) {
    let res = app
        .client
        .post(app.url("/api/v1/orders"))
        .header("x-forwarded-for", address)
        .header("idempotency-key", key)
        .json(&serde_json::json!({
            "lines": [{"sku": "DROP-1", "quantity": 1}], "email": email
        }))
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

#[tokio::test]
async fn one_gmail_mailbox_spelt_with_dots_a_tag_or_googlemail_is_one_customer() {
    let app = app_with_a_limited_drop().await;
    let (status, body) = order_as(&app, "k1", "192.0.2.1", "alice@gmail.com").await;
    assert_eq!(status, 201, "{body}");
    // Another address, the same mailbox: refused with the limit in words, nothing taken.
    let (status, body) = order_as(&app, "k2", "192.0.2.2", "a.l.i.c.e+x@googlemail.com").await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("limited to 1 per customer"), "{body}");
    let (status, _) = order_as(&app, "k3", "192.0.2.3", "Alice+drop@Gmail.com").await;
    assert_eq!(status, 409);
    assert_eq!(app.stock("DROP-1").await, (9, 0));
    // Someone else at another provider, whose dots matter, still buys.
    let (status, _) = order_as(&app, "k4", "192.0.2.4", "a.lice@example.com").await;
    assert_eq!(status, 201);
    // The order keeps the address as typed, for its receipt; only the identity is folded.
    let emails: Vec<Option<String>> =
        sqlx::query_scalar("select email from orders order by created_at")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(
        emails,
        [
            Some("alice@gmail.com".into()),
            Some("a.lice@example.com".into())
        ]
    );
}

/// PATCHes `sku`'s category through the admin API (logged in, with `csrf`): its status.
async fn file_under(app: &TestApp, csrf: &str, sku: &str, category: &str) -> (u16, String) {
    let res = app
        .client
        .patch(app.url(&format!("/api/v1/admin/products/{sku}")))
        .header("X-CSRF-Token", csrf)
        .json(&serde_json::json!({ "category": category }))
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

async fn category_of(app: &TestApp, sku: &str) -> Option<String> {
    sqlx::query_scalar("select category from products where sku = $1")
        .bind(sku)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn invisible_characters_are_refused_and_categories_that_read_alike_are_one() {
    let app = spawn_app().await;
    for sku in ["MUG-1", "MUG-2", "MUG-3", "MUG-4"] {
        app.add_product(sku, "Mug", 1_000, 5).await;
    }
    let csrf = app.login_admin().await;
    assert_eq!(file_under(&app, &csrf, "MUG-1", "Desk").await.0, 200);
    // A second "Desk" with a zero-width space, or a right-to-left override: refused in a
    // sentence naming the field, and nothing changes.
    for sneaky in ["Desk\u{200B}", "\u{202E}kseD", "\u{FEFF}Desk"] {
        let (status, body) = file_under(&app, &csrf, "MUG-2", sneaky).await;
        assert_eq!(status, 422, "{sneaky:?}: {body}");
        assert!(
            body.contains("category must not contain invisible formatting characters"),
            "{sneaky:?}: {body}"
        );
        assert_eq!(category_of(&app, "MUG-2").await, None, "{sneaky:?}");
    }
    // What reads as "Desk" is filed as "Desk": full-width, another case.
    assert_eq!(file_under(&app, &csrf, "MUG-2", "Ｄｅｓｋ").await.0, 200);
    assert_eq!(file_under(&app, &csrf, "MUG-3", "desk").await.0, 200);
    // A composed and a decomposed "Café" are one category.
    assert_eq!(file_under(&app, &csrf, "MUG-4", "Cafe\u{301}").await.0, 200);
    assert_eq!(category_of(&app, "MUG-4").await.as_deref(), Some("Café"));
    for sku in ["MUG-1", "MUG-2", "MUG-3"] {
        assert_eq!(
            category_of(&app, sku).await.as_deref(),
            Some("Desk"),
            "{sku}"
        );
    }
    let listed: Value = app
        .get("/api/v1/products?category=Caf%C3%A9")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    let (_, html) = app.get_text("/").await;
    assert_eq!(html.matches("<option value=\"Desk\"").count(), 1, "{html}");
    assert!(
        html.contains("Desk <span class=\"muted\">3</span>"),
        "{html}"
    );

    // Every single-line field: an order's name with an override is refused too.
    let res = app
        .client
        .post(app.url("/api/v1/orders"))
        .header("idempotency-key", "bidi")
        .json(&serde_json::json!({
            "lines": [{"sku": "MUG-1", "quantity": 1}], "name": "Ada\u{202E}ecalevol"
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 422);
    let body = res.text().await.unwrap();
    assert!(
        body.contains("Name must not contain invisible formatting"),
        "{body}"
    );
    assert_eq!(app.stock("MUG-1").await, (5, 0));
}

/// A small shop of things measured in units, and a mug.
async fn measured_shop(app: &TestApp) {
    for (sku, name, description, category) in [
        ("CABLE-2M", "Braided Cable, 2 m", "USB-C both ends.", "Desk"),
        ("CHARGER", "Charger 240 W", "Charges a laptop.", "Desk"),
        ("LAMP", "Desk Lamp 12 V", "Warm light.", "Desk"),
        ("MUG", "Stoneware Mug", "A mug with a handle.", "Coffee"),
    ] {
        app.add_product(sku, name, 1_000, 5).await;
        sqlx::query("update products set description = $2, category = $3 where sku = $1")
            .bind(sku)
            .bind(description)
            .bind(category)
            .execute(&app.db)
            .await
            .unwrap();
    }
}

/// The SKUs the product API lists for `query`, and its `X-Total-Count`.
async fn found(app: &TestApp, query: &str) -> (Vec<String>, String) {
    let res = app.get(&format!("/api/v1/products?{query}")).await;
    assert_eq!(res.status().as_u16(), 200, "{query}");
    let total = res.headers()["x-total-count"].to_str().unwrap().to_string();
    let body: Value = res.json().await.unwrap();
    let mut skus: Vec<String> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["sku"].as_str().unwrap().to_string())
        .collect();
    skus.sort();
    (skus, total)
}

#[tokio::test]
async fn a_number_glued_to_its_unit_finds_the_spaced_form() {
    let app = spawn_app().await;
    measured_shop(&app).await;
    for (q, sku) in [
        ("2m", "CABLE-2M"),
        ("240w", "CHARGER"),
        ("12V", "LAMP"),
        ("2 m", "CABLE-2M"),
    ] {
        assert_eq!(found(&app, &format!("q={q}")).await.0, [sku], "{q}");
    }
    assert_eq!(found(&app, "q=cable%202m").await.0, ["CABLE-2M"]);
}

#[tokio::test]
async fn a_search_with_nothing_to_search_for_finds_nothing_and_says_so() {
    let app = spawn_app().await;
    measured_shop(&app).await;
    for q in ["a", "the", "with", "%F0%9F%99%82", "%E2%80%94%E2%80%94"] {
        assert_eq!(
            found(&app, &format!("q={q}")).await,
            (vec![], "0".into()),
            "{q}"
        );
        let (status, html) = app.get_text(&format!("/?q={q}")).await;
        assert_eq!(status, 200);
        assert!(html.contains("Nothing to search for in “"), "{q}: {html}");
        assert!(!html.contains("Stoneware Mug"), "{q}");
    }
    // Stop words among real words are left out, as PostgreSQL leaves them out.
    assert_eq!(found(&app, "q=mug%20with%20a%20handle").await.0, ["MUG"]);
}

#[tokio::test]
async fn category_counts_count_what_the_search_finds() {
    let app = spawn_app().await;
    measured_shop(&app).await;
    let count = |html: &str, category: &str| {
        let at = html
            .find(&format!("{category} <span class=\"muted\">"))
            .expect(category);
        let rest = &html[at + category.len() + 21..];
        rest[..rest.find('<').unwrap()].to_string()
    };
    let (_, html) = app.get_text("/").await;
    assert_eq!(
        (count(&html, "Desk"), count(&html, "Coffee")),
        ("3".into(), "1".into())
    );
    let (_, html) = app.get_text("/?q=zz").await;
    assert_eq!(
        (count(&html, "Desk"), count(&html, "Coffee")),
        ("0".into(), "0".into())
    );
    let (_, html) = app.get_text("/?q=mug").await;
    assert_eq!(
        (count(&html, "Desk"), count(&html, "Coffee")),
        ("0".into(), "1".into())
    );
    let (_, html) = app.get_text("/?q=240w&category=Coffee").await;
    assert_eq!(
        (count(&html, "Desk"), count(&html, "Coffee")),
        ("1".into(), "0".into())
    );
    // Every category stays in the menu, so a search can move to one it finds things in.
    assert!(html.contains("<option value=\"Desk\""), "{html}");
}

/// A `width` × `height` JPEG of noise, which compresses as badly as a photo.
fn noisy_jpeg(width: u32, height: u32) -> Vec<u8> {
    let mut seed = 11u32;
    let picture = image::RgbImage::from_fn(width, height, |_, _| {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let [a, b, c, _] = seed.to_be_bytes();
        image::Rgb([a, b, c])
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 80)
        .encode_image(&picture)
        .unwrap();
    out
}

/// POSTs `file` as the picture of `sku`, as the admin's form does.
async fn upload(app: &TestApp, sku: &str, csrf: &str, file: &[u8]) -> reqwest::Response {
    const BOUNDARY: &str = "----stockade-audit-boundary";
    let mut body = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\n{csrf}\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"p.jpg\"\r\n\
         Content-Type: image/jpeg\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(file);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    app.client
        .post(app.url(&format!("/admin/products/{sku}/image")))
        .header(
            "Content-Type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_damaged_jpeg_is_refused_quickly_and_stores_nothing() {
    let app = spawn_app().await;
    app.add_product("PIC-1", "Tray", 4_500, 5).await;
    let csrf = app.login_admin().await;
    let whole = noisy_jpeg(100, 80);
    // 769 bytes whose frame header (SOF0: FF C0, length, precision, height, width) says
    // 6000 × 6000, holding the start of a 100 × 80 picture's data.
    let mut vast = whole.clone();
    let sof = vast.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
    vast[sof + 5..sof + 9].copy_from_slice(&[0x17, 0x70, 0x17, 0x70]);
    vast.truncate(769);
    // The picture itself, cut off two thirds of the way through.
    let mut cut = whole.clone();
    cut.truncate(whole.len() * 2 / 3);
    for (file, says) in [
        (
            vast,
            "declares 6000 × 6000 pixels, more than 769 bytes can hold",
        ),
        (cut, "could not be read; it may be damaged"),
    ] {
        let started = Instant::now();
        let res = upload(&app, "PIC-1", &csrf, &file).await;
        assert!(started.elapsed() < Duration::from_millis(500), "{says}");
        assert_eq!(res.status().as_u16(), 422, "{says}");
        let text = res.text().await.unwrap();
        assert!(text.contains(says), "{says}: {text}");
        let pictures = app.count("select count(*) from product_images").await;
        assert_eq!(pictures, 0, "{says}");
    }
    // The whole picture is taken.
    assert_eq!(
        upload(&app, "PIC-1", &csrf, &whole).await.status().as_u16(),
        303
    );
}

#[tokio::test]
async fn every_stop_word_is_one_postgresql_leaves_out() {
    let app = spawn_app().await;
    for word in stockade::catalog::browse::STOP_WORDS {
        let nodes: i32 = sqlx::query_scalar("select numnode(to_tsquery('english', $1 || ':*'))")
            .bind(word)
            .fetch_one(&app.db)
            .await
            .unwrap();
        assert_eq!(nodes, 0, "PostgreSQL searches for {word:?}");
    }
}
