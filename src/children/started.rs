//! Waiting for a daemon to start, without waiting on one that has already died.

use std::path::Path;
use std::process::Child;

use anyhow::bail;

/// How many of a log's last lines a failed start quotes.
const TAIL: usize = 20;

/// The last `lines` lines of the file at `log` (its end, when it is long), or a sentence
/// saying it could not be read.
pub fn log_tail(log: &Path, lines: usize) -> String {
    match std::fs::read(log) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            if tail.is_empty() {
                format!("({} is empty)", log.display())
            } else {
                tail.iter()
                    .map(|line| format!("  | {}", truncate(line, 400)))
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        }
        Err(e) => format!("({} could not be read: {e})", log.display()),
    }
}

fn truncate(line: &str, max: usize) -> &str {
    match line.char_indices().nth(max) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}

/// Whether the process `pid`, a child of this one, still runs: one that has exited but not
/// yet been waited for (a zombie) does not. Reads `/proc`, so it does not reap the child,
/// whose owner may still wait for it.
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may hold spaces.
    let state = stat
        .rfind(')')
        .and_then(|end| stat[end + 1..].split_whitespace().next());
    !matches!(state, Some("Z" | "X" | "x") | None)
}

/// An error naming `name` and quoting the end of `log` if `child` has exited.
pub fn exited(name: &str, child: &mut Child, log: &Path) -> anyhow::Result<()> {
    match child.try_wait() {
        Ok(Some(status)) => bail!(
            "{name} exited ({status}) while starting; the last lines of {}:\n{}",
            log.display(),
            log_tail(log, TAIL)
        ),
        _ => Ok(()),
    }
}

/// [`exited`] for a child known only by its pid (and not reaped here).
pub fn check_alive(name: &str, pid: u32, log: &Path) -> anyhow::Result<()> {
    if alive(pid) {
        return Ok(());
    }
    bail!(
        "{name} (pid {pid}) has exited; the last lines of {}:\n{}",
        log.display(),
        log_tail(log, TAIL)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_is_the_last_lines_of_a_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("d.log");
        let text: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&log, text).unwrap();
        let tail = log_tail(&log, 3);
        assert_eq!(tail, "  | line 28\n  | line 29\n  | line 30");
        std::fs::write(&log, "").unwrap();
        assert!(log_tail(&log, 3).contains("is empty"));
        assert!(log_tail(&dir.path().join("none"), 3).contains("could not be read"));
    }

    #[test]
    fn an_exited_child_is_not_alive_and_its_wait_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("d.log");
        std::fs::write(&log, "bind: Address already in use\n").unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(alive(child.id()));
        check_alive("sleeper", child.id(), &log).unwrap();
        child.kill().unwrap();
        // Killed, not yet reaped: a zombie, which is not alive.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while alive(child.id()) {
            assert!(
                std::time::Instant::now() < deadline,
                "a killed child still runs"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let error = check_alive("sleeper", child.id(), &log).unwrap_err();
        let text = format!("{error:#}");
        assert!(
            text.contains("sleeper") && text.contains("Address already in use"),
            "{text}"
        );
        let error = exited("sleeper", &mut child, &log).unwrap_err();
        assert!(format!("{error:#}").contains("exited"));
    }
}
