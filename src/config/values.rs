//! The settings' value types: the order strategy, the log format, and secrets that never
//! show in logs.

use std::str::FromStr;

/// How an order decrements stock (the README compares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStrategy {
    /// Redis lease per SKU, then the conditional update, per request: the original
    /// design, and the reference the benchmark compares against.
    RedisLock,
    /// The conditional update alone.
    PgAtomic,
    /// Group commit per SKU (the default): concurrent orders and holds of a SKU, one SKU
    /// or a cart of several, queue behind one leader, which takes the leases once and
    /// applies the whole batch in one transaction.
    Batched,
    /// Read, check in Rust, write back. Oversells; only for demonstrations.
    NaiveUnsafe,
}

impl OrderStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RedisLock => "redis-lock",
            Self::PgAtomic => "pg-atomic",
            Self::Batched => "batched",
            Self::NaiveUnsafe => "naive-unsafe",
        }
    }
}

impl FromStr for OrderStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "redis-lock" => Ok(Self::RedisLock),
            "pg-atomic" => Ok(Self::PgAtomic),
            "batched" => Ok(Self::Batched),
            "naive-unsafe" => Ok(Self::NaiveUnsafe),
            _ => Err("expected one of redis-lock, pg-atomic, batched, naive-unsafe".into()),
        }
    }
}

impl std::fmt::Display for OrderStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether checkout takes payment, and through which provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentsMode {
    /// Orders are placed without payment (as before payments existed; the load tools).
    Off,
    /// Stripe PaymentIntents, authorized at checkout and captured after the order.
    Stripe,
}

impl FromStr for PaymentsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "off" => Ok(Self::Off),
            "stripe" => Ok(Self::Stripe),
            _ => Err("expected off or stripe".into()),
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pretty" => Ok(Self::Pretty),
            "json" => Ok(Self::Json),
            _ => Err("expected pretty or json".into()),
        }
    }
}

/// A setting that must not reach a log or an error page: passwords, tokens, keys, and URLs
/// that may carry a password. Its `Debug` shows `"***"`, or for a URL everything but the
/// password; the value itself is read through `Deref` (`&str`).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_string())
    }
}

impl std::ops::Deref for Secret {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Secret {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_ref()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.split_once("://") {
            // A URL: its user and password sit before the last `@` of what follows.
            Some((scheme, rest)) => match rest.rsplit_once('@') {
                Some((credentials, host)) => {
                    let user = credentials.split_once(':').map_or(credentials, |(u, _)| u);
                    write!(f, "\"{scheme}://{user}:***@{host}\"")
                }
                None => write!(f, "{:?}", self.0),
            },
            None => f.write_str("\"***\""),
        }
    }
}
