#!/usr/bin/env bash
# What prometheus-username-labels costs the relay: release lastcall-turn on CPU 0 (one UDP I/O
# thread), lastcall-turnload on CPU 1, 4 allocations relaying 160-byte ChannelData through
# turnload's echo at 20,000 datagrams/s for 4 s; ROUNDS alternating rounds without and with
# the option. Prints the server's CPU microseconds per relayed datagram (client -> peer and
# peer -> client), loss and round-trip p50/p99 of each round. Loopback only.
#
#   cargo build --release -p lastcall-turn -p lastcall-turnload
#   bash bench/turn/user-labels-cost.sh [ROUNDS]     # default 6
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
ROUNDS=${1:-6}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
round() {
  local mode=$1 port admin pid extra=()
  port=$((20000 + RANDOM % 20000))
  admin=$((40000 + RANDOM % 20000))
  [ "$mode" = on ] && extra=(--prometheus-username-labels)
  taskset -c 0 target/release/lastcall-turn -n --listening-ip=127.0.0.1 --listening-port="$port" \
    --relay-ip=127.0.0.1 --realm=example.org --use-auth-secret --static-auth-secret=SECRET \
    --allow-loopback-peers --admin-addr=127.0.0.1:"$admin" --log-level=error --relay-threads=1 \
    "${extra[@]}" &
  pid=$!
  for _ in $(seq 50); do curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null && break; sleep 0.1; done
  taskset -c 1 target/release/lastcall-turnload --server 127.0.0.1:"$port" --secret SECRET \
    --cpu-pid "$pid" relay --clients 4 --size 160 --duration 4 --rates 20000 \
    2>/dev/null >"$OUT/phase.json"
  local series
  series=$(curl -s "http://127.0.0.1:$admin/metrics" | grep -c '^turn_traffic_rcvp' || true)
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  python3 - "$mode" "$series" "$OUT/phase.json" <<'PY'
import json, sys
mode, series, path = sys.argv[1], sys.argv[2], sys.argv[3]
for line in open(path):
    d = json.loads(line)
    if "cpu_s" in d:
        print(f"{mode:3} server_us_per_datagram {d['server_us_per_datagram']:.3f} "
              f"loss_pct {d['loss_pct']} p50_us {d['p50_us']} p99_us {d['p99_us']} "
              f"turn_traffic_rcvp_series {series}")
PY
}
uptime
for _ in $(seq "$ROUNDS"); do
  round off
  round on
done
uptime
