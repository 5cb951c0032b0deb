//! The settings' parsing, bounds and relations, and `.env.example` kept in step.

use super::*;

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn sentinels_replace_redis_url_and_must_each_be_host_and_port() {
    let s = Settings::from_vars(vars(&[
        ("DATABASE_URL", "postgres://u@h/db"),
        (
            "STOCKADE_REDIS_SENTINELS",
            "10.0.0.1:26379, sentinel-2:26379,",
        ),
        ("STOCKADE_REDIS_MASTER", "shop"),
    ]))
    .unwrap();
    assert_eq!(s.redis_sentinels, ["10.0.0.1:26379", "sentinel-2:26379"]);
    assert_eq!(s.redis_master, "shop");
    assert!(!s.local_mode(), "Sentinels stand in for REDIS_URL");
    for bad in ["sentinel-1", ":26379", "host:port", "host:70000"] {
        let err = Settings::from_vars(vars(&[("STOCKADE_REDIS_SENTINELS", bad)])).unwrap_err();
        assert!(
            err.to_string().contains("STOCKADE_REDIS_SENTINELS"),
            "{bad}: {err}"
        );
    }
    let err =
        Settings::from_vars(vars(&[("STOCKADE_DATABASE_REPLICA_URL", "mysql://x")])).unwrap_err();
    assert!(err.to_string().contains("STOCKADE_DATABASE_REPLICA_URL"));
}

#[test]
fn defaults_apply_when_nothing_is_set() {
    let s = Settings::from_vars(vars(&[("PATH", "/bin")])).unwrap();
    assert_eq!(s.listen.port(), 8080);
    assert_eq!(s.order_strategy, OrderStrategy::Batched);
    assert!(s.local_mode());
}

#[test]
fn values_are_read() {
    let s = Settings::from_vars(vars(&[
        ("STOCKADE_LISTEN", "0.0.0.0:9000"),
        ("STOCKADE_ORDER_STRATEGY", "pg-atomic"),
        ("DATABASE_URL", "postgres://a@b/c"),
        ("REDIS_URL", "redis://127.0.0.1:6379"),
        ("STOCKADE_DB_POOL_SIZE", "4"),
    ]))
    .unwrap();
    assert_eq!(s.listen.port(), 9000);
    assert_eq!(s.order_strategy, OrderStrategy::PgAtomic);
    assert_eq!(s.db_pool_size, 4);
    assert!(!s.local_mode());
}

#[test]
fn malformed_values_name_the_variable() {
    for (var, value) in [
        ("STOCKADE_LISTEN", "localhost"),
        ("STOCKADE_ORDER_STRATEGY", "yolo"),
        ("STOCKADE_DB_POOL_SIZE", "0"),
        ("STOCKADE_DB_POOL_SIZE", "many"),
        ("STOCKADE_LOCAL_PG_PORT", "70000"),
        ("DATABASE_URL", "mysql://x"),
        ("STOCKADE_STATEMENT_TIMEOUT_MS", "-5"),
    ] {
        let err = Settings::from_vars(vars(&[(var, value)])).unwrap_err();
        assert!(err.to_string().starts_with(var), "{var}={value}: {err}");
    }
}

#[test]
fn timeouts_must_fit_inside_each_other_and_the_request_budget() {
    let err = Settings::from_vars(vars(&[
        ("STOCKADE_TX_TIMEOUT_MS", "4000"),
        ("STOCKADE_REQUEST_BUDGET_MS", "5000"),
    ]))
    .unwrap_err();
    assert!(
        err.to_string().contains("STOCKADE_REQUEST_BUDGET_MS"),
        "{err}"
    );
    let err = Settings::from_vars(vars(&[("STOCKADE_STATEMENT_TIMEOUT_MS", "2500")])).unwrap_err();
    assert!(err.to_string().contains("STOCKADE_TX_TIMEOUT_MS"), "{err}");
    let err = Settings::from_vars(vars(&[("STOCKADE_LEASE_TTL_MS", "50")])).unwrap_err();
    assert!(err.to_string().contains("STOCKADE_LEASE_TTL_MS"), "{err}");
    // A TTL shorter than the transaction is fine: the holder renews it.
    Settings::from_vars(vars(&[("STOCKADE_LEASE_TTL_MS", "300")])).unwrap();
}

