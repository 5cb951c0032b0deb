//! `stockade cluster --state-file`: what the cluster started, as JSON, for scripts that
//! fault it without guessing.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde_json::{Value, json};

use super::{Cluster, MASTER_NAME};

/// Writes `content` to `path` as a new file readable by this user only (it holds the app's
/// database password and Redis's): into a file of its own made beside it, then renamed
/// over `path`, so a file or link someone else put there is replaced, never written
/// through.
pub fn write_state_file(path: &Path, content: &str) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    let temporary = dir.join(format!(".{name}.{}", uuid::Uuid::new_v4().simple()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut file| file.write_all(content.as_bytes()));
    match written.and_then(|()| std::fs::rename(&temporary, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&temporary);
            Err(e)
        }
    }
}

impl Cluster {
    /// The shop's and the database's URLs, and every process with its role, pid and
    /// ports. A PostgreSQL node's entry is named by its Patroni member name, its pid is its
    /// Patroni's, and it adds its Patroni REST API, its data folder and its postmaster's
    /// pid. Roles are as of now (`postgres-leader`, `redis-master`, …): a failover changes
    /// them.
    pub async fn state(&self) -> Value {
        let mut processes = vec![process(
            "haproxy",
            "load-balancer",
            self.haproxy.pid(),
            &[self.haproxy.port],
        )];
        for (i, app) in self.apps.iter().enumerate() {
            let port = app
                .address
                .rsplit(':')
                .next()
                .and_then(|p| p.parse::<u16>().ok());
            processes.push(process(
                &format!("app-{}", i + 1),
                "app",
                app.pid(),
                &port.into_iter().collect::<Vec<_>>(),
            ));
        }
        processes.push(process(
            "pgbouncer",
            "pgbouncer",
            self.pgbouncer.pid(),
            &[self.pgbouncer.port],
        ));
        let master = self.current_master_port().await.ok();
        for (i, redis) in self.redis.iter().enumerate() {
            let role = if master == Some(redis.port) {
                "redis-master"
            } else {
                "redis-replica"
            };
            processes.push(process(
                &format!("redis-{}", i + 1),
                role,
                redis.pid(),
                &[redis.port],
            ));
        }
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            processes.push(process(
                &format!("sentinel-{}", i + 1),
                "sentinel",
                sentinel.pid(),
                &[sentinel.port],
            ));
        }
        let pg = &self.postgres;
        processes.push(process("etcd", "etcd", pg.etcd.pid(), &[pg.etcd.port]));
        for node in &pg.nodes {
            let role = if node.answers("/primary").await {
                "postgres-leader"
            } else {
                "postgres-replica"
            };
            let mut entry = process(
                &node.name,
                role,
                node.daemon.pid(),
                &[node.pg_port, node.daemon.port],
            );
            entry["patroni_url"] = json!(node.patroni_url());
            entry["data_dir"] = json!(node.data_dir.display().to_string());
            entry["postmaster_pid"] = json!(node.postmaster_pid());
            processes.push(entry);
            if let Some(pid) = node.link_pid() {
                processes.push(process(
                    &format!("link-{}", node.name),
                    "fault-link",
                    Some(pid),
                    &[],
                ));
            }
        }
        processes.push(process(
            "haproxy-postgres",
            "database-router",
            pg.haproxy.pid(),
            &[pg.write_port, pg.read_port],
        ));
        json!({
            "shop_url": self.url(),
            "database_url": self.primary_url(),
            "replica_url": self.replica_url(),
            "pgbouncer_url": self.pgbouncer_url(),
            "redis_sentinels": self.sentinel_addresses(),
            "redis_master_name": MASTER_NAME,
            "redis_password": self.redis_password(),
            "admin_url": format!("{}/admin", self.url()),
            "processes": processes,
        })
    }
}

fn process(name: &str, role: &str, pid: Option<u32>, ports: &[u16]) -> Value {
    json!({"name": name, "role": role, "pid": pid, "ports": ports})
}
