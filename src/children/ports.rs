//! Ports for the servers Stockade starts, none ever given twice.
//!
//! Binding port 0 and letting it go, then handing the number to a daemon, leaves a window
//! in which anything else may take it: the next such draw (the kernel may hand the same
//! number out again), another Stockade process drawing at the same moment, or any outgoing
//! connection, whose local port the kernel picks from the same range. A port here is
//! therefore
//!
//! - drawn *below* the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), which
//!   neither port-0 binds nor outgoing connections use;
//! - claimed with an exclusive lock on a file named after it in a folder every Stockade
//!   process on the machine shares, held until the process that drew it exits (a port of a
//!   daemon that is restarted stays its own), so no two processes, and no two draws of one
//!   process, ever hold one number;
//! - checked free by binding it, so a port some other program listens on is skipped.

use std::fs::{self, File, OpenOptions};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use anyhow::bail;

/// What this process has drawn: the port and the lock that keeps it this process's.
struct Claims {
    held: Vec<(u16, File)>,
    /// Where the next draw starts looking (within the band).
    cursor: u32,
}

/// This process's claims. Made at the first draw, which first raises the limit of open
/// files to the most this process may have: each claim keeps its lock file open until the
/// process ends.
static CLAIMS: LazyLock<Mutex<Claims>> = LazyLock::new(|| {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    Mutex::new(Claims {
        held: Vec::new(),
        // Each process starts somewhere else in the band, so concurrent ones rarely meet.
        cursor: rand::random::<u32>(),
    })
});

impl Claims {
    /// Claims `port` for this process unless it holds it already, another process holds
    /// it, or something listens there.
    fn hold(&mut self, dir: &Path, port: u16) -> anyhow::Result<bool> {
        if self.held.iter().any(|(held, _)| *held == port) {
            return Ok(false);
        }
        let Some(lock) = claim(dir, port)? else {
            return Ok(false);
        };
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            return Ok(false); // the lock is let go with `lock`
        }
        self.held.push((port, lock));
        Ok(true)
    }
}

/// The band ports are drawn from: `[low, high)`.
fn band() -> (u16, u16) {
    let ephemeral_low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    band_below(ephemeral_low)
}

/// Up to 12,000 ports just below the ephemeral range, never below 10,000 (where well-known
/// services sit); the whole unprivileged range above 10,000 when the ephemeral range starts
/// too low to leave room.
fn band_below(ephemeral_low: u16) -> (u16, u16) {
    if ephemeral_low >= 12_000 {
        (
            ephemeral_low.saturating_sub(12_000).max(10_000),
            ephemeral_low,
        )
    } else {
        (10_000, u16::MAX)
    }
}

/// The shared folder of claims, one lock file a port: a fixed path, not `$TMPDIR`, which
/// differs between users and under `sudo`. Sticky and writable by all, as /tmp is, so
/// root's cluster and a user's tests share it and no one removes another's files.
fn claims_dir() -> PathBuf {
    let dir = PathBuf::from("/tmp/stockade-ports");
    if fs::create_dir_all(&dir).is_ok() {
        let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777));
    }
    dir
}

fn claims() -> std::sync::MutexGuard<'static, Claims> {
    CLAIMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port no other Stockade process holds and nothing listens on, claimed for the rest of
/// this process's life.
pub fn free_port() -> anyhow::Result<u16> {
    let (low, high) = band();
    let dir = claims_dir();
    let mut claims = claims();
    let width = u32::from(high - low);
    for _ in 0..width {
        let port = low + (claims.cursor % width) as u16;
        claims.cursor = claims.cursor.wrapping_add(1);
        if claims.hold(&dir, port)? {
            return Ok(port);
        }
    }
    bail!(
        "no free port between {low} and {high}: every one is listened on or held by another \
         Stockade process (claims in {})",
        dir.display()
    )
}

/// Claims `port`, one a server used last time (local mode keeps its servers' ports across
/// restarts), if it is in the band and still free; `false` when it is not (another process
/// holds it, something listens there, or it was drawn where outgoing connections may take
/// it, as older versions did).
pub fn claim_port(port: u16) -> bool {
    let (low, high) = band();
    if !(low..high).contains(&port) {
        return false;
    }
    claims().hold(&claims_dir(), port).unwrap_or(false)
}

/// An error unless the ports `owner` was given all differ (a check on a start's plan: a
/// port given twice is a daemon that cannot bind, or one that answers for another).
pub fn distinct(owner: &str, ports: &[(&str, u16)]) -> anyhow::Result<()> {
    for (i, (first, port)) in ports.iter().enumerate() {
        if let Some((second, _)) = ports[i + 1..].iter().find(|(_, p)| p == port) {
            bail!("{owner}: {first} and {second} were both given port {port}");
        }
    }
    Ok(())
}

/// The lock on `port`'s file; `None` when another open file holds it. Any other failure
/// (no file could be opened: out of file descriptors, no permission) is an error, not a
/// port that is taken.
fn claim(dir: &Path, port: u16) -> anyhow::Result<Option<File>> {
    use anyhow::Context;
    let path = dir.join(port.to_string());
    // A file another user made may be read-only to this one; a lock needs only reading.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .or_else(|_| File::open(&path))
        .with_context(|| format!("cannot open {} to claim port {port}", path.display()))?;
    let _ = fs::set_permissions(&path, fs::Permissions::from_mode(0o666));
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_plan_that_gives_one_port_twice_is_refused_naming_both() {
        distinct("pg1", &[("REST", 20001), ("PostgreSQL", 20002)]).unwrap();
        let error = distinct(
            "pg1",
            &[("REST", 20001), ("PostgreSQL", 20002), ("link", 20001)],
        )
        .unwrap_err()
        .to_string();
        assert_eq!(error, "pg1: REST and link were both given port 20001");
    }

    #[test]
    fn the_band_sits_below_the_ephemeral_range_and_above_the_well_known_ports() {
        assert_eq!(band_below(32768), (20768, 32768));
        assert_eq!(band_below(15000), (10000, 15000));
        assert_eq!(band_below(1024), (10000, u16::MAX));
        let (low, high) = band();
        assert!(low >= 10_000 && low < high, "{low}..{high}");
    }

    /// A cluster draws about 30 ports for one start (etcd 2, each of three nodes 5, HAProxy
    /// 2, PgBouncer, Redis 2, three Sentinels, its apps); drawn twenty times over in one
    /// process, from four threads at once, none repeats and none is listened on.
    #[test]
    fn twenty_clusters_worth_of_ports_drawn_at_once_never_repeat() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| (0..150).map(|_| free_port().unwrap()).collect::<Vec<u16>>())
            })
            .collect();
        let drawn: Vec<u16> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let distinct: HashSet<u16> = drawn.iter().copied().collect();
        assert_eq!(distinct.len(), drawn.len(), "a port was drawn twice");
        let (low, high) = band();
        assert!(drawn.iter().all(|p| (low..high).contains(p)));
        // A claimed port is not claimed again, by this process or through the shared lock.
        assert!(!claim_port(drawn[0]));
        assert!(claim(&claims_dir(), drawn[1]).unwrap().is_none());
        // Outside the band: never claimed, even when free.
        assert!(!claim_port(band().0 - 1));
    }
}