#[test]
fn trusted_proxies_are_addresses_and_ranges_of_both_families() {
    let s = Settings::from_vars(vars(&[(
        "STOCKADE_TRUSTED_PROXIES",
        "127.0.0.1, 10.0.0.0/8,fd00::/8, ::1",
    )]))
    .unwrap();
    let trusted = |a: &str| s.is_trusted_proxy(a.parse().unwrap());
    assert!(trusted("127.0.0.1") && trusted("::ffff:127.0.0.1"));
    assert!(trusted("10.255.3.4") && trusted("fd12::1") && trusted("::1"));
    assert!(!trusted("127.0.0.2") && !trusted("11.0.0.1") && !trusted("fe80::1"));
    assert!(!Settings::default().is_trusted_proxy("127.0.0.1".parse().unwrap()));
    let all: IpNet = "0.0.0.0/0".parse().unwrap();
    assert!(all.contains("203.0.113.9".parse().unwrap()));
    for bad in [
        "10.0.0.0/33",
        "::/129",
        "localhost",
        "10.0.0/8",
        "1.2.3.4/x",
    ] {
        let err = Settings::from_vars(vars(&[("STOCKADE_TRUSTED_PROXIES", bad)])).unwrap_err();
        assert!(
            err.to_string().starts_with("STOCKADE_TRUSTED_PROXIES"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn metrics_and_body_settings_are_read_and_checked() {
    let s = Settings::from_vars(vars(&[
        ("STOCKADE_METRICS_LISTEN", "127.0.0.1:9090"),
        ("STOCKADE_METRICS_TOKEN", "0123456789abcdef0123"),
        ("STOCKADE_BODY_TIMEOUT_MS", "2500"),
    ]))
    .unwrap();
    assert_eq!(s.metrics_listen, Some("127.0.0.1:9090".parse().unwrap()));
    assert_eq!(s.metrics_token.as_deref(), Some("0123456789abcdef0123"));
    assert_eq!(s.body_timeout, Duration::from_millis(2500));
    let d = Settings::default();
    assert!(d.metrics_listen.is_none() && d.metrics_token.is_none());
    for (var, value) in [
        ("STOCKADE_METRICS_TOKEN", "short"),
        ("STOCKADE_METRICS_LISTEN", "9090"),
        ("STOCKADE_BODY_TIMEOUT_MS", "0"),
    ] {
        let err = Settings::from_vars(vars(&[(var, value)])).unwrap_err();
        assert!(err.to_string().starts_with(var), "{var}={value}: {err}");
    }
}

#[test]
fn api_and_rate_limit_settings_are_read() {
    let s = Settings::from_vars(vars(&[])).unwrap();
    assert!(
        !s.api_anonymous_orders,
        "anonymous API orders are off by default"
    );
    let s = Settings::from_vars(vars(&[
        ("STOCKADE_API_ANONYMOUS_ORDERS", "true"),
        ("STOCKADE_RATE_LIMIT_PER_MINUTE", "120"),
        ("STOCKADE_RATE_LIMIT_BURST", "7"),
        ("STOCKADE_API_KEY", "sk_abc"),
    ]))
    .unwrap();
    assert!(s.api_anonymous_orders);
    assert_eq!((s.rate_limit_per_minute, s.rate_limit_burst), (120, 7));
    assert_eq!(s.api_key.as_deref(), Some("sk_abc"));
    for (var, value) in [
        ("STOCKADE_API_ANONYMOUS_ORDERS", "maybe"),
        ("STOCKADE_RATE_LIMIT_PER_MINUTE", "0"),
        ("STOCKADE_RATE_LIMIT_BURST", "lots"),
    ] {
        let err = Settings::from_vars(vars(&[(var, value)])).unwrap_err();
        assert!(err.to_string().starts_with(var), "{var}={value}: {err}");
    }
}

#[test]
fn secrets_do_not_print_through_debug() {
    let s = Settings::from_vars(vars(&[
        ("DATABASE_URL", "postgres://shop:hunter2@db:5432/stockade"),
        ("REDIS_URL", "redis://:s3cret@cache:6379"),
        ("STOCKADE_API_KEY", "sk_abc"),
        ("STOCKADE_METRICS_TOKEN", "0123456789abcdef0123"),
        ("STOCKADE_SMTP_URL", "smtps://mailer:pa55@smtp.example.com"),
        ("STOCKADE_REDIS_PASSWORD", "sentinel-pw"),
        (
            "STOCKADE_DATABASE_REPLICA_URL",
            "postgres://shop:hunter3@replica/stockade",
        ),
    ]))
    .unwrap();
    let printed = format!("{s:?}");
    for secret in [
        "hunter2",
        "s3cret",
        "sk_abc",
        "0123456789abcdef0123",
        "pa55",
        "sentinel-pw",
        "hunter3",
    ] {
        assert!(!printed.contains(secret), "{secret} printed in {printed}");
    }
    assert!(
        printed.contains(r#""postgres://shop:***@db:5432/stockade""#),
        "{printed}"
    );
    assert_eq!(
        s.database_url.as_deref(),
        Some("postgres://shop:hunter2@db:5432/stockade")
    );
}

#[test]
fn unknown_stockade_variables_are_refused() {
    let err = Settings::from_vars(vars(&[("STOCKADE_LISTNE", "x")])).unwrap_err();
    assert_eq!(
        err,
        ConfigError::Unknown {
            var: "STOCKADE_LISTNE".into()
        }
    );
}

#[test]
fn env_example_lists_every_variable_with_a_comment_and_valid_defaults() {
    let example = include_str!("../../.env.example");
    let mut listed = Vec::new();
    let mut previous = "";
    for line in example.lines() {
        if let Some((name, _)) = line.split_once('=')
            && !line.starts_with('#')
        {
            assert!(previous.starts_with('#'), "{name} has no comment above it");
            listed.push(name.to_string());
        }
        previous = line;
    }
    assert_eq!(listed, VARIABLES, ".env.example and VARIABLES differ");
    // Every value shown is the default declared in code (empty: unset).
    for line in example.lines().filter(|l| !l.starts_with('#')) {
        if let Some((name, value)) = line.split_once('=') {
            let (_, default) = DEFAULTS.iter().find(|(var, _)| *var == name).unwrap();
            assert_eq!(
                value, *default,
                "{name}: .env.example shows another default"
            );
        }
    }
    // The example file itself is a valid configuration.
    let pairs = example
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()));
    Settings::from_vars(pairs).unwrap();
}

#[test]
fn holds_are_kept_at_least_as_long_as_their_keys() {
    let day = Duration::from_secs(86_400);
    let default = Settings::from_vars(vars(&[])).unwrap();
    assert_eq!(default.hold_retention(), 7 * day);
    let short = Settings::from_vars(vars(&[
        ("STOCKADE_HOLD_RETENTION_DAYS", "1"),
        ("STOCKADE_IDEMPOTENCY_TTL_HOURS", "72"),
    ]))
    .unwrap();
    assert_eq!(short.hold_retention(), 3 * day, "the key's TTL is longer");
    let err = Settings::from_vars(vars(&[("STOCKADE_HOLD_RETENTION_DAYS", "0")])).unwrap_err();
    assert!(
        err.to_string().contains("STOCKADE_HOLD_RETENTION_DAYS"),
        "{err}"
    );
}

#[test]
fn the_time_zone_is_an_iana_name() {
    assert_eq!(Settings::default().time_zone, chrono_tz::UTC);
    let s = Settings::from_vars(vars(&[("STOCKADE_TIME_ZONE", " Europe/Berlin ")])).unwrap();
    assert_eq!(s.time_zone, chrono_tz::Europe::Berlin);
    for bad in ["Mars/Olympus", "CET+1"] {
        let err = Settings::from_vars(vars(&[("STOCKADE_TIME_ZONE", bad)])).unwrap_err();
        assert!(
            err.to_string().contains("an IANA time zone name"),
            "{bad:?}: {err}"
        );
    }
}
