//! The API contract: the served OpenAPI document describes every API route, and
//! schemathesis, fuzzing a running app from that document, finds no server error and no
//! response the document does not describe.

use std::path::PathBuf;
use std::time::Instant;

use stockade::clients::{self, Limit};
use stockade::config::Settings;
use stockade::http::openapi;

use crate::helpers::*;

/// The pinned schemathesis the Makefile installs (`make deps-test`).
fn schemathesis() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/schemathesis");
    assert!(
        exe.exists(),
        "{} is missing: `make deps-test` installs schemathesis into .venv/",
        exe.display()
    );
    exe
}

/// Examples per operation and phase: enough to reach every status, small enough for CI
/// (about 30 s on a busy 2-core machine).
const EXAMPLES_PER_OPERATION: &str = "30";

#[tokio::test]
async fn the_served_contract_is_openapi_3_1_and_lists_every_api_route() {
    let app = spawn_app().await;
    let res = app.get("/api/v1/openapi.json").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/json");
    let doc: serde_json::Value = res.json().await.expect("the document is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(openapi::operations(&doc), openapi::api_routes());
    // Every operation lists its errors, and an order's include the ones a client causes.
    let post_orders = &doc["paths"]["/api/v1/orders"]["post"]["responses"];
    for status in ["201", "400", "401", "409", "422", "429", "503"] {
        assert!(
            post_orders.get(status).is_some(),
            "POST /api/v1/orders does not document {status}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_no_server_error_and_no_response_off_the_contract() {
    let exe = schemathesis();
    let app = spawn_app_with(Settings {
        api_anonymous_orders: false,
        ..test_settings().await
    })
    .await;
    app.seed_demo().await;
    let (_, key) = clients::create(&app.db, "schemathesis", Limit::Unlimited)
        .await
        .unwrap();
    // An admin session, so the admin API is fuzzed past its login.
    stockade::admin::create_admin(&app.db, ADMIN_USER, ADMIN_PASSWORD)
        .await
        .unwrap();
    let admin_id = stockade::admin::authenticate(&app.db, ADMIN_USER, ADMIN_PASSWORD)
        .await
        .unwrap()
        .expect("the admin exists");
    let session = stockade::admin::start_session(&app.db, admin_id)
        .await
        .unwrap();
    let csrf = stockade::admin::session(&app.db, &session)
        .await
        .unwrap()
        .expect("the session is live")
        .csrf;
    // Its working files go to a folder of its own, with the credentials for each security
    // scheme of the document (so it can also leave them out, and expect 401).
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("schemathesis.toml"),
        format!(
            "[auth.openapi.{}]\nbearer = \"{key}\"\n\n[auth.openapi.{}]\napi_key = \"{session}\"\n",
            openapi::API_KEY_SCHEME,
            openapi::ADMIN_SCHEME
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = tokio::process::Command::new(&exe)
        .current_dir(dir.path())
        .args([
            "run",
            &app.url("/api/v1/openapi.json"),
            "--url",
            &app.address,
            "--header",
            &format!("X-CSRF-Token: {csrf}"),
            "--max-examples",
            EXAMPLES_PER_OPERATION,
            // One worker: with more, schemathesis 4.32 trips over its own threads now and
            // then (a "Runtime Error" that is not about the app).
            "--workers",
            "1",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_headers_conformance,response_schema_conformance,\
             negative_data_rejection,missing_required_header,unsupported_method,\
             allow_header_conformance,ignored_auth,ensure_resource_availability",
            "--suppress-health-check",
            "too_slow,filter_too_much",
            "--request-timeout",
            "20",
            "--generation-database",
            ":memory:",
            "--no-color",
        ])
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .output()
        .await
        .expect("schemathesis runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "schemathesis ({EXAMPLES_PER_OPERATION} examples per operation) took {:.1} s\n{stdout}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{stdout}\n{stderr}"
    );
    // Whatever it sent, the stock is still consistent.
    app.assert_invariants().await;
}

#[tokio::test]
async fn confirming_a_hold_with_a_body_that_is_not_an_object_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.add_product("CONFIRM-1", "Confirmable", 1_000, 5).await;
    let hold: serde_json::Value = client()
        .post(app.url("/api/v1/holds"))
        .header("Idempotency-Key", "hold-1")
        .json(&serde_json::json!({"lines": [{"sku": "CONFIRM-1", "quantity": 2}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = hold["id"].as_str().expect("the hold was placed");
    // serde reads `[email, name]` as the struct too; the API takes an object or nothing.
    for body in [
        "[null, null]",
        "[\"ada@example.com\", \"Ada\"]",
        "\"x\"",
        "3",
    ] {
        let res = client()
            .post(app.url(&format!("/api/v1/holds/{id}/confirm")))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 422, "{body}");
        let problem: serde_json::Value = res.json().await.unwrap();
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("must be a JSON object"),
            "{problem}"
        );
    }
    let hold: serde_json::Value = app
        .get(&format!("/api/v1/holds/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(hold["state"], "active");
    assert_eq!(app.stock("CONFIRM-1").await, (5, 2));
}
