//! Clients that stop halfway: a request head or body that does not arrive in time is
//! answered 408 in words and its connection closed; a head that did arrive is served
//! however late the server reads it.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{client, serve_app, spawn_app_with, test_settings};

/// Sends `sent` over a raw connection, then waits; returns what the server said, how long
/// it took to answer after the last byte was sent, and whether it then closed the
/// connection.
async fn stall_after(address: &str, sent: &[&str]) -> (String, Duration, bool) {
    let addr = address.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    for part in sent {
        conn.write_all(part.as_bytes()).await.unwrap();
    }
    let sent = Instant::now();
    let (answer, closed) = read_until_closed(&mut conn, sent + Duration::from_secs(5)).await;
    (answer, sent.elapsed(), closed)
}

/// What the server writes on `conn` until it closes it, or until `until` (the bounds under
/// test are well within); whether it closed.
async fn read_until_closed(conn: &mut tokio::net::TcpStream, until: Instant) -> (String, bool) {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let mut closed = false;
    while let Ok(read) = tokio::time::timeout_at(until.into(), conn.read(&mut buf)).await {
        match read {
            Ok(0) | Err(_) => {
                closed = true;
                break;
            }
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

/// The JSON body of a whole answer.
fn problem(answer: &str) -> serde_json::Value {
    let (_, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

#[tokio::test]
async fn a_head_that_never_comes_or_stops_halfway_gets_408_in_words_and_a_closed_connection() {
    let mut settings = test_settings().await;
    settings.head_timeout = Duration::from_millis(500);
    let app = spawn_app_with(settings).await;
    for (sent, instance) in [
        (&[][..], ""),
        (
            &["GET /api/v1/products?page=2 HTTP/1.1\r\nHost: 127.0.0.1\r\n"][..],
            "/api/v1/products",
        ),
        (&["\r\n", "POST /admin/lo"][..], ""),
    ] {
        let (answer, took, closed) = stall_after(&app.address, sent).await;
        assert!(
            answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{sent:?}: {answer}"
        );
        let head = answer.to_lowercase();
        assert!(
            head.contains("content-type: application/problem+json"),
            "{answer}"
        );
        assert!(head.contains("connection: close"), "{answer}");
        assert!(head.contains("x-request-id: "), "{answer}");
        let problem = problem(&answer);
        assert_eq!(problem["status"], 408, "{answer}");
        assert_eq!(problem["instance"], instance, "{answer}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("did not arrive within 500 ms"), "{answer}");
        assert!(closed, "{sent:?}: the connection is closed");
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(3),
            "{sent:?}: answered after {took:?}"
        );
    }
    // A head sent in pieces, whole before its deadline, is served; so is a second request
    // on the kept-alive connection however long after the first it comes (within the
    // keep-alive): the deadline is the first head's.
    let addr = app.address.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    for part in ["GET /healthz HTTP/1.1\r\n", "Host: 127.0.0.1\r\n", "\r\n"] {
        conn.write_all(part.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut first = [0u8; 12];
    conn.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut rest = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&rest).contains("\r\n\r\n") {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "the first answer is whole");
        rest.extend_from_slice(&buf[..n]);
    }
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (second, closed) =
        read_until_closed(&mut conn, Instant::now() + Duration::from_secs(5)).await;
    assert!(second.contains("HTTP/1.1 200"), "{second}");
    assert!(closed);
}

#[tokio::test]
async fn a_paused_server_answers_the_requests_that_arrived_while_it_was_stopped() {
    let app = spawn_app_with(test_settings().await).await;
    let extra = [("STOCKADE_HEAD_TIMEOUT_MS", "1000".to_string())];
    let server = serve_app(&app, &extra, &[]).await;
    let addr = server.address.trim_start_matches("http://").to_string();
    // Connections the server has accepted and begun to wait on, before it stops.
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.pause().unwrap();
    for conn in &mut conns {
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
    }
    // Stopped for more than the head's deadline, with every request waiting in full.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.resume().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    for (i, conn) in conns.iter_mut().enumerate() {
        let (answer, closed) = read_until_closed(conn, until).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "connection {i}: {answer:?}"
        );
        assert!(closed, "connection {i}");
    }
    // And a fresh one is served as ever.
    let res = client()
        .get(format!("{}/healthz", server.address))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
}

#[tokio::test]
async fn a_body_that_stops_halfway_gets_408_and_a_closed_connection_in_time() {
    let mut settings = test_settings().await;
    settings.body_timeout = Duration::from_millis(500);
    let app = spawn_app_with(settings).await;
    app.add_product("GOOD-1", "Good", 1_000, 5).await;
    let json = r#"{"lines": [{"sku": "GOOD-1", "quantity": 1}]}"#;
    let form = "csrf=x&username=ada&password=correct+horse+battery+staple";
    for (path, content_type, body) in [
        ("/api/v1/orders", "application/json", json),
        ("/admin/login", "application/x-www-form-urlencoded", form),
    ] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n\
             Idempotency-Key: stalled-1\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let (answer, took, closed) =
            stall_after(&app.address, &[&head, &body[..body.len() / 2]]).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(
            answer.contains("did not arrive within 500 ms"),
            "{path}: {answer}"
        );
        assert!(
            answer.to_lowercase().contains("connection: close"),
            "{path}: {answer}"
        );
        assert!(closed, "{path}: the connection is closed");
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(3),
            "{path}: answered after {took:?}"
        );
    }
    assert_eq!(app.count("select count(*) from orders").await, 0);
    assert_eq!(app.count("select count(*) from idempotency_keys").await, 0);
    // A whole body sent at once is unaffected.
    let res = app.post_order("whole", &[("GOOD-1", 1)]).await;
    assert_eq!(res.status().as_u16(), 201);
}
