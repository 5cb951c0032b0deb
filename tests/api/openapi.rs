//! The API contract: the served OpenAPI document describes every API route, and
//! schemathesis, fuzzing a running app from that document, finds no server error, no
//! response the document does not describe, and no request the document allows that the
//! server refuses (`positive_data_acceptance`), the admin API's included.

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

/// What schemathesis runs in each call (a hooks file, `SCHEMATHESIS_HOOKS`): what the
/// document cannot say is handled here, each for a stated reason, and nothing else.
const HOOKS: &str = r#"
import itertools
import re

import schemathesis

RECEIVER = "{receiver}"
CAPS = {"/api/v1/orders": {line_cap}, "/api/v1/holds": {hold_cap}}
KEY = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?\Z")
unique = itertools.count()


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    # A key reused with another body is refused (422) by design, and the fuzzer repeats
    # simple keys: each valid key gets a suffix that keeps it valid, so no two calls share one.
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and KEY.match(key):
        suffix = f"~{next(unique)}"
        case.headers["Idempotency-Key"] = key[: 255 - len(suffix)] + suffix
    # Webhooks go to the test's receiver only. The document given to the fuzzer allows only
    # its URL; a URL it makes up to break that rule loses its colons, so it is no URL at all
    # (and still breaks the rule): nothing is looked up, nothing is sent anywhere else.
    if case.operation.path == "/api/v1/admin/webhooks" and isinstance(case.body, dict):
        url = case.body.get("url")
        if isinstance(url, str) and url != RECEIVER and ":" in url:
            case.body["url"] = url.replace(":", "")


def integral_float(value):
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, dict):
        return any(integral_float(v) for v in value.values())
    if isinstance(value, list):
        return any(integral_float(v) for v in value)
    return False


@schemathesis.hook
def filter_failure(ctx, failure, case, response):
    # JSON Schema's `integer` takes `1.0`; the API refuses it where a whole number goes and
    # says so in the document's description, which JSON Schema cannot state as a rule. A 422
    # for a body holding such a number is excused (test `edges::a_whole_number_written_…`).
    if response.status_code == 422 and integral_float(case.body):
        return False
    # Lines naming one SKU are merged, and the sum must be within the cap: a rule across
    # items that JSON Schema cannot state. Only a 422 for a body that breaks it is excused.
    cap = CAPS.get(case.operation.path)
    if cap is None or response.status_code != 422 or not isinstance(case.body, dict):
        return True
    totals = {}
    for line in case.body.get("lines") or []:
        if isinstance(line, dict) and isinstance(line.get("sku"), str):
            sku, quantity = line["sku"].strip().upper(), line.get("quantity")
            if isinstance(quantity, int) and not isinstance(quantity, bool):
                totals[sku] = totals.get(sku, 0) + quantity
    return not any(total > cap for total in totals.values())
"#;

/// A webhook receiver on 127.0.0.1: answers every request 200 and closes.
async fn receiver() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 16 * 1024];
                let _ = conn.read(&mut buf).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    format!("http://127.0.0.1:{port}/hook")
}

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_no_server_error_and_no_response_off_the_contract() {
    let exe = schemathesis();
    let hook = receiver().await;
    let settings = Settings {
        api_anonymous_orders: false,
        // So the receiver on 127.0.0.1 is a valid target; the hooks keep every other out.
        webhook_allow_private: true,
        ..test_settings().await
    };
    let limits = openapi::Limits::of(&settings);
    let app = spawn_app_with(settings).await;
    app.seed_demo().await;
    let (_, key) = clients::create(&app.db, "schemathesis", Limit::Unlimited)
        .await
        .unwrap();
    // An admin session, so the admin API is fuzzed past its login.
    app.create_admin().await;
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
    // The served document, narrowed to this shop: SKUs that exist (any other is refused
    // 422, which is the shop's state, not the format), and webhooks to the receiver only.
    let mut doc: serde_json::Value = app.get("/api/v1/openapi.json").await.json().await.unwrap();
    let skus: Vec<String> =
        sqlx::query_scalar("select sku from products where active order by sku")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert!(!skus.is_empty(), "the demo shop has products");
    let schemas = &mut doc["components"]["schemas"];
    assert!(schemas["SkuInput"]["pattern"].is_string() && schemas["WebhookUrl"].is_object());
    schemas["SkuInput"] = serde_json::json!({"type": "string", "enum": skus});
    schemas["WebhookUrl"] = serde_json::json!({"type": "string", "const": hook});
    // A drop's opening: from now on (a past time is refused 422, which is the clock, not
    // the format).
    assert!(schemas["NewDropBody"]["properties"]["opens_at"]["pattern"].is_string());
    schemas["NewDropBody"]["properties"]["opens_at"] =
        serde_json::json!({"type": "string", "pattern": "^\\+[0-9]{1,7}$"});
    // The session's CSRF token, as the document's own header parameter: a `--header` would
    // put it back on the requests that leave it out to test that it is required.
    for item in doc["paths"].as_object_mut().unwrap().values_mut() {
        for op in item.as_object_mut().unwrap().values_mut() {
            let params = op.get_mut("parameters").and_then(|p| p.as_array_mut());
            for param in params.into_iter().flatten() {
                if param["name"] == "X-CSRF-Token" {
                    param["schema"] = serde_json::json!({"type": "string", "const": csrf});
                }
            }
        }
    }
    let doc_path = dir.path().join("openapi.json");
    std::fs::write(&doc_path, doc.to_string()).unwrap();
    let hooks = dir.path().join("hooks.py");
    let hooks_py = HOOKS
        .replace("{receiver}", &hook)
        .replace("{line_cap}", &limits.line_quantity.to_string())
        .replace(
            "{hold_cap}",
            &limits.line_quantity.min(limits.hold_per_sku).to_string(),
        );
    std::fs::write(&hooks, hooks_py).unwrap();
    let started = Instant::now();
    let out = stockade::children::mark_tokio(&mut tokio::process::Command::new(&exe))
        .current_dir(dir.path())
        .args([
            "run",
            doc_path.to_str().unwrap(),
            "--url",
            &app.address,
            "--max-examples",
            EXAMPLES_PER_OPERATION,
            // One worker: with more, schemathesis 4.32 trips over its own threads now and
            // then (a "Runtime Error" that is not about the app).
            "--workers",
            "1",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_headers_conformance,response_schema_conformance,\
             positive_data_acceptance,negative_data_rejection,missing_required_header,unsupported_method,\
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
        .env("SCHEMATHESIS_HOOKS", &hooks)
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
    // It made endpoints (the admin API was fuzzed past its checks), every one to the receiver.
    let urls: Vec<String> = sqlx::query_scalar("select url from webhook_endpoints")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert!(!urls.is_empty(), "no webhook endpoint was made");
    assert!(urls.iter().all(|u| *u == hook), "{urls:?}");
}

#[tokio::test]
async fn confirming_a_hold_with_a_body_that_is_not_an_object_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.add_product("CONFIRM-1", "Confirmable", 1_000, 5).await;
    let hold = app.place_hold("hold-1", &[("CONFIRM-1", 2)]).await;
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
