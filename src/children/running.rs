//! A server process this one started and owns: stopped with its own signal when dropped.

use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// A started server (PostgreSQL, Redis, localstripe, a cluster daemon), or none once it
/// was stopped or killed. Dropping it stops it the way its owner asked (`stop_with`).
#[derive(Debug)]
pub struct Running {
    child: Option<Child>,
    name: String,
    stop_with: Signal,
}

impl Running {
    /// `child` as `name`, stopped with `stop_with` (PostgreSQL's fast shutdown is SIGINT;
    /// the others stop on SIGTERM).
    pub fn new(child: Child, name: impl Into<String>, stop_with: Signal) -> Self {
        Self {
            child: Some(child),
            name: name.into(),
            stop_with,
        }
    }

    /// None yet: a daemon that is given its process at its first start.
    pub fn none(name: impl Into<String>, stop_with: Signal) -> Self {
        Self {
            child: None,
            name: name.into(),
            stop_with,
        }
    }

    /// Starts owning `child` (after a stop or a kill).
    pub fn set(&mut self, child: Child) {
        self.stop();
        self.child = Some(child);
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process, while this owns one.
    pub fn child(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// Forgets the process (it exited while starting).
    pub fn forget(&mut self) {
        self.child = None;
    }

    /// The process's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Kills the process at once (SIGKILL), as a crash would, and waits for it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the process and every process of its group at once (SIGKILL): a server and
    /// the children it runs, as a machine dying would take them.
    pub fn kill9_group(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
    }

    /// Its stop signal, and waits for the exit (killing it after 20 s).
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_child(child, self.stop_with, &self.name);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Signals `child` and waits for it, killing it after 20 s.
pub fn stop_child(mut child: Child, signal: Signal, name: &str) {
    let pid = Pid::from_raw(child.id() as i32);
    if kill(pid, signal).is_err() {
        let _ = child.wait();
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if Instant::now() > deadline => {
                tracing::warn!(name, "did not stop in time; killing it");
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
