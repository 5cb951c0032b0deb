//! Redis: one shared connection manager for the whole process. It connects lazily and
//! reconnects by itself, so Stockade starts and keeps selling while Redis is down; the
//! database guard alone then prevents overselling (DESIGN.md section 2).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// The process's Redis handle; cheap to clone.
#[derive(Clone)]
pub struct Redis {
    conn: ConnectionManager,
    prefix: String,
}

impl Redis {
    /// Prepares a connection to `url` without waiting for it; keys are prefixed by `prefix`.
    pub fn connect_lazy(url: &str, prefix: &str) -> anyhow::Result<Self> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_millis(1_000)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Self {
            conn,
            prefix: prefix.to_string(),
        })
    }

    /// A connection to use for one command or script call.
    pub fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// `prefix + name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Round trip to the server.
    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = self.conn();
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(())
    }
}
