#!/usr/bin/env python3
"""Runs one test executable the way scripts/test-suite.sh needs it, and never hangs.

    scripts/run-test-binary.py MARK LOG EXECUTABLE [libtest arguments...]

- Gives the executable SUITE_RUN_ID=MARK, the run's mark (see scripts/test-suite.sh), which
  this script does not carry itself: the harness kills whatever carries the mark when a
  binary exits, and this script outlives its binary.
- Prints what libtest's own output would (a line a test, then each failure's output and
  the summary) and appends it to LOG, reading libtest's JSON events (`--format json`).
- Gives every test a deadline (SUITE_TEST_DEADLINE seconds, 600 unless set): a test
  still running past it is named as timed out, and the executable is killed (SIGKILL),
  which also ends what it started (its warden's doing; see src/children/warden.rs). A
  hang becomes a named failure within minutes, never a silent wait.
- Ends when the executable ends, not when its output pipes close: a process the tests
  started and left behind may hold them open, and must not hold up the run. Once libtest
  has said the suite ended, the executable gets 60 s to exit (its exit hook stops the
  servers), and is then killed.
- Reads events from standard output only; standard error (panics outside a test, what
  started servers print) is shown as it comes, so it cannot split an event's line.

Exit status: the executable's, or 124 when a test timed out.
"""

import json
import os
import selectors
import signal
import subprocess
import sys
import time

DEADLINE = float(os.environ.get("SUITE_TEST_DEADLINE", "600"))
# How long the output is still read after the executable ended (what it wrote last).
DRAIN = 2.0
# How long the executable may take to exit once its suite has ended.
EXIT_WITHIN = 60.0


def main() -> int:
    mark, log_path, exe, *args = sys.argv[1:]
    log = open(log_path, "a", encoding="utf-8")

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    command = [exe, "-Z", "unstable-options", "--format", "json", "--report-time", *args]
    env = dict(os.environ, RUSTC_BOOTSTRAP="1", SUITE_RUN_ID=mark)
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0
    )
    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ, "events")
    selector.register(child.stderr, selectors.EVENT_READ, "stderr")

    running: dict[str, float] = {}  # test name -> when it started
    failures: list[tuple[str, str]] = []
    timed_out: list[str] = []
    pending = {"events": b"", "stderr": b""}
    ended_at = None
    suite_ended_at = None

    def handle(line: str) -> None:
        nonlocal suite_ended_at
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
                output = event.get("stdout", "")
                if event.get("message"):
                    output += f"\n{event['message']}"
                failures.append((name, output))
        elif kind == "suite" and what in ("ok", "failed"):
            suite_ended_at = time.monotonic()
            running.clear()
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
        if ended_at is None and suite_ended_at is not None and now - suite_ended_at > EXIT_WITHIN:
            say(
                f"{os.path.basename(exe)} did not exit within {EXIT_WITHIN:.0f} s of its "
                "last test; stopping it"
            )
            timed_out.append(f"{os.path.basename(exe)}'s exit")
            child.send_signal(signal.SIGKILL)
            child.wait()
            ended_at = time.monotonic()
            continue
        late = [name for name, since in running.items() if now - since > DEADLINE]
        if late and ended_at is None:
            for name in late:
                say(
                    f"test {name} ... TIMED OUT: still running {DEADLINE:.0f} s after it "
                    f"started (SUITE_TEST_DEADLINE); stopping {os.path.basename(exe)}"
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
            stream = key.data
            chunk = os.read(key.fd, 65536)
            if not chunk:
                selector.unregister(key.fileobj)
                continue
            pending[stream] += chunk
            *lines, pending[stream] = pending[stream].split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                handle(line) if stream == "events" else say(line)
        if not selector.get_map() and child.poll() is not None:
            break
    for stream, rest in pending.items():
        if rest:
            line = rest.decode("utf-8", "replace")
            handle(line) if stream == "events" else say(line)
    status = child.wait()
    if running and not timed_out:
        say("  still running when it ended: " + ", ".join(sorted(running)))
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
