//! Nothing Stockade starts outlives it, even when it is killed with SIGKILL.
//!
//! Every command Stockade runs is marked ([`mark`]): its environment carries
//! `STOCKADE_WARDENS`, a list of watcher ids, which the programs it runs pass on to theirs
//! (a Patroni's PostgreSQL, Chromium under chromedriver, a nested `stockade serve`'s own
//! servers). The first mark starts this process's warden: a small shell process whose
//! standard input is a pipe only this process holds. However this process ends, the kernel
//! closes that pipe; the warden then kills every process whose environment names its id,
//! again until none is left (10 s at most), and exits.
//!
//! Why not `PR_SET_PDEATHSIG`: it fires when the *thread* that spawned a child ends (a
//! blocking-pool thread, a test's thread) rather than the process, reaches direct children
//! only (Patroni starts its PostgreSQL in a session of its own), and needs `unsafe` in
//! `pre_exec`. A process group has the same reach problem and no trigger at all.
//!
//! A nested Stockade appends its own id to the list it inherited, so its children carry
//! both: each warden up the chain reaches them.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The environment variable that carries the ids of the wardens watching a process.
pub const VAR: &str = "STOCKADE_WARDENS";

/// The warden's loop: wait for the end of its input, then kill what carries `$1` until
/// nothing does. In `sh` so that it needs nothing but the base system and no copy of this
/// program.
const SCRIPT: &str = r#"
trap '' INT HUP TERM PIPE
cat >/dev/null
deadline=$(( $(date +%s) + 10 ))
while :; do
  found=
  for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}; pid=${pid%/environ}
    [ "$pid" = "$$" ] && continue
    if grep -qz "^STOCKADE_WARDENS=.*:$1:" "$environ" 2>/dev/null; then
      kill -9 "$pid" 2>/dev/null && found=1
    fi
  done
  [ -z "$found" ] && exit 0
  [ "$(date +%s)" -ge "$deadline" ] && exit 1
  sleep 0.1
done
"#;

/// The value children get, once the warden runs.
static MARK: OnceLock<String> = OnceLock::new();
/// The write end of the warden's pipe: held, never written, until this process ends.
static PIPE: Mutex<Option<ChildStdin>> = Mutex::new(None);

/// Marks `cmd` as this process's, so it is killed should this process end without
/// stopping it. Call it on every command that starts something.
pub fn mark(cmd: &mut Command) -> &mut Command {
    cmd.env(VAR, value())
}

/// [`mark`] for a tokio command.
pub fn mark_tokio(cmd: &mut tokio::process::Command) -> &mut tokio::process::Command {
    cmd.env(VAR, value())
}

/// The mark: the inherited list with this process's warden's id appended (only the
/// inherited list when the warden could not be started; the log says so).
fn value() -> String {
    MARK.get_or_init(|| {
        let inherited = std::env::var(VAR).unwrap_or_else(|_| ":".to_string());
        let id = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        match start(&id) {
            Ok(()) => format!("{inherited}{id}:"),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "could not start the process that stops this one's children if it is \
                     killed; they may outlive it"
                );
                inherited
            }
        }
    })
    .clone()
}

fn start(id: &str) -> std::io::Result<()> {
    let mut child = Command::new("/bin/sh")
        .args(["-c", SCRIPT, "stockade-warden", id])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        // Not the parent's: whoever reads the parent's output to its end (`output()`, a
        // pipe) must not wait for the warden too.
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C meant for this process does not end it first.
        .process_group(0)
        .spawn()?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    // Nothing is ever sent; a write that fails says the warden is already gone.
    stdin.write_all(b"")?;
    *PIPE.lock().unwrap_or_else(|e| e.into_inner()) = Some(stdin);
    // Not waited for: it ends only after this process does.
    drop(child);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_name_the_inherited_wardens_and_this_ones_last() {
        let given = value();
        assert!(given.starts_with(':') && given.ends_with(':'), "{given}");
        let own = format!(":{}-", std::process::id());
        assert!(given.contains(&own), "{given}");
        let mut cmd = Command::new("true");
        mark(&mut cmd);
        let set = cmd.get_envs().find(|(k, _)| *k == VAR).and_then(|(_, v)| v);
        assert_eq!(set.and_then(|v| v.to_str()), Some(given.as_str()));
    }
}
