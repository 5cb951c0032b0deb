//! HAProxy in front of the nodes: each node's link (to cut it off in tests) and the
//! write and read ports, routed by what each node's Patroni answers.

use std::fs;
use std::path::Path;

use super::Node;
use crate::cluster::daemons::{Daemon, run_haproxy};

/// A node's link ([`Options::links`]): HAProxy in TCP mode forwarding its three paths,
/// `(etcd, PostgreSQL, REST)` at `at` to the same at `to`.
pub(super) fn start_link(
    home: &Path,
    at: (u16, u16, u16),
    to: (u16, u16, u16),
) -> anyhow::Result<Daemon> {
    let dir = home.join("link");
    fs::create_dir_all(&dir)?;
    let listen = |name: &str, from: u16, to: u16| {
        format!("listen {name}\n  bind 127.0.0.1:{from}\n  server {name} 127.0.0.1:{to}\n")
    };
    let config = dir.join("haproxy.cfg");
    crate::local::write_private(
        &config,
        &format!(
            "defaults\n  mode tcp\n  timeout connect 1s\n  timeout client 30m\n  \
             timeout server 30m\n{}{}{}",
            listen("etcd", at.0, to.0),
            listen("postgres", at.1, to.1),
            listen("rest", at.2, to.2),
        ),
    )?;
    run_haproxy(&dir, config, at.0)
}

/// HAProxy in TCP mode: `write_port` to the node whose Patroni answers `/primary`,
/// `read_port` to those answering `/replica` (asked with `OPTIONS`, which Patroni answers
/// without a body: a check closes its connection as soon as it has the status, and a
/// body being written then fails in Patroni's log). Checked every 500 ms: a node that
/// stops answering yes is marked down after two checks and its sessions are cut, so a
/// demoted or dead node keeps no client; one that starts answering yes is used at once
/// (Patroni says `/primary` only while it holds the leader key).
pub(super) fn start_haproxy(
    dir: &Path,
    write_port: u16,
    read_port: u16,
    nodes: &[Node],
) -> anyhow::Result<Daemon> {
    let dir = dir.join("haproxy-postgres");
    fs::create_dir_all(&dir)?;
    let servers: String = nodes
        .iter()
        .map(|n| {
            format!(
                "  server {} 127.0.0.1:{} check port {}\n",
                n.name, n.pg_port, n.daemon.port
            )
        })
        .collect();
    let config = dir.join("haproxy.cfg");
    crate::local::write_private(
        &config,
        &format!(
            "global\n\
             \x20 maxconn 4000\n\
             defaults\n\
             \x20 mode tcp\n\
             \x20 timeout connect 1s\n\
             \x20 timeout client 30m\n\
             \x20 timeout server 30m\n\
             \x20 timeout check 1s\n\
             \x20 default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions\n\
             listen postgres-write\n\
             \x20 bind 127.0.0.1:{write_port}\n\
             \x20 option httpchk OPTIONS /primary\n\
             \x20 http-check expect status 200\n\
             {}\
             listen postgres-read\n\
             \x20 bind 127.0.0.1:{read_port}\n\
             \x20 balance roundrobin\n\
             \x20 option httpchk OPTIONS /replica\n\
             \x20 http-check expect status 200\n\
             {}",
            servers, servers,
        ),
    )?;
    run_haproxy(&dir, config, write_port)
}
