#!/usr/bin/env python3
"""Runs one test executable the way scripts/test-suite.sh needs it, and never hangs.

    scripts/run-test-binary.py LOG EXECUTABLE [libtest arguments...]

- Prints what libtest's own output would (a line a test, then each failure's output and
  the summary) and appends it to LOG, reading libtest's JSON events (`--format json`).
- Gives every test a deadline (STOCKADE_TEST_DEADLINE seconds, 600 unless set): a test
  still running past it is named as timed out, and the executable is killed (SIGKILL),
  which also ends what it started (its warden's doing; see src/children/warden.rs). A
  hang becomes a named failure within minutes, never a silent wait.
- Ends when the executable ends, not when its output pipe closes: a process the tests
  started and left behind may hold that pipe open, and must not hold up the run.

Exit status: the executable's, or 124 when a test timed out.
"""

import json
import os
import selectors
import signal
import subprocess
import sys
import time

DEADLINE = float(os.environ.get("STOCKADE_TEST_DEADLINE", "600"))
# How long the output is still read after the executable ended (what it wrote last).
DRAIN = 2.0


def main() -> int:
    log_path, exe, *args = sys.argv[1:]
    log = open(log_path, "a", encoding="utf-8")

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    command = [exe, "-Z", "unstable-options", "--format", "json", "--report-time", *args]
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, bufsize=0
    )
    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ)

    running: dict[str, float] = {}  # test name -> when it started
    failures: list[tuple[str, str]] = []
    timed_out: list[str] = []
    pending = b""
    ended_at = None

    def handle(line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            say(line)  # a panic outside a test, a process's own print: shown as it is
            return
        if not isinstance(event, dict):
            say(line)
            return
        kind, what = event.get("type"), event.get("event")
        if kind == "suite" and what == "started":
            say(f"\nrunning {event.get('test_count', 0)} tests")
        elif kind == "test" and what == "started":
            running[event["name"]] = time.monotonic()
        elif kind == "test" and what == "timeout":
            # libtest's own notice at 60 s: a warning, the test goes on.
            say(f"test {event['name']} has been running for over 60 seconds")
        elif kind == "test" and what in ("ok", "failed", "ignored"):
            name = event["name"]
            running.pop(name, None)
            took = event.get("exec_time")
            took = f" <{took:.3f}s>" if isinstance(took, (int, float)) else ""
            if what == "ok":
                say(f"test {name} ... ok{took}")
            elif what == "ignored":
                say(f"test {name} ... ignored")
            else:
                say(f"test {name} ... FAILED{took}")
                failures.append((name, event.get("stdout", "")))
        elif kind == "suite" and what in ("ok", "failed"):
            if failures:
                say("\nfailures:\n")
                for name, output in failures:
                    say(f"---- {name} stdout ----")
                    say(output.rstrip("\n"))
                    say("")
                say("failures:")
                for name, _ in failures:
                    say(f"    {name}")
            say(
                f"\ntest result: {what.upper() if what == 'failed' else 'ok'}. "
                f"{event.get('passed', 0)} passed; {event.get('failed', 0)} failed; "
                f"{event.get('ignored', 0)} ignored; {event.get('measured', 0)} measured; "
                f"{event.get('filtered_out', 0)} filtered out; "
                f"finished in {event.get('exec_time', 0):.2f}s\n"
            )

    while True:
        now = time.monotonic()
        if ended_at is None and child.poll() is not None:
            ended_at = now
        if ended_at is not None and now - ended_at > DRAIN:
            break
        late = [name for name, since in running.items() if now - since > DEADLINE]
        if late and ended_at is None:
            for name in late:
                say(
                    f"test {name} ... TIMED OUT: still running {DEADLINE:.0f} s after it "
                    f"started (STOCKADE_TEST_DEADLINE); stopping {os.path.basename(exe)}"
                )
                timed_out.append(name)
            still = sorted(set(running) - set(late))
            if still:
                say("  also still running, stopped with it: " + ", ".join(still))
            child.send_signal(signal.SIGKILL)
            child.wait()
            ended_at = time.monotonic()
            continue
        for key, _ in selector.select(timeout=0.5):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                selector.unregister(key.fileobj)
                if ended_at is None:
                    child.wait()  # the pipe closed: the executable is ending
                    ended_at = time.monotonic()
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                handle(raw.decode("utf-8", "replace"))
        if not selector.get_map() and ended_at is not None:
            break
    if pending:
        handle(pending.decode("utf-8", "replace"))
    status = child.wait()
    if timed_out:
        say(
            "\nthread 'run-test-binary' (0) panicked at scripts/run-test-binary.py:\n"
            + "\n".join(f"{name} did not finish within {DEADLINE:.0f} s" for name in timed_out)
        )
        return 124
    if status < 0:
        say(f"\n{os.path.basename(exe)} was killed by signal {-status}")
        return 128 - status
    return status


if __name__ == "__main__":
    sys.exit(main())
