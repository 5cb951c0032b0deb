#!/usr/bin/env bash
# Runs every test `cargo test --all-targets` runs, as it does, and then:
#   - prints the ten slowest tests of the run (libtest's own per-test timing);
#   - repeats each failing test's panic message;
#   - gives each test a deadline (SUITE_TEST_DEADLINE seconds, 600 unless set): a test
#     past it fails by name and its binary is stopped (scripts/run-test-binary.py);
#   - fails when any process a test started (servers, PostgreSQL, Redis, Sentinels,
#     HAProxy, PgBouncer, chromedriver and its Chromium) is still alive 15 s after the test
#     binaries ended, naming each, and then stops them. (Each binary's warden stops what it
#     left within a moment of its end: see src/children/warden.rs. This is the check on
#     that.)
# Nothing here waits on a pipe a leftover process could hold open: a binary's output is
# read until the binary ends, not until its pipe closes.
# Every process the tests start carries SUITE_RUN_ID in its environment (children inherit
# it; the harness hands it to the `stockade serve` processes it starts with a clean
# environment), which is how leftovers are found.
#
#   scripts/test-suite.sh [libtest arguments…]     e.g. scripts/test-suite.sh holds::
set -euo pipefail
cd "$(dirname "$0")/.."

run_id="suite-$$-$(date +%s)"
log=$(mktemp /tmp/stockade-suite.XXXXXX)
trap 'rm -f "$log"' EXIT

# Built first, on their own: a build that fails must fail the run (the list below is read
# through a pipe, whose failure `set -e` does not see: it would be an empty list).
cargo test --locked --all-targets --no-run

# The test executables, in the order cargo runs them.
mapfile -t executables < <(
  cargo test --locked --all-targets --no-run --message-format=json-render-diagnostics |
    python3 -c '
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message.get("executable") \
            and message["profile"]["test"]:
        print(message["executable"])
'
)

# Four tests at a time on any machine: most of a test's time is spent waiting on the
# servers it started, not on a core. (RUST_TEST_THREADS or --test-threads say otherwise.)
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"

if [ "${#executables[@]}" = 0 ]; then
  echo "no test executables were built" >&2
  exit 1
fi

status=0
for exe in "${executables[@]}"; do
  echo "     Running ${exe#"$PWD"/}"
  # A failing binary does not stop the others, as with `cargo test --no-fail-fast`, so
  # one run shows every failure.
  if ! scripts/run-test-binary.py "$run_id" "$log" "$exe" "$@"; then
    status=1
  fi
done

echo
echo "The ten slowest tests:"
# (awk reads all its input: `head` would leave `sort` writing to a closed pipe, which
# pipefail turns into a failed run.)
sed -n 's/^test \(.*\) \.\.\. [a-zA-Z]* <\([0-9.]*\)s>$/\2 \1/p' "$log" |
  sort -rn | awk 'NR <= 10 { printf "  %7.1f s  %s\n", $1, $2 }'

# Each failure's panic, again, at the end: a long run's output is often read from its
# tail (and CI may keep only the tail), where the tests' own output would bury it. The
# panic line and the message's first lines, up to the backtrace, each line cut at 300
# characters.
if grep -q "^thread '.*' ([0-9]*) panicked at " "$log"; then
  echo
  echo "Why each failed:"
  awk '
    /^thread .* panicked at / { shown = 0; printing = 1; print "  " $0; next }
    printing && (/^stack backtrace:/ || /^note: / || /^---- / || shown == 12) {
      printing = 0; if (shown == 12) print "    […]"; next
    }
    printing { shown++; print "    " substr($0, 1, 300) }
  ' "$log"
fi

# What is still running with this run's mark (this script and its own children aside),
# looked for until none is or 15 s have passed.
marked() {
  leftovers=()
  for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    [ "$pid" = $$ ] && continue
    # (Kernel threads and processes that just ended cannot be read: skipped.)
    # (No pipe: `grep -q` leaving early would fail it under pipefail.)
    if grep -qzxF "SUITE_RUN_ID=$run_id" "$environ" 2>/dev/null; then
      leftovers+=("$pid")
    fi
  done
}
deadline=$((SECONDS + 15))
while :; do
  marked
  [ ${#leftovers[@]} = 0 ] && break
  [ "$SECONDS" -ge "$deadline" ] && break
  sleep 0.2
done
if [ ${#leftovers[@]} -gt 0 ]; then
  echo
  echo "These processes the tests started outlived them (now stopped):"
  ps -o pid,ppid,user,args -p "$(
    IFS=,
    echo "${leftovers[*]}"
  )" || true
  kill -KILL "${leftovers[@]}" 2>/dev/null || true
  status=1
fi

if [ "$status" = 0 ]; then
  echo
  echo "All tests passed; no process outlived them."
fi
exit "$status"
