//! Product pictures: the admin's upload, what it refuses, and how the shop serves them.

use std::io::Cursor;

use crate::helpers::{TestApp, spawn_app};

const BOUNDARY: &str = "----stockade-test-boundary";

/// POSTs the upload form as a browser would: `csrf`, then the file.
async fn upload(app: &TestApp, sku: &str, csrf: &str, file: &[u8]) -> reqwest::Response {
    let mut body = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\n{csrf}\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"p.png\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
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

/// A `width` × `height` PNG of a gradient.
fn png(width: u32, height: u32) -> Vec<u8> {
    let picture = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x % 256) as u8, (y % 256) as u8, 120])
    });
    let mut out = Vec::new();
    picture
        .write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

/// A 70-byte PNG that declares `side` × `side` pixels and holds none.
fn bomb(side: u32) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let ihdr = [
        &side.to_be_bytes()[..],
        &side.to_be_bytes(),
        &[8, 6, 0, 0, 0],
    ]
    .concat();
    for (kind, data) in [
        (&b"IHDR"[..], ihdr),
        (
            b"IDAT",
            vec![0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
        ),
        (b"IEND", Vec::new()),
    ] {
        png.extend((data.len() as u32).to_be_bytes());
        let body = [kind, &data].concat();
        png.extend(&body);
        png.extend(crc32(&body).to_be_bytes());
    }
    png
}

async fn stored(app: &TestApp, sku: &str) -> Option<(Vec<u8>, String)> {
    sqlx::query!(
        "select image, image_etag from product_images where sku = $1",
        sku
    )
    .fetch_optional(&app.db)
    .await
    .unwrap()
    .map(|r| (r.image, r.image_etag))
}

