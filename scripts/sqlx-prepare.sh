#!/usr/bin/env bash
# Compile-time-checked SQL: `sqlx::query!` and friends are checked against a migrated
# PostgreSQL when one is given (DATABASE_URL), and otherwise against the query descriptions
# committed in `.sqlx/`. This script starts a throwaway PostgreSQL, migrates it, and then
#   scripts/sqlx-prepare.sh          rewrites .sqlx/ from the code (after changing a query)
#   scripts/sqlx-prepare.sh --check  fails when .sqlx/ is not what the code needs
# PostgreSQL refuses to run as root; as root the server runs as `postgres` (or `nobody`).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(dirname "$( (command -v initdb || ls /usr/lib/postgresql/*/bin/initdb) | sort -V | tail -1)")
dir=$(mktemp -d /tmp/stockade-sqlx.XXXXXX)
as_user=()
if [ "$(id -u)" = 0 ]; then
  user=postgres
  id "$user" >/dev/null 2>&1 || user=nobody
  chown "$user" "$dir"
  as_user=(runuser -u "$user" --)
fi
stop() {
  "${as_user[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT

# Reached through a socket in its own folder only: no port to collide with.
"${as_user[@]}" "$bin/initdb" -D "$dir/data" -U stockade --auth=trust -E UTF8 >/dev/null
"${as_user[@]}" "$bin/pg_ctl" -D "$dir/data" -w -l "$dir/log" \
  -o "-k $dir -c listen_addresses= -c fsync=off" start >/dev/null

export DATABASE_URL="postgres://stockade@localhost/stockade?host=$dir"
cargo sqlx database create
cargo sqlx migrate run --source migrations >/dev/null
cargo sqlx prepare "$@" -- --all-targets
