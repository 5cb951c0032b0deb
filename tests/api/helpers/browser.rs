//! Headless Chromium, driven through one chromedriver per test run.
//!
//! chromedriver and every Chromium it launches carry the run's mark, so the exit hook
//! ends them all, including the browsers of sessions a failed test never closed.

use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::sync::OnceCell;

use super::{processes, servers};

static CHROMEDRIVER_URL: OnceCell<String> = OnceCell::const_new();

/// A headless Chromium session driven through chromedriver (started once per run).
pub async fn browser() -> fantoccini::Client {
    let url = CHROMEDRIVER_URL
        .get_or_init(|| async {
            servers().await; // registers the exit hook that ends chromedriver and its Chromium
            let port = stockade::local::free_port().unwrap();
            let mut command = Command::new("chromedriver");
            command.arg(format!("--port={port}"));
            let log = servers().await.root.join("chromedriver.log");
            let out = std::fs::File::create(&log).unwrap();
            let child = processes::marked(&mut command)
                .stdout(Stdio::from(out.try_clone().unwrap()))
                .stderr(Stdio::from(out))
                .spawn()
                .expect(
                    "chromedriver not found: install chromium and chromium-driver (make test does)",
                );
            let pid = child.id();
            processes::own(child);
            let url = format!("http://127.0.0.1:{port}");
            // Patient: on a loaded machine chromedriver may take seconds to listen.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if let Err(e) = stockade::children::check_alive("chromedriver", pid, &log) {
                    panic!("{e:#}");
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "chromedriver did not listen on port {port} within a minute"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            url
        })
        .await;
    let profile = servers().await.fresh_dir("chrome");
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium_binary(),
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-quic",
                "--window-size=1280,900",
                format!("--user-data-dir={}", profile.display()),
            ]
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let client = fantoccini::ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(url)
        .await
        .expect("browser session");
    // Finding an element waits for it to appear (a page a click leads to may still be
    // loading on a busy machine); a test that must see an element absent asks for a
    // selector that matches either outcome instead.
    client
        .update_timeouts(fantoccini::wd::TimeoutConfiguration::new(
            Some(Duration::from_secs(60)),
            Some(Duration::from_secs(60)),
            Some(FIND_WITHIN),
        ))
        .await
        .expect("browser timeouts");
    client
}

/// How long finding an element waits for it.
const FIND_WITHIN: Duration = Duration::from_secs(20);

fn chromium_binary() -> String {
    [
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
        "/usr/bin/google-chrome",
    ]
    .iter()
    .find(|p| std::path::Path::new(p).exists())
    .unwrap_or(&"/usr/bin/chromium")
    .to_string()
}
