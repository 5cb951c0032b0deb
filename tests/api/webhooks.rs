//! Webhook targets against an outside audit: a name that flips to 127.0.0.1 between the
//! check and the connection never reaches it, the IPv6 forms of private addresses are
//! refused, refusals spell the host as typed, a private receiver's answer is not shown,
//! and the new-endpoint form redirects and makes one endpoint however often it is sent,
//! none while Redis cannot keep its secret.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::helpers::{TestApp, spawn_app, spawn_app_with, spawn_app_with_own_redis, test_settings};
use stockade::events::target::{Lookup, Resolver};

/// A receiver on 127.0.0.1 that counts the webhook requests it gets (`POST /hooks`) and
/// answers each 200 with `body`.
///
/// Requests, not connections: its port was free a moment before, and a port another test
/// let go of may still be dialled by what that test left running (an app's database probe
/// reconnecting to a stopped proxy), so other connections can arrive and are ignored.
struct Listener {
    port: u16,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Listener {
    async fn start(body: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    // The whole request (headers, then content-length bytes) before the
                    // answer, so the sender never sees its request cut off.
                    let mut got = Vec::new();
                    let mut buf = [0; 4096];
                    while !whole_request(&got) {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    if !got.starts_with(b"POST /hooks ") {
                        return;
                    }
                    // Counted before the answer, so a sender that has its answer is counted.
                    counter.fetch_add(1, Ordering::SeqCst);
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    stream.write_all(answer.as_bytes()).await.ok();
                    stream.shutdown().await.ok();
                });
            }
        });
        Self {
            port,
            requests,
            task,
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Whether `got` holds a request's headers and all of its body.
fn whole_request(got: &[u8]) -> bool {
    let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let headers = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    let length: usize = headers
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    got.len() >= end + 4 + length
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until the only delivery is settled (sent or failed); its status and last error.
async fn settled(app: &TestApp) -> (i64, String, Option<String>) {
    let started = Instant::now();
    loop {
        let row: Option<(i64, String, Option<String>)> = sqlx::query_as(
            "select id, status, last_error from deliveries where status <> 'pending'",
        )
        .fetch_optional(&app.db)
        .await
        .unwrap();
        if let Some(row) = row {
            return row;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the delivery was not settled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_name_that_flips_to_loopback_between_check_and_connect_never_reaches_it() {
    // The process's own dispatcher stays idle; the one made below, with a name server
    // that flips, sends instead.
    let mut settings = test_settings().await;
    settings.webhook_allow_private = false;
    settings.dispatch_interval = Duration::from_secs(3_600);
    let app = spawn_app_with(settings.clone()).await;
    let csrf = app.login_admin().await;
    let listener = Listener::start("the internal service's answer").await;

    // The audit's name server: a public address when the endpoint is made, 127.0.0.1 at
    // every send after it. (No public answer at send time: the test talks to nothing
    // beyond this machine.)
    let lookups = Arc::new(AtomicUsize::new(0));
    let counter = lookups.clone();
    let lookup: Lookup = Arc::new(move |_host: String| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let ip: IpAddr = if n == 0 {
            "93.184.215.14".parse().unwrap()
        } else {
            "127.0.0.1".parse().unwrap()
        };
        Box::pin(async move { Ok(vec![SocketAddr::new(ip, 0)]) })
    });
    let url = format!("http://rebind.example:{}/hooks", listener.port);
    Resolver::with_lookup(lookup.clone(), false)
        .check(&url)
        .await
        .expect("the name is public when the endpoint is made");
    let types = [stockade::events::EventType::OrderPlaced];
    let secret = stockade::events::sign::new_secret();
    stockade::events::db::insert_endpoint(&app.db, &url, &types, "rebinding", &secret)
        .await
        .unwrap();

    let mut sending = settings.clone();
    sending.dispatch_interval = Duration::from_millis(20);
    sending.delivery_max_attempts = 1;
    sending.webhook_timeout = Duration::from_secs(1);
    stockade::events::dispatch::Dispatcher::new(
        app.db.clone(),
        Arc::new(sending),
        Arc::new(stockade::metrics::Metrics::new()),
        None,
    )
    .unwrap()
    .looking_up_with(lookup)
    .unwrap()
    .spawn();

    app.add_product("RB-P", "Rebound", 100, 5).await;
    assert_eq!(app.post_order("rb-1", &[("RB-P", 1)]).await.status(), 201);
    let mut refusals = 0;
    for send in 1..=20 {
        let (id, status, error) = settled(&app).await;
        assert_eq!(status, "failed", "send {send}: {error:?}");
        let error = error.unwrap_or_default();
        if error.contains("resolves to 127.0.0.1, which is not a public address") {
            refusals += 1;
        }
        if send < 20 {
            let res = app
                .client
                .post(app.url(&format!("/api/v1/admin/webhooks/deliveries/{id}/resend")))
                .header("x-csrf-token", &csrf)
                .send()
                .await
                .unwrap();
            assert!(res.status().is_success(), "resend {send}: {}", res.status());
        }
    }
    assert_eq!(listener.requests(), 0, "a send reached 127.0.0.1");
    assert_eq!(
        refusals, 20,
        "every send the name server sent to 127.0.0.1 is refused"
    );
    assert_eq!(
        lookups.load(Ordering::SeqCst),
        21,
        "one lookup when made and one per send: nothing looks the name up again"
    );
    let page: Value = app
        .get("/api/v1/admin/webhooks/deliveries")
        .await
        .json()
        .await
        .unwrap();
    assert!(!page.to_string().contains("internal service"), "{page}");
}

/// Asks the API to make an endpoint for `url`; the status and the problem's detail.
async fn create(app: &TestApp, csrf: &str, url: &str) -> (u16, String) {
    let res = app
        .client
        .post(app.url("/api/v1/admin/webhooks"))
        .header("x-csrf-token", csrf)
        .json(&json!({ "url": url, "event_types": ["order.placed"] }))
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let body: Value = res.json().await.unwrap();
    (
        status,
        body["detail"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test]
async fn ipv6_forms_of_loopback_and_site_local_addresses_are_refused_as_targets() {
    let mut settings = test_settings().await;
    settings.webhook_allow_private = false;
    let app = spawn_app_with(settings).await;
    let csrf = app.login_admin().await;
    for url in [
        // IPv4-compatible 127.0.0.1, 6to4 of 127.0.0.1, site-local, NAT64 of 10.0.0.1.
        "http://[::127.0.0.1]/hooks",
        "http://[2002:7f00:1::]/hooks",
        "http://[fec0::1]/hooks",
        "http://[64:ff9b::a00:1]/hooks",
    ] {
        let (status, detail) = create(&app, &csrf, url).await;
        assert_eq!(status, 422, "{url}: {detail}");
        assert!(detail.contains("not a public address"), "{url}: {detail}");
    }
    assert_eq!(app.count("select count(*) from webhook_endpoints").await, 0);
}

#[tokio::test]
async fn refusals_spell_the_host_as_it_was_typed() {
    let mut settings = test_settings().await;
    settings.webhook_allow_private = false;
    let app = spawn_app_with(settings).await;
    let csrf = app.login_admin().await;
    let (status, detail) = create(&app, &csrf, "http://localhost/hooks").await;
    assert_eq!(status, 422);
    assert!(
        detail.starts_with("The host localhost resolves to "),
        "{detail}"
    );
    // Resolved or not (it depends on /etc/hosts), the name keeps its small letter.
    let (status, detail) = create(&app, &csrf, "http://ip6-localhost/hooks").await;
    assert_eq!(status, 422);
    assert!(detail.starts_with("The host ip6-localhost "), "{detail}");

    let key = form_key(&app).await;
    let res = app
        .admin_post(
            "/admin/webhooks",
            &[
                ("csrf", &csrf),
                ("key", &key),
                ("url", "http://localhost/hooks"),
                ("event_types", "order.placed"),
            ],
        )
        .await;
    assert_eq!(res.status().as_u16(), 422);
    let page = res.text().await.unwrap();
    assert!(page.contains("The host localhost resolves to"), "{page}");
    assert!(!page.contains("Localhost"), "{page}");
}

#[tokio::test]
async fn a_private_receivers_answer_is_not_shown_in_the_deliveries() {
    // The tests' settings allow private receivers, as a shop's own network may.
    let app = spawn_app().await;
    app.login_admin().await;
    let listener = Listener::start("db_password=hunter2").await;
    let url = format!("http://127.0.0.1:{}/hooks", listener.port);
    let types = [stockade::events::EventType::OrderPlaced];
    let secret = stockade::events::sign::new_secret();
    stockade::events::db::insert_endpoint(&app.db, &url, &types, "inside", &secret)
        .await
        .unwrap();
    app.add_product("PA-P", "Private answer", 100, 5).await;
    assert_eq!(app.post_order("pa-1", &[("PA-P", 1)]).await.status(), 201);
    let (_, status, error) = settled(&app).await;
    assert_eq!(status, "sent", "{error:?}");
    assert_eq!(listener.requests(), 1);
    let api = app
        .get("/api/v1/admin/webhooks/deliveries")
        .await
        .text()
        .await
        .unwrap();
    assert!(!api.contains("hunter2"), "{api}");
    assert!(
        api.contains("not kept: the receiver is on a private address"),
        "{api}"
    );
    let (_, page) = app.get_text("/admin/deliveries").await;
    assert!(!page.contains("hunter2"), "{page}");
}

/// The idempotency key the new-endpoint form carries.
pub async fn form_key(app: &TestApp) -> String {
    let (status, html) = app.get_text("/admin/webhooks").await;
    assert_eq!(status, 200);
    let marker = r#"name="key" value=""#;
    let start = html.find(marker).expect("the form carries a key") + marker.len();
    html[start..start + html[start..].find('"').unwrap()].to_string()
}

#[tokio::test]
async fn the_new_endpoint_form_redirects_and_sending_it_again_makes_no_second_endpoint() {
    let app = spawn_app().await;
    let csrf = app.login_admin().await;
    let key = form_key(&app).await;
    let url = "http://127.0.0.1:9/hooks";
    let first = new_endpoint(&app, &csrf, &key, url).await;
    assert_eq!(first.status().as_u16(), 303);
    let location = first.headers()["location"].to_str().unwrap().to_string();
    assert!(location.starts_with("/admin/webhooks?done="), "{location}");
    // A reload of the answer, or a second press, sends the same form again.
    let again = new_endpoint(&app, &csrf, &key, url).await;
    assert_eq!(again.status().as_u16(), 303);
    assert_eq!(again.headers()["location"].to_str().unwrap(), location);
    assert_eq!(app.count("select count(*) from webhook_endpoints").await, 1);

    let res = app.get(&location).await;
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.headers()["cache-control"], "no-store");
    let html = res.text().await.unwrap();
    assert!(
        html.contains("Endpoint http://127.0.0.1:9/hooks is ready."),
        "{html}"
    );
    let marker = r#"<code id="new-secret">"#;
    let start = html.find(marker).expect("the secret is shown") + marker.len();
    let secret = &html[start..start + html[start..].find('<').unwrap()];
    assert!(secret.starts_with("whsec_"), "{secret}");
    let stored: String = sqlx::query_scalar("select secret from webhook_endpoints")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(secret, stored, "the secret shown is the endpoint's");

    // Shown once: reloading the page says it was made, and not the secret.
    let (_, reloaded) = app.get_text(&location).await;
    assert!(reloaded.contains("is ready."), "{reloaded}");
    assert!(
        reloaded.contains(
            "Its signing secret was shown once, on the first visit to this page; if it is lost, \
             delete the endpoint and make a new one."
        ),
        "{reloaded}"
    );
    assert!(!reloaded.contains(secret), "the secret is shown only once");

    // The same form with other values is refused, and nothing is made.
    let res = new_endpoint(&app, &csrf, &key, "http://127.0.0.1:10/hooks").await;
    assert_eq!(res.status().as_u16(), 422);
    assert_eq!(app.count("select count(*) from webhook_endpoints").await, 1);
}

#[tokio::test]
async fn without_redis_the_new_endpoint_form_makes_nothing_and_says_so_and_works_once_it_is_back() {
    let mut app = spawn_app_with_own_redis().await;
    let csrf = app.login_admin().await;
    let made_before = form_key(&app).await;
    let first = new_endpoint(&app, &csrf, &made_before, "http://127.0.0.1:9/a").await;
    assert_eq!(first.status().as_u16(), 303);
    let unseen = first.headers()["location"].to_str().unwrap().to_string();
    let key = form_key(&app).await;

    app.stop_redis();
    let sentence = "The endpoint was not made: its signing secret could not be kept to show it \
                    to you. Please try again in a moment.";
    let res = new_endpoint(&app, &csrf, &key, "http://127.0.0.1:9/b").await;
    assert_eq!(res.status().as_u16(), 503);
    assert!(res.headers().contains_key("retry-after"));
    let body = res.text().await.unwrap();
    assert!(body.contains(sentence), "{body}");
    assert_eq!(app.count("select count(*) from webhook_endpoints").await, 1);
    // The page of the endpoint made before says what it knows: not that the secret was shown.
    let (status, page) = app.get_text(&unseen).await;
    assert_eq!(status, 200);
    assert!(
        page.contains(
            "Its signing secret could not be read just now; reload this page in a moment to see it."
        ),
        "{page}"
    );
    assert!(!page.contains("was shown once"), "{page}");

    // The refused form's key was not used up: sent again once Redis is back, it makes the
    // endpoint (the breaker lets Redis calls through again within a few seconds).
    app.restart_redis().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let made = loop {
        let res = new_endpoint(&app, &csrf, &key, "http://127.0.0.1:9/b").await;
        match res.status().as_u16() {
            303 => break res,
            503 if Instant::now() < deadline => {
                assert!(res.text().await.unwrap().contains(sentence));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("{other}: {}", res.text().await.unwrap()),
        }
    };
    let location = made.headers()["location"].to_str().unwrap().to_string();
    let (_, page) = app.get_text(&location).await;
    assert!(page.contains(r#"<code id="new-secret">whsec_"#), "{page}");
    assert_eq!(app.count("select count(*) from webhook_endpoints").await, 2);
}

/// Sends the new-endpoint form with `key` for `url`.
async fn new_endpoint(app: &TestApp, csrf: &str, key: &str, url: &str) -> reqwest::Response {
    let fields = [
        ("csrf", csrf),
        ("key", key),
        ("url", url),
        ("event_types", "order.placed"),
        ("description", "fulfilment"),
    ];
    app.admin_post("/admin/webhooks", &fields).await
}
