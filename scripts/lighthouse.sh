#!/usr/bin/env bash
# Lighthouse (mobile emulation) on the catalogue, a product page and a checkout page of a
# release build in local mode, as `make run` starts it, with the demo catalogue. Prints
# the four category scores per page and writes the HTML and JSON reports into
# lighthouse-report/. `make lighthouse` builds the binary and installs Lighthouse first.
#
#   scripts/lighthouse.sh     CHROME_PATH: the browser (/usr/bin/chromium by default);
#                             SERVER_BIN: the binary (./target/release/stockade)
set -euo pipefail
cd "$(dirname "$0")/.."

lighthouse=tools/lighthouse/node_modules/.bin/lighthouse
[ -x "$lighthouse" ] || { echo "Lighthouse is missing: run make lighthouse"; exit 1; }
export CHROME_PATH="${CHROME_PATH:-/usr/bin/chromium}"
reports=lighthouse-report
mkdir -p "$reports"

# A shop of its own: a fresh data folder (its PostgreSQL, Redis and demo catalogue) on a
# free port, stopped (with its servers) however this script ends.
data=$(mktemp -d /tmp/stockade-lighthouse.XXXXXX)
chmod 755 "$data"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port"
# Anonymous API holds: only this throwaway shop, to open a checkout without a key.
STOCKADE_LISTEN="127.0.0.1:$port" STOCKADE_DATA_DIR="$data" STOCKADE_API_ANONYMOUS_ORDERS=true \
  STOCKADE_LOG=warn "${SERVER_BIN:-./target/release/stockade}" serve >"$reports/server.log" 2>&1 &
server=$!
stop() {
  kill -INT "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
  rm -rf "$data"
}
trap stop EXIT

for _ in $(seq 600); do
  curl -fsS "$base/readyz" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { cat "$reports/server.log"; exit 1; }
  sleep 0.2
done
curl -fsS "$base/readyz" >/dev/null || { echo "the shop did not start"; exit 1; }

sku=KB-ALPINE-75
hold=$(curl -fsS -X POST "$base/api/v1/holds" -H 'Content-Type: application/json' \
  -H 'Idempotency-Key: lighthouse-hold' -d "{\"lines\": [{\"sku\": \"$sku\", \"quantity\": 1}]}" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')

pages=("catalogue /" "product /products/$sku" "checkout /checkout/$hold")
printf '%-10s %12s %14s %15s %5s\n' page performance accessibility best-practices seo
for entry in "${pages[@]}"; do
  name=${entry%% *}
  path=${entry#* }
  "$lighthouse" "$base$path" --quiet --form-factor=mobile \
    --only-categories=performance,accessibility,best-practices,seo \
    --chrome-flags="--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage" \
    --output=html --output=json --output-path="$reports/$name"
  python3 - "$reports/$name.report.json" "$name" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
scores = [round(report["categories"][c]["score"] * 100)
          for c in ("performance", "accessibility", "best-practices", "seo")]
print("%-10s %12d %14d %15d %5d" % (sys.argv[2], *scores))
EOF
done
echo "Reports: $reports/{catalogue,product,checkout}.report.html (and .json)"
