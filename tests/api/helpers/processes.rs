//! Every process a test starts ends when the test binary does, passed or panicked.
//!
//! Processes are marked with `SUITE_RUN_ID` in their environment, which their own
//! children inherit (Chromium from chromedriver, local-mode servers from `stockade
//! serve`). `scripts/test-suite.sh` sets the mark for the whole run and fails it when a
//! marked process outlives the binaries; run any other way, the binary marks its own.
//! At exit, after the shared servers stop in order, whatever still carries the mark, or
//! descends from this process, is killed.

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command};
use std::sync::{Mutex, OnceLock};

/// The environment variable that marks this run's processes.
pub const MARK: &str = "SUITE_RUN_ID";

/// Children owned by the harness for the whole run (chromedriver), killed at exit.
static OWNED: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// This run's mark: the one the suite script set, or one of this binary's own.
pub fn run_mark() -> &'static str {
    static RUN: OnceLock<String> = OnceLock::new();
    RUN.get_or_init(|| {
        std::env::var(MARK).unwrap_or_else(|_| format!("stockade-tests-{}", std::process::id()))
    })
}

/// Marks `command` (and so its descendants) as this run's, and as this binary's: its
/// warden kills them should the binary be killed before its exit hook runs.
pub fn marked(command: &mut Command) -> &mut Command {
    stockade::children::mark(command).env(MARK, run_mark())
}

/// The built `stockade` binary as a command with an empty environment but `PATH`, marked
/// (after the clearing, which would take the marks with it).
pub fn clean_stockade_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stockade"));
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    marked(&mut command);
    command
}

/// The built `stockade` binary as a command, marked.
pub fn stockade_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stockade"));
    marked(&mut command);
    command
}

/// Keeps `child` until exit.
pub fn own(child: Child) {
    OWNED.lock().unwrap().push(child);
}

/// Kills the owned children, then every other process with this run's mark or descended
/// from this one; says on stderr what it had to kill beyond the owned ones.
pub fn reap() {
    if let Ok(mut owned) = OWNED.lock() {
        for mut child in owned.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let me = std::process::id();
    let found = leftovers(me);
    if found.is_empty() {
        return;
    }
    let names: Vec<String> = found
        .iter()
        .map(|pid| format!("{pid} {}", command_line(*pid)))
        .collect();
    eprintln!(
        "test harness: killing {} processes the tests left running:\n  {}",
        found.len(),
        names.join("\n  ")
    );
    for pid in found {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Live processes other than `me` that carry the mark or descend from `me`.
fn leftovers(me: u32) -> Vec<u32> {
    let mark = format!("{MARK}={}", run_mark());
    let mut parents = HashMap::new();
    let mut found = HashSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Some((state, parent)) = state_and_parent(pid) else {
            continue;
        };
        if state == 'Z' {
            continue; // already dead, waiting for its parent
        }
        if is_warden(pid) || is_warden(parent) {
            continue; // this binary's warden: it ends what is left once the binary ends
        }
        parents.insert(pid, parent);
        let marked = std::fs::read(format!("/proc/{pid}/environ"))
            .map(|env| env.split(|b| *b == 0).any(|v| v == mark.as_bytes()))
            .unwrap_or(false);
        if marked {
            found.insert(pid);
        }
    }
    for &pid in parents.keys() {
        let mut at = pid;
        // Walk up to init; a cycle cannot occur, but the walk is bounded anyway.
        for _ in 0..64 {
            match parents.get(&at) {
                Some(&parent) if parent == me => {
                    found.insert(pid);
                    break;
                }
                Some(&parent) if parent > 1 => at = parent,
                _ => break,
            }
        }
    }
    let mut found: Vec<u32> = found.into_iter().collect();
    found.sort_unstable();
    found
}

/// A process's state letter and parent, from `/proc/<pid>/stat`.
fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// Whether `pid` is a warden (`src/children/warden.rs`), by its full command line.
fn is_warden(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"stockade-warden"))
}

fn command_line(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            String::from_utf8_lossy(&c)
                .split('\0')
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
        .trim()
        .chars()
        .take(160)
        .collect()
}
