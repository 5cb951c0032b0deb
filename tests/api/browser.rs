//! Pages in a real headless Chromium.

mod admin;
mod answers;
mod axe;
mod drop;
mod keyboard;
mod layout;
mod markup;
mod pay;
mod shop;

use fantoccini::Locator;

use crate::helpers::docs_dir;

/// Saves under `target/screenshots/`, and into `docs/` when `UPDATE_DOCS_SCREENSHOTS=1`.
pub async fn save_screenshot(b: &fantoccini::Client, name: &str) {
    let png = b.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG image");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), &png).unwrap();
    if std::env::var("UPDATE_DOCS_SCREENSHOTS").as_deref() == Ok("1") {
        std::fs::create_dir_all(docs_dir()).unwrap();
        std::fs::write(docs_dir().join(name), &png).unwrap();
    }
}

/// Fills in the checkout's name, `email` and shipping address.
pub async fn fill_details(b: &fantoccini::Client, email: &str) {
    for (field, value) in [("name", "Grace"), ("email", email)] {
        let element = b.find(Locator::Id(field)).await.unwrap();
        element.send_keys(value).await.unwrap();
    }
    fill_address(b).await;
}

/// Fills in the checkout's shipping address (the tests' [`crate::shop::ADDRESS`]).
pub async fn fill_address(b: &fantoccini::Client) {
    for (field, value) in crate::shop::ADDRESS {
        let element = b.find(Locator::Id(field)).await.unwrap();
        match field {
            "country" => element.select_by_value(value).await.unwrap(),
            _ => element.send_keys(value).await.unwrap(),
        }
    }
}

/// The visible text of the page.
async fn body_text(b: &fantoccini::Client) -> String {
    b.find(Locator::Css("body"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Fills in the login form, if the browser is on it.
async fn log_in(b: &fantoccini::Client) {
    b.wait().for_element(Locator::Id("log-in")).await.unwrap();
    b.find(Locator::Id("username"))
        .await
        .unwrap()
        .send_keys(crate::helpers::ADMIN_USER)
        .await
        .unwrap();
    b.find(Locator::Id("password"))
        .await
        .unwrap()
        .send_keys(crate::helpers::ADMIN_PASSWORD)
        .await
        .unwrap();
    b.find(Locator::Id("log-in"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}
