//! Names that look like markup are shown as text on every page.

use fantoccini::Locator;

use super::{body_text, log_in};
use crate::helpers::{browser, spawn_app};

#[tokio::test]
async fn product_names_that_look_like_markup_show_as_text_everywhere() {
    let app = spawn_app().await;
    let names = [
        ("XSS-1", "<script>alert(1)</script>"),
        ("XSS-2", "\"><img src=x onerror=alert(1)>"),
    ];
    for (sku, name) in names {
        app.add_product(sku, name, 1_000, 3).await;
    }
    app.create_admin().await;
    assert_eq!(
        app.post_order("x", &[("XSS-1", 1), ("XSS-2", 1)])
            .await
            .status()
            .as_u16(),
        201
    );
    let order = sqlx::query_scalar!(r#"select id::text as "id!" from orders"#)
        .fetch_one(&app.db)
        .await
        .unwrap();

    let b = browser().await;
    let app = &app;
    let check = |path: String| {
        let b = b.clone();
        async move {
            b.goto(&app.url(&path)).await.unwrap();
            assert!(
                b.get_alert_text().await.is_err(),
                "a dialog opened on {path}"
            );
            assert_no_markup_ran(&b, &path).await;
            let text = body_text(&b).await;
            for (_, name) in names {
                assert!(text.contains(name), "{name} not shown as text on {path}");
            }
        }
    };
    for sku in ["XSS-1", "XSS-2"] {
        b.goto(&app.url(&format!("/products/{sku}"))).await.unwrap();
        b.find(Locator::Id("add-to-cart"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        // The cart page the form leads to: the next `goto` must not race the submit.
        b.wait()
            .for_element(Locator::Css("table.lines"))
            .await
            .unwrap();
    }
    for path in ["/", "/cart"] {
        check(path.to_string()).await;
    }
    b.goto(&app.url("/admin")).await.unwrap();
    log_in(&b).await;
    b.wait()
        .for_element(Locator::Id("units-on-hand"))
        .await
        .unwrap();
    // The dashboard once rendered, and once redrawn by its live script (which says when
    // it last updated).
    check("/admin".into()).await;
    b.wait()
        .for_element(Locator::XPath(
            "//*[@id='live-status'][starts-with(normalize-space(.), 'live · updated')]",
        ))
        .await
        .unwrap();
    assert!(b.get_alert_text().await.is_err());
    assert_no_markup_ran(&b, "/admin, redrawn").await;
    let text = body_text(&b).await;
    assert!(names.iter().all(|(_, n)| text.contains(n)), "{text}");
    for path in [
        "/admin/products".to_string(),
        format!("/admin/orders/{order}"),
    ] {
        check(path).await;
    }
    // And each product's own pages, one name at a time.
    for (sku, name) in names {
        for path in [format!("/products/{sku}"), format!("/admin/products/{sku}")] {
            b.goto(&app.url(&path)).await.unwrap();
            assert!(b.get_alert_text().await.is_err(), "{path}");
            assert!(body_text(&b).await.contains(name), "{path}");
        }
    }
    b.close().await.unwrap();
}

/// Neither name became an element: no `<img src=x>` (whose `onerror` would run) and no
/// `<script>` holding the name's `alert(1)`. With the names also shown as text, they were
/// escaped, whether or not a dialog had opened yet.
async fn assert_no_markup_ran(b: &fantoccini::Client, path: &str) {
    let planted = b
        .execute(
            "return document.querySelectorAll('img[src=\"x\"]').length + \
             [...document.scripts].filter(s => s.textContent.includes('alert(1)')).length;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        planted.as_i64(),
        Some(0),
        "markup from a name ran on {path}"
    );
}
