#!/usr/bin/env bash
# The whole suite, as `make test` runs it (lint aside), on a loaded machine: stress-ng
# keeps one worker per core spinning for the whole run. A test that passes only on an
# idle machine fails here. Arguments go to scripts/test-suite.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# Built before the load starts: the load is for the tests, not the compiler.
cargo test --locked --all-targets --no-run --quiet

# (A load that failed to start would pass the tests on an idle machine, unsaid.)
command -v stress-ng >/dev/null || {
  echo "stress-ng is not installed: make deps-stress installs it" >&2
  exit 1
}
workers=$(nproc)
stress-ng --cpu "$workers" --cpu-load 100 --timeout 0 --quiet &
stress=$!
trap 'kill "$stress" 2>/dev/null; wait "$stress" 2>/dev/null || true' EXIT
echo "stress-ng: $workers CPU workers at 100 % (pid $stress) for the whole run"

scripts/test-suite.sh "$@"