#[tokio::test]
async fn an_uploaded_picture_is_resized_and_served_with_an_etag_and_304() {
    let app = spawn_app().await;
    app.add_product("PIC-1", "Walnut Tray, 30 cm", 4_500, 5)
        .await;
    let csrf = app.login_admin().await;

    // Without a picture: the letter placeholder, and no picture to fetch.
    let (_, html) = app.get_text("/").await;
    assert!(html.contains(r#"<span class="card-art" aria-hidden="true">W</span>"#));
    assert_eq!(app.get("/products/PIC-1/image").await.status(), 404);

    let res = upload(&app, "PIC-1", &csrf, &png(1200, 900)).await;
    assert_eq!(res.status().as_u16(), 303, "{}", res.text().await.unwrap());
    let res = app.get("/products/PIC-1/image").await;
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.headers()["content-type"], "image/jpeg");
    assert!(
        res.headers()["cache-control"]
            .to_str()
            .unwrap()
            .contains("max-age")
    );
    let etag = res.headers()["etag"].to_str().unwrap().to_string();
    let picture = image::load_from_memory(&res.bytes().await.unwrap()).unwrap();
    assert_eq!((picture.width(), picture.height()), (800, 600));
    let thumb = app.get("/products/PIC-1/thumb").await;
    let thumb_etag = thumb.headers()["etag"].to_str().unwrap().to_string();
    assert_ne!(thumb_etag, etag);
    let thumb = image::load_from_memory(&thumb.bytes().await.unwrap()).unwrap();
    assert_eq!((thumb.width(), thumb.height()), (320, 240));

    // A client that has it gets 304 and no body; one with an old copy gets the new one.
    let again = app
        .client
        .get(app.url("/products/PIC-1/image"))
        .header("If-None-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 304);
    assert_eq!(again.headers()["etag"], etag.as_str());
    assert!(again.bytes().await.unwrap().is_empty());
    let stale = app
        .client
        .get(app.url("/products/PIC-1/image"))
        .header("If-None-Match", "\"something-else\"")
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status().as_u16(), 200);

    // The pages show it in place of the letter: in the catalogue beside the name (so
    // without a text of its own), on the product's page named for the product.
    let (_, html) = app.get_text("/").await;
    assert!(
        html.contains(r#"src="/products/PIC-1/thumb?v="#) && html.contains(r#"alt="""#),
        "{html}"
    );
    assert!(!html.contains(r#"aria-hidden="true">W</span>"#));
    assert!(
        html.contains("<span class=\"card-name\">Walnut Tray, 30\u{a0}cm</span>"),
        "the number keeps its unit: {html}"
    );
    let (_, html) = app.get_text("/products/PIC-1").await;
    assert!(html.contains(r#"src="/products/PIC-1/image?v="#), "{html}");
    assert!(html.contains(r#"alt="Walnut Tray, 30 cm""#), "{html}");
    // Asked for by its current version, it is kept a year.
    let version = html.split(r#"/products/PIC-1/image?v="#).nth(1).unwrap();
    let version = &version[..version.find('"').unwrap()];
    let res = app.get(&format!("/products/PIC-1/image?v={version}")).await;
    assert_eq!(
        res.headers()["cache-control"],
        "public, max-age=31536000, immutable"
    );

    let api: serde_json::Value = app
        .get("/api/v1/products/PIC-1")
        .await
        .json()
        .await
        .unwrap();
    assert!(
        api["image_url"]
            .as_str()
            .unwrap()
            .starts_with("/products/PIC-1/image?v="),
        "{api}"
    );

    // A new picture is a new ETag.
    let res = upload(&app, "PIC-1", &csrf, &png(300, 300)).await;
    assert_eq!(res.status().as_u16(), 303);
    let res = app
        .client
        .get(app.url("/products/PIC-1/image"))
        .header("If-None-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200, "the old ETag no longer matches");
}

#[tokio::test]
async fn a_non_image_an_oversized_file_and_a_decompression_bomb_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    app.add_product("PIC-2", "Tray", 4_500, 5).await;
    let csrf = app.login_admin().await;
    assert_eq!(
        upload(&app, "PIC-2", &csrf, &png(200, 100))
            .await
            .status()
            .as_u16(),
        303
    );
    let before = stored(&app, "PIC-2").await.expect("a picture");

    let bomb = bomb(50_000);
    assert!(bomb.len() < 100, "a tiny file");
    let mut gif = b"GIF89a".to_vec();
    gif.extend([1, 0, 1, 0, 0, 0, 0]);
    let mut cut = png(200, 100);
    cut.truncate(cut.len() / 2);
    for (file, status, says) in [
        (
            b"just some text".to_vec(),
            422,
            "not a PNG, JPEG or WebP picture",
        ),
        (gif, 422, "not a PNG, JPEG or WebP picture"),
        (Vec::new(), 422, "the file is empty"),
        (cut, 422, "could not be read"),
        (bomb, 422, "too big to open"),
        // One byte over is as much too large as a body past the cap: 413 both ways.
        (vec![0x89; 5 * 1024 * 1024 + 1], 413, "larger than 5 MB"),
        (
            vec![0x89; 5 * 1024 * 1024 + 100 * 1024],
            413,
            "larger than 5 MB",
        ),
    ] {
        let res = upload(&app, "PIC-2", &csrf, &file).await;
        assert_eq!(res.status().as_u16(), status, "{says}");
        let text = res.text().await.unwrap();
        assert!(text.contains(says), "{says}: {text}");
        assert_eq!(
            stored(&app, "PIC-2").await.as_ref(),
            Some(&before),
            "{says}"
        );
    }

    // Without the admin's token, or without an admin, nothing is stored either.
    app.add_product("PIC-3", "Other", 100, 1).await;
    let res = upload(&app, "PIC-3", "not-the-token", &png(50, 50)).await;
    assert_eq!(res.status().as_u16(), 403);
    let anonymous = crate::helpers::client();
    let res = anonymous
        .post(app.url("/admin/products/PIC-3/image"))
        .header(
            "Content-Type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body("x")
        .send()
        .await
        .unwrap();
    assert!(
        res.status().is_redirection() || res.status() == 403,
        "{}",
        res.status()
    );
    assert_eq!(stored(&app, "PIC-3").await, None);
    // A body that is not a multipart form is refused: as cross-site without the token,
    // as the wrong kind of body with it.
    let not_a_form = |token: String| {
        app.client
            .post(app.url("/admin/products/PIC-3/image"))
            .header("Content-Type", "text/plain")
            .header("X-CSRF-Token", token)
            .body("hello")
            .send()
    };
    assert_eq!(
        not_a_form("none".into()).await.unwrap().status().as_u16(),
        403
    );
    assert_eq!(
        not_a_form(csrf.clone()).await.unwrap().status().as_u16(),
        415
    );
    assert_eq!(stored(&app, "PIC-3").await, None);
}

#[tokio::test]
async fn every_demo_product_shows_a_picture_of_its_own() {
    let app = spawn_app().await;
    app.seed_demo().await;
    let (_, html) = app.get_text("/").await;
    let mut etags = std::collections::HashSet::new();
    for (sku, ..) in stockade::seed::DEMO_CATALOGUE {
        assert!(
            html.contains(&format!("src=\"/products/{sku}/thumb?v=")),
            "{sku}"
        );
        let res = app.get(&format!("/products/{sku}/thumb")).await;
        assert_eq!(res.status().as_u16(), 200, "{sku}");
        etags.insert(res.headers()["etag"].to_str().unwrap().to_string());
        image::load_from_memory(&res.bytes().await.unwrap()).unwrap();
    }
    assert_eq!(etags.len(), stockade::seed::DEMO_CATALOGUE.len());
    assert!(
        !html.contains(r#"class="card-art" aria-hidden"#),
        "no letters left"
    );
}

#[tokio::test]
async fn a_hidden_products_picture_shows_in_the_admin_but_not_in_the_shop() {
    let app = spawn_app().await;
    app.add_product("PIC-OFF", "Retired Mug", 1_500, 2).await;
    let csrf = app.login_admin().await;
    let res = upload(&app, "PIC-OFF", &csrf, &png(400, 400)).await;
    assert_eq!(res.status().as_u16(), 303);
    sqlx::query("update products set active = false where sku = 'PIC-OFF'")
        .execute(&app.db)
        .await
        .unwrap();

    assert_eq!(app.get("/products/PIC-OFF/thumb").await.status(), 404);
    let (_, html) = app.get_text("/admin/products/PIC-OFF").await;
    assert!(
        html.contains(r#"<img class="admin-thumb" src="/admin/products/PIC-OFF/thumb""#),
        "{html}"
    );
    let thumb = app.get("/admin/products/PIC-OFF/thumb").await;
    assert_eq!(thumb.status().as_u16(), 200);
    // Never kept: a replaced picture shows at once under the same address.
    assert_eq!(thumb.headers()["cache-control"], "no-store");
    let thumb = image::load_from_memory(&thumb.bytes().await.unwrap()).unwrap();
    assert_eq!((thumb.width(), thumb.height()), (320, 320));

    // Only to the admin.
    let stranger = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let res = stranger
        .get(app.url("/admin/products/PIC-OFF/thumb"))
        .send()
        .await
        .unwrap();
    assert_ne!(res.status().as_u16(), 200);
}
