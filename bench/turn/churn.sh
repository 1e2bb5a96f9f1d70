#!/usr/bin/env bash
# The churn of issue 29 (item 7): coturn's turnutils_uclient run after run against
# lastcall-turn, over UDP and TCP in turn, for minutes, in uclient's default mode (an RTP
# allocation with EVEN-PORT R=1 and its RTCP one with RESERVATION-TOKEN, plus the probe), to
# coturn's turnutils_peer. UDP runs leave allocations behind (uclient never deletes them), so
# a later run's client may reuse a 5-tuple another user still holds (441, right) and the
# relay ports in use climb. It prints every Allocate error uclient saw and every refusal the
# server logged (with the limit each names), and fails on any 508 below the limits.
#
#   bash bench/turn/churn.sh                 # 15 minutes, as in the issue (84 + 84 runs there)
#   CHURN_SECONDS=120 bash bench/turn/churn.sh
#   LASTCALL_UCLIENT="scripts/peer-run sid /usr/bin/turnutils_uclient" bash bench/turn/churn.sh
#
# Environment: CHURN_SECONDS (900), CHURN_CLIENTS (uclient -m, 4), CHURN_MSGS (-n, 20),
# LASTCALL_TURN (the server binary; default target/release, else target/debug),
# LASTCALL_UCLIENT / LASTCALL_TURNUTILS_PEER (default: this machine's coturn tools),
# CHURN_EXTRA (more server flags, e.g. "--user-quota=50").
# The suite's short form: crates/turn/tests/turn/churn.rs.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${CHURN_SECONDS:-900}
clients=${CHURN_CLIENTS:-4}
msgs=${CHURN_MSGS:-20}
turn=${LASTCALL_TURN:-}
if [ -z "$turn" ]; then
  for t in target/release/lastcall-turn target/debug/lastcall-turn; do
    [ -x "$t" ] && { turn=$t; break; }
  done
fi
[ -x "${turn:-}" ] || { echo "churn: build lastcall-turn first (cargo build --release -p lastcall-turn)" >&2; exit 2; }
read -r -a uclient <<<"${LASTCALL_UCLIENT:-turnutils_uclient}"
read -r -a peer_cmd <<<"${LASTCALL_TURNUTILS_PEER:-turnutils_peer}"
work=$(mktemp -d /tmp/lastcall-churn.XXXXXX)
free_port() { python3 -c 'import socket
for _ in range(100):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0)); p = u.getsockname()[1]
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", p)); print(p); break
    except OSError:
        pass'; }
port=$(free_port); admin=$(free_port); peer_port=$(free_port)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
# shellcheck disable=SC2086
"$turn" -n --listening-ip=127.0.0.1 --listening-port="$port" --relay-ip=127.0.0.1 \
  --realm=example.org --use-auth-secret --static-auth-secret=SECRET --allow-loopback-peers \
  --admin-addr="127.0.0.1:$admin" ${CHURN_EXTRA:-} >"$work/server.log" 2>&1 &
pids+=($!)
"${peer_cmd[@]}" -L 127.0.0.1 -p "$peer_port" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "lastcall-turn listening" "$work/server.log" && break; sleep 0.1; done
grep -q "lastcall-turn listening" "$work/server.log" || { cat "$work/server.log"; exit 2; }
allocations() { curl -s "127.0.0.1:$admin/metrics" | awk '/^turn_total_allocations/ {n += $2} END {print n + 0}'; }
echo "churn: $turn on 127.0.0.1:$port, ${uclient[*]} -m $clients -n $msgs, ${seconds}s; logs in $work"
end=$((SECONDS + seconds)); runs=0; udp=0; tcp=0; failed=0; peak=0
while [ "$SECONDS" -lt "$end" ]; do
  for mode in udp tcp; do
    flags=(); [ "$mode" = tcp ] && flags=(-t)
    runs=$((runs + 1))
    out="$work/uclient-$runs-$mode.log"
    if ! timeout 60 "${uclient[@]}" "${flags[@]}" -e 127.0.0.1 -r "$peer_port" -X -g -u churn \
        -W SECRET -n "$msgs" -m "$clients" -z 5 -p "$port" 127.0.0.1 >"$out" 2>&1; then
      failed=$((failed + 1))
    fi
    [ "$mode" = udp ] && udp=$((udp + 1)) || tcp=$((tcp + 1))
    n=$(allocations); [ "$n" -gt "$peak" ] && peak=$n
  done
done
echo "churn: $runs runs ($udp UDP, $tcp TCP), $failed exited non-zero; peak live allocations $peak (relay ports 49152-65535)"
echo "churn: Allocate errors uclient saw (code: count):"
cat "$work"/uclient-*.log | grep -o 'error [0-9]\{3\}' | sort | uniq -c | sed 's/^/  /' || true
echo "churn: capacity refusals the server logged (limit: count):"
grep -o 'code=[0-9]* limit="[a-z-]*"' "$work/server.log" | sort | uniq -c | sed 's/^/  /' || true
n508=$(cat "$work"/uclient-*.log | grep -c 'error 508' || true)
echo "churn: 508 Insufficient Capacity: $n508"
[ "$n508" -eq 0 ]
