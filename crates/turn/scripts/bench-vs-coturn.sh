#!/usr/bin/env bash
# Relayed rate and server CPU of lastcall-turn next to coturn's turnserver, on the same
# turnutils_uclient load command (turn.md, "Interop and load tools"), loopback only.
#
#   crates/turn/scripts/bench-vs-coturn.sh [ROUNDS] [UCLIENT EXTRA ARGS...]
#
# Each round runs lastcall-turn (release build) then coturn; each server is started fresh on
# free ports, loaded by one uclient run, and stopped. Server CPU = utime+stime from
# /proc/PID/stat over the uclient run. "relayed" counts messages that went client -> relay ->
# peer -> relay -> client (uclient's tot_recv_msgs); every such message is two relayed
# datagrams through the server.
set -euo pipefail

ROUNDS=${1:-2}
shift || true
EXTRA=("$@")
SECRET=bench-secret
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
TICK=$(getconf CLK_TCK)
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket
while True:
    t = socket.socket(); t.bind(("127.0.0.1", 0)); p = t.getsockname()[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.bind(("127.0.0.1", p)); print(p); break
    except OSError:
        pass'
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# System-wide UDP receive-buffer overflows (any socket: server, uclient or peer).
rcvbuf_errors() { awk '/^Udp:/ { if (h) { print $6; exit } h = 1 }' /proc/net/snmp; }

wait_udp_stun() { # wait until a STUN Binding on UDP $1 is answered
  python3 - "$1" <<'PY'
import os, socket, struct, sys, time
port = int(sys.argv[1]); s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.2)
deadline = time.time() + 30
while time.time() < deadline:
    s.sendto(struct.pack("!HHI", 1, 0, 0x2112A442) + os.urandom(12), ("127.0.0.1", port))
    try:
        s.recvfrom(2048); sys.exit(0)
    except OSError:
        pass
sys.exit("server did not answer on port %d" % port)
PY
}

(cd "$ROOT" && cargo build --release -p lastcall-turn >/dev/null 2>&1)
LASTCALL="$ROOT/target/release/lastcall-turn"

PEER_PORT=$(free_port)
turnutils_peer -L 127.0.0.1 -p "$PEER_PORT" >/dev/null 2>&1 &
PIDS+=($!)

run_one() { # name, then the server command line (PORT is substituted)
  local name=$1; shift
  local port admin
  port=$(free_port); admin=$(free_port)
  local cmd=("${@//PORT/$port}")
  cmd=("${cmd[@]//ADMIN/$admin}")
  "${cmd[@]}" >"$WORK/$name.log" 2>&1 &
  local pid=$!
  PIDS+=($pid)
  wait_udp_stun "$port"
  local t0 c0 t1 c1 out
  local e0 e1
  e0=$(rcvbuf_errors); c0=$(cpu_ticks "$pid"); t0=$(date +%s.%N)
  out=$(turnutils_uclient -W "$SECRET" -u bench -e 127.0.0.1 -r "$PEER_PORT" -m 10 -n 20000 \
        -l 120 -z 0 -c -p "$port" "${EXTRA[@]}" 127.0.0.1 2>&1 || true)
  t1=$(date +%s.%N); c1=$(cpu_ticks "$pid"); e1=$(rcvbuf_errors)
  # SIGKILL: on SIGTERM lastcall-turn would (rightly) drain, waiting for uclient's
  # allocations, which it never deletes, to expire.
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local sent recv lost
  sent=$( (grep -v msz= <<<"$out" | grep -o 'tot_send_msgs=[0-9]*' || true) | tail -1 | cut -d= -f2)
  recv=$( (grep -v msz= <<<"$out" | grep -o 'tot_recv_msgs=[0-9]*' || true) | tail -1 | cut -d= -f2)
  lost=$( (grep -o 'Total lost packets [0-9]* ([0-9.]*%)' <<<"$out" || true) | tail -1)
  if [ -z "$recv" ]; then
    echo "$name: uclient reported no totals; its last lines:"; tail -5 <<<"$out"
  fi
  awk -v n="$name" -v s="${sent:-0}" -v r="${recv:-0}" -v l="${lost:-?}" \
      -v t0="$t0" -v t1="$t1" -v c0="$c0" -v c1="$c1" -v tick="$TICK" -v e=$((e1 - e0)) 'BEGIN {
    wall = t1 - t0; cpu = (c1 - c0) / tick;
    printf "%-13s sent %7d  echoed %7d  %-28s wall %6.2f s  rate %8.0f msg/s  server CPU %6.2f s  %5.1f us/relayed datagram  UDP rcvbuf drops %d\n",
      n, s, r, l, wall, r / wall, cpu, (r > 0 ? cpu * 1e6 / (2 * r) : 0), e }'
}

echo "load: turnutils_uclient -W $SECRET -u bench -e 127.0.0.1 -r PEER -m 10 -n 20000 -l 120 -z 0 -c -p PORT ${EXTRA[*]} 127.0.0.1"
echo "cpus: $(nproc); clock ticks/s: $TICK"
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round"
  run_one lastcall-turn "$LASTCALL" -n --listening-ip=127.0.0.1 --listening-port=PORT \
    --relay-ip=127.0.0.1 --realm=example.org --use-auth-secret --static-auth-secret="$SECRET" \
    --allow-loopback-peers --admin-addr=127.0.0.1:ADMIN --log-level=warn
  run_one coturn turnserver -n --no-cli --listening-ip=127.0.0.1 --relay-ip=127.0.0.1 --no-tls \
    --no-dtls --realm=example.org --use-auth-secret --static-auth-secret="$SECRET" \
    --allow-loopback-peers --listening-port=PORT --log-file=stdout --simple-log
done
