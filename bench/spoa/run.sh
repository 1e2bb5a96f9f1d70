#!/usr/bin/env bash
# lastcall-spoa against nginx + ModSecurity, side by side (docs/benchmarks.md, ## lastcall-spoa).
#
# Three stacks in front of the same origin (a separate nginx answering `return 200`):
#   (a) haproxy  HAProxy 2.6, no WAF: the ceiling
#   (b) spoa     HAProxy 2.6 + lastcall-spoa (crates/spoa/examples/haproxy/*.cfg, the documented
#                fail-closed configuration, with its per-request `log stdout` line removed)
#   (c) nginx    nginx + libnginx-mod-http-modsecurity
# (b) and (c) load the same rules: the engine settings and Debian's CRS 3.3.4 at paranoia
# level 1 as lastcall-spoa's built-in application has them, printed by the binary itself
# (`show-rules` for nginx, `show-config` for the agent; checked at start: the
# agent compiles the same number of rules from the file as from its built-in application).
# Equal workers: nginx worker_processes 2 = the agent's `workers: 2` (concurrent evaluations)
# = HAProxy's nbthread (2, its default here) = the number of cores.
# Pinning: the load generator (wrk, one thread) runs on CPU 1 (taskset -c 1); the servers
# are not pinned (both cores). Client and servers share the 2 cores.
#
# Usage: bash bench/spoa/run.sh [full|smoke|soak|profile]
#   full     (default) rounds x {benign, mixed} x concurrency {1,8,32,128} x {a,b,c};
#            the three stacks alternate inside every cell; medians over rounds
#   smoke    every stack, both traffic kinds, concurrency 8, 2 s each; checks the verdicts
#            (benign: all 200; mixed: 403s from (b) and (c), no 5xx, no socket errors)
#   soak     (b) under steady mixed load at concurrency 32 for SOAK_SECONDS (600); the
#            agent's RSS sampled every 10 s (SOAK_SETUP=c: the same for nginx + ModSecurity,
#            the RSS of its workers, as a control)
#   profile  CPU time per request of each process for (c), (b) and (b) without the response
#            group (mixed traffic, concurrency 32, twice); then `perf record` of the agent under
#            (b); splits its CPU time into inside libmodsecurity and outside, and the outside
#            part by category (bench/spoa/perf_split.py)
# Several full runs combine: python3 bench/spoa/report.py OUT1/results.jsonl OUT2/results.jsonl
# Environment: OUT (results directory; default target/bench-spoa/<mode>), DURATION (s per
# cell, full: 10), WARMUP (s, full: 2), ROUNDS (full: 3), CONCURRENCY ("1 8 32 128"),
# PLOT (PNG to write, full: docs/img/bench-spoa.png; soak: docs/img/bench-spoa-soak.png),
# SOAK_SECONDS (600), CONC (soak and profile: 32), TRAFFIC_KIND (profile: mixed),
# PROFILE_SECONDS (15), CPU_SECONDS (10), PERF_FREQ (997),
# LASTCALL_SPOA_BIN (agent binary; default: release build, debug build for smoke),
# NGINX_PRELOAD (a library nginx is started with in LD_PRELOAD, e.g. Debian's libmimalloc.so.2),
# SPOA_EVALUATION (the agent's `evaluation`: inline or pool; default: the agent's default),
# AGENT_SOCKET (how HAProxy reaches the agent: tcp, the default, or unix),
# SPOA_RESPONSE_GROUP (0: (b) without the `http-response` lines; default 1),
# SPOA_ALLOCATOR (mimalloc, the agent's default, or glibc: the agent built without its
# `mimalloc` feature, so that it allocates as nginx does),
# and the tests' peer commands (docs/peers.md): LASTCALL_HAPROXY (stacks a, b),
# LASTCALL_NGINX (stack c; the origin stays this machine's nginx), LASTCALL_SPOA_RUNNER (a
# prefix for the agent), e.g. HAProxy 3.2 with the agent and nginx on Debian 13's
# libmodsecurity 3.0.14:
#   LASTCALL_HAPROXY="scripts/peer-run sid /usr/sbin/haproxy" \
#   LASTCALL_NGINX="scripts/peer-run trixie /usr/sbin/nginx" \
#   LASTCALL_SPOA_RUNNER="scripts/peer-run trixie" SPOA_ALLOCATOR=glibc bash bench/spoa/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BENCH=$ROOT/bench/spoa
MODE=${1:-full}
case "$MODE" in full | smoke | soak | profile) ;; *)
  echo "usage: $0 [full|smoke|soak|profile]" >&2
  exit 64
  ;;
esac

OUT=${OUT:-$ROOT/target/bench-spoa/$MODE}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/bench-spoa.XXXXXX)
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[bench $(date -u +%H:%M:%S)] $*" >&2; }
die() {
  echo "bench: $*" >&2
  exit 1
}

# ---- tools -------------------------------------------------------------------------------
if ! command -v wrk >/dev/null; then
  log "installing wrk (Debian)"
  apt-get install -y wrk >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y wrk >/dev/null; }
fi
# The peers' commands (words), as the tests take them (lastcall_testkit::peers).
read -r -a HAPROXY <<<"${LASTCALL_HAPROXY:-haproxy}"
read -r -a NGINX <<<"${LASTCALL_NGINX:-nginx}"
read -r -a RUNNER <<<"${LASTCALL_SPOA_RUNNER:-}"
for t in wrk haproxy nginx curl taskset python3; do command -v "$t" >/dev/null || die "$t not found"; done
# The plots: Debian's Python with Debian's matplotlib (python3-matplotlib, scripts/setup.sh).
PLOT_PY=${PLOT_PY:-/usr/bin/python3}
PLOT_TITLE=${PLOT_TITLE:-"HAProxy + lastcall-spoa, nginx + ModSecurity (same engine, same CRS); 2 cores shared with the load generator"}
MODSEC_MODULE=/usr/lib/nginx/modules/ngx_http_modsecurity_module.so
[ -f "$MODSEC_MODULE" ] || die "$MODSEC_MODULE missing (apt-get install libnginx-mod-http-modsecurity)"
[ -f /etc/modsecurity/crs/crs-setup.conf ] || die "Debian's modsecurity-crs is not installed"

if [ -n "${LASTCALL_SPOA_BIN:-}" ]; then
  AGENT=$LASTCALL_SPOA_BIN
elif [ "$MODE" = smoke ]; then
  log "cargo build -p lastcall-spoa (debug)"
  cargo build -q -p lastcall-spoa
  AGENT=$ROOT/target/debug/lastcall-spoa
else
  case "${SPOA_ALLOCATOR:-mimalloc}" in
    mimalloc) features=() ;;
    glibc) features=(--no-default-features) ;;
    *) die "SPOA_ALLOCATOR must be mimalloc or glibc, not '$SPOA_ALLOCATOR'" ;;
  esac
  log "cargo build --release -p lastcall-spoa ${features[*]}"
  cargo build -q --release -p lastcall-spoa "${features[@]}"
  AGENT=$ROOT/target/release/lastcall-spoa
fi
[ -x "$AGENT" ] || die "agent binary $AGENT missing"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits (up to 30 s) until `curl` through $1 gets status 200.
wait_200() {
  local url=$1 end=$((SECONDS + 30))
  until [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: shop.example.com' "$url" || true)" = 200 ]; do
    [ $SECONDS -lt $end ] || die "$url did not answer 200 within 30 s"
    sleep 0.1
  done
}

# ---- configuration -----------------------------------------------------------------------
# The rules of lastcall-spoa's built-in application come from the binary itself, never a
# copy: `show-rules` prints the SecLang text it compiles (nginx gets the same text), and
# `show-config` the configuration file that runs it (the agent gets that file).

ORIGIN_PORT=$(free_port)
AGENT_PORT=$(free_port)
AGENT_ADMIN=$(free_port)
PLAIN_PORT=$(free_port)
SPOA_PORT=$(free_port)
NGINX_PORT=$(free_port)

# AGENT_SOCKET=unix: HAProxy reaches the agent over a Unix socket (as in a pod sharing an
# emptyDir) instead of loopback TCP.
case "${AGENT_SOCKET:-tcp}" in
  tcp)
    AGENT_BIND=127.0.0.1:$AGENT_PORT
    AGENT_ADDR=127.0.0.1:$AGENT_PORT
    ;;
  unix)
    AGENT_BIND=unix://$WORK/agent.sock
    AGENT_ADDR=unix@$WORK/agent.sock
    ;;
  *) die "AGENT_SOCKET must be tcp or unix, not '$AGENT_SOCKET'" ;;
esac

"${RUNNER[@]}" "$AGENT" show-rules >"$WORK/rules.conf"
"${RUNNER[@]}" "$AGENT" show-config |
  sed -e "s|^bind: .*|bind: \"$AGENT_BIND\"|" -e 's/^workers: .*/workers: 2/' >"$WORK/agent.yaml"
[ -z "${SPOA_EVALUATION:-}" ] || echo "evaluation: $SPOA_EVALUATION" >>"$WORK/agent.yaml"

# Same rules as the built-in application? Compare the compiled rule counts.
builtin_rules=$("${RUNNER[@]}" "$AGENT" --validate --admin-addr off | sed -n 's/.*, \([0-9]*\) rules,.*/\1/p')
file_rules=$("${RUNNER[@]}" "$AGENT" -c "$WORK/agent.yaml" --validate --admin-addr off | sed -n 's/.*, \([0-9]*\) rules,.*/\1/p')
[ -n "$builtin_rules" ] && [ "$builtin_rules" = "$file_rules" ] ||
  die "rules file compiles to '$file_rules' rules, the built-in application to '$builtin_rules'"
log "rules: $file_rules (same count as the agent's built-in application)"

cat >"$WORK/origin.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $WORK/origin.pid;
error_log $WORK/origin-error.log;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/o_body;
    proxy_temp_path $WORK/o_proxy;
    fastcgi_temp_path $WORK/o_fcgi;
    uwsgi_temp_path $WORK/o_uwsgi;
    scgi_temp_path $WORK/o_scgi;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$ORIGIN_PORT;
        location / { return 200 "ok\n"; }
    }
}
EOF

cat >"$WORK/nginx-modsec.conf" <<EOF
load_module $MODSEC_MODULE;
daemon off;
worker_processes 2;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/n_body;
    proxy_temp_path $WORK/n_proxy;
    fastcgi_temp_path $WORK/n_fcgi;
    uwsgi_temp_path $WORK/n_uwsgi;
    scgi_temp_path $WORK/n_scgi;
    underscores_in_headers on;
    ignore_invalid_headers off;
    keepalive_requests 1000000;
    client_max_body_size 20m;
    client_body_buffer_size 1m;
    modsecurity on;
    modsecurity_rules_file $WORK/rules.conf;
    upstream origin {
        server 127.0.0.1:$ORIGIN_PORT;
        keepalive 256;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        server_name _;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$http_host;
        }
    }
}
EOF

cat >"$WORK/haproxy-plain.cfg" <<EOF
global
    nbthread 2
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend web
    bind 127.0.0.1:$PLAIN_PORT
    option http-buffer-request
    default_backend origin
backend origin
    server origin 127.0.0.1:$ORIGIN_PORT
EOF

# The documented configuration, without its per-request log line; nbthread stated.
# SPOA_RESPONSE_GROUP=0: also without its `http-response` lines (no response body wait, no
# `coraza-res`), as docs/spoa.md allows when no application checks responses.
sed -e '/^[[:space:]]*log stdout/d' -e 's/^global$/global\n    nbthread 2/' \
  crates/spoa/examples/haproxy/haproxy.cfg >"$WORK/haproxy-spoa.cfg"
case "${SPOA_RESPONSE_GROUP:-1}" in
  1) ;;
  0) sed -i '/^[[:space:]]*http-response/d' "$WORK/haproxy-spoa.cfg" ;;
  *) die "SPOA_RESPONSE_GROUP must be 1 or 0, not '$SPOA_RESPONSE_GROUP'" ;;
esac
cp crates/spoa/examples/haproxy/coraza.cfg "$WORK/coraza.cfg"

# ---- start -------------------------------------------------------------------------------
start_origin() {
  nginx -p "$WORK" -c "$WORK/origin.conf" -e "$WORK/origin-error.log" &
  ORIGIN_PID=$!
  PIDS+=($ORIGIN_PID)
  wait_200 "http://127.0.0.1:$ORIGIN_PORT/"
}
start_plain() {
  "${HAPROXY[@]}" -db -f "$WORK/haproxy-plain.cfg" >"$WORK/haproxy-plain.log" 2>&1 &
  PIDS+=($!)
  wait_200 "http://127.0.0.1:$PLAIN_PORT/"
}
start_spoa() {
  "${RUNNER[@]}" "$AGENT" -c "$WORK/agent.yaml" --admin-addr "127.0.0.1:$AGENT_ADMIN" 2>"$WORK/agent.log" &
  AGENT_PID=$!
  PIDS+=($AGENT_PID)
  FRONTEND_ADDR=127.0.0.1:$SPOA_PORT ORIGIN_ADDR=127.0.0.1:$ORIGIN_PORT \
    SPOA1_ADDR=$AGENT_ADDR SPOA2_ADDR=$AGENT_ADDR \
    CORAZA_SPOE_CFG=$WORK/coraza.cfg STATS_SOCKET=$WORK/haproxy-spoa.sock \
    "${HAPROXY[@]}" -db -f "$WORK/haproxy-spoa.cfg" >"$WORK/haproxy-spoa.log" 2>&1 &
  HAPROXY_SPOA_PID=$!
  PIDS+=($HAPROXY_SPOA_PID)
  wait_200 "http://127.0.0.1:$SPOA_PORT/"
}
# Variant for the CPU accounting: the same, without the response check (every
# `http-response` line dropped), as an application with response_check off allows.
start_spoa_noresp() {
  NORESP_PORT=$(free_port)
  grep -v '^[[:space:]]*http-response' "$WORK/haproxy-spoa.cfg" >"$WORK/haproxy-spoa-noresp.cfg"
  FRONTEND_ADDR=127.0.0.1:$NORESP_PORT ORIGIN_ADDR=127.0.0.1:$ORIGIN_PORT \
    SPOA1_ADDR=$AGENT_ADDR SPOA2_ADDR=$AGENT_ADDR \
    CORAZA_SPOE_CFG=$WORK/coraza.cfg STATS_SOCKET=$WORK/haproxy-spoa-noresp.sock \
    "${HAPROXY[@]}" -db -f "$WORK/haproxy-spoa-noresp.cfg" >"$WORK/haproxy-spoa-noresp.log" 2>&1 &
  HAPROXY_NORESP_PID=$!
  PIDS+=($HAPROXY_NORESP_PID)
  wait_200 "http://127.0.0.1:$NORESP_PORT/"
}
start_nginx() {
  "${NGINX[@]}" -p "$WORK" -c "$WORK/nginx-modsec.conf" -e "$WORK/nginx-error.log" -t -q ||
    die "nginx -t failed: $(cat "$WORK/nginx-error.log")"
  # NGINX_PRELOAD=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2: nginx with the agent's allocator
  # (a control for how much of the difference is malloc; env execs nginx, the PID is nginx's).
  ${NGINX_PRELOAD:+env LD_PRELOAD=$NGINX_PRELOAD} "${NGINX[@]}" -p "$WORK" -c "$WORK/nginx-modsec.conf" -e "$WORK/nginx-error.log" &
  NGINX_PID=$!
  PIDS+=($NGINX_PID)
  wait_200 "http://127.0.0.1:$NGINX_PORT/"
}

url_of() {
  case $1 in
    a) echo "http://127.0.0.1:$PLAIN_PORT/" ;;
    b) echo "http://127.0.0.1:$SPOA_PORT/" ;;
    c) echo "http://127.0.0.1:$NGINX_PORT/" ;;
    d) echo "http://127.0.0.1:$NORESP_PORT/" ;;
  esac
}
name_of() {
  case $1 in
    a) echo "haproxy" ;;
    b) echo "haproxy+lastcall-spoa" ;;
    c) echo "nginx+modsecurity" ;;
    d) echo "haproxy+lastcall-spoa, no response group" ;;
  esac
}

# wrk_run SETUP TRAFFIC CONC SECONDS -> prints the RESULT json (without the prefix)
wrk_run() {
  local setup=$1 traffic=$2 conc=$3 secs=$4
  TRAFFIC=$traffic taskset -c 1 wrk -t1 -c"$conc" -d"${secs}s" --timeout 10s \
    -s "$BENCH/traffic.lua" "$(url_of "$setup")" >"$WORK/wrk.out" 2>&1 ||
    die "wrk failed: $(cat "$WORK/wrk.out")"
  sed -n 's/^RESULT //p' "$WORK/wrk.out"
}

load1() { cut -d' ' -f1 /proc/loadavg; }

# measure ROUND SETUP TRAFFIC CONC: warm-up, measured run; appends a JSON line to results.
measure() {
  local round=$1 setup=$2 traffic=$3 conc=$4
  [ "${WARMUP:-0}" -gt 0 ] && wrk_run "$setup" "$traffic" "$conc" "$WARMUP" >/dev/null
  local l0 l1 r
  l0=$(load1)
  r=$(wrk_run "$setup" "$traffic" "$conc" "$DURATION")
  l1=$(load1)
  [ -n "$r" ] || die "no RESULT from wrk: $(cat "$WORK/wrk.out")"
  printf '{"round":%s,"setup":"%s","name":"%s","traffic":"%s","conc":%s,"load1_before":%s,"load1_after":%s,"result":%s}\n' \
    "$round" "$setup" "$(name_of "$setup")" "$traffic" "$conc" "$l0" "$l1" "$r" >>"$OUT/results.jsonl"
  python3 - "$r" "$setup" "$traffic" "$conc" "$l1" <<'PY' >&2
import json, sys
r = json.loads(sys.argv[1])
rps = r["requests"] / (r["duration_us"] / 1e6)
print(f"  {sys.argv[2]} {sys.argv[3]:<6} c={sys.argv[4]:<4} {rps:9.0f} req/s  p50 {r['p50_us']/1e3:7.2f} ms  "
      f"p99 {r['p99_us']/1e3:7.2f} ms  status {r['status']}  load1 {sys.argv[5]}")
PY
}

machine_info() {
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "nproc: $(nproc)"
    echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    echo "kernel: $(uname -r)"
    echo "haproxy: $("${HAPROXY[@]}" -v | head -1) (${HAPROXY[*]})"
    echo "nginx: $("${NGINX[@]}" -v 2>&1) (${NGINX[*]})"
    echo "agent engine: $("${RUNNER[@]}" "$AGENT" --version) (${RUNNER[*]:-host libraries}; allocator ${SPOA_ALLOCATOR:-mimalloc})"
    echo "libmodsecurity (this machine's): $(dpkg-query -W -f '${Version}' libmodsecurity3 2>/dev/null || true)"
    echo "modsecurity-crs (this machine's): $(dpkg-query -W -f '${Version}' modsecurity-crs 2>/dev/null || true)"
    echo "nginx module (this machine's): $(dpkg-query -W -f '${Version}' libnginx-mod-http-modsecurity 2>/dev/null || true)"
    echo "wrk: $(dpkg-query -W -f '${Version}' wrk 2>/dev/null || true)"
    echo "agent: $(case $AGENT in "$ROOT"/*) echo "${AGENT#"$ROOT"/}" ;; *) basename "$AGENT" ;; esac) ($(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet -- crates/spoa crates/modsec || echo ', crates/spoa or crates/modsec modified in the work tree'))"
    echo "rules: $file_rules"
    echo "agent socket: ${AGENT_SOCKET:-tcp}; evaluation: ${SPOA_EVALUATION:-default}; response group: ${SPOA_RESPONSE_GROUP:-1}"
    echo "loadavg at start: $(cat /proc/loadavg)"
  } >"$OUT/machine.txt"
  cat "$OUT/machine.txt" >&2
}

# CPU time (clock ticks, user + system) of processes and their children (nginx's workers).
cpu_ticks() {
  local total=0 p
  for p in "$@" $(pgrep -P "$(echo "$@" | tr ' ' ',')" || true); do
    total=$((total + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$total"
}

# cpu_per_request SETUP LABEL=PIDS... : mixed traffic, c=$CONC, for $CPU_SECONDS; prints the
# CPU milliseconds per request of each group of processes.
cpu_per_request() {
  local setup=$1 hz r n line="" total=0
  shift
  hz=$(getconf CLK_TCK)
  declare -A before
  for g in "$@"; do before[$g]=$(cpu_ticks ${g#*=}); done
  r=$(wrk_run "$setup" "$TRAFFIC_KIND" "$CONC" "$CPU_SECONDS")
  n=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["requests"])' "$r")
  for g in "$@"; do
    local b=${before[$g]} d
    d=$(($(cpu_ticks ${g#*=}) - b))
    total=$((total + d))
    line+=" ${g%%=*} $(python3 -c "print(f'{$d * 1000 / $hz / $n:.3f}')") ms;"
  done
  echo "$(name_of "$setup"): $n requests in ${CPU_SECONDS}s; CPU per request:$line total $(python3 -c "print(f'{$total * 1000 / $hz / $n:.3f}')") ms (load1 $(load1))" |
    tee -a "$OUT/cpu-per-request.txt" >&2
}

rss_kib() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }

# ---- modes -------------------------------------------------------------------------------
start_origin
case "$MODE" in
  full | smoke)
    start_plain
    start_spoa
    start_nginx
    machine_info
    : >"$OUT/results.jsonl"
    if [ "$MODE" = smoke ]; then
      DURATION=${DURATION:-2} WARMUP=${WARMUP:-0} ROUNDS=1 CONCURRENCY=${CONCURRENCY:-8}
    else
      DURATION=${DURATION:-10} WARMUP=${WARMUP:-2} ROUNDS=${ROUNDS:-3} CONCURRENCY=${CONCURRENCY:-"1 8 32 128"}
    fi
    log "$MODE: rounds $ROUNDS, ${DURATION}s per cell (+${WARMUP}s warm-up), concurrency $CONCURRENCY"
    for round in $(seq "$ROUNDS"); do
      for traffic in benign mixed; do
        for conc in $CONCURRENCY; do
          # Alternate the order of the stacks from round to round.
          case $((round % 3)) in 1) order="a b c" ;; 2) order="c a b" ;; 0) order="b c a" ;; esac
          for s in $order; do measure "$round" "$s" "$traffic" "$conc"; done
        done
      done
    done
    echo "agent RSS after the run: $(rss_kib "$AGENT_PID") KiB" >>"$OUT/machine.txt"
    echo "loadavg at end: $(cat /proc/loadavg)" >>"$OUT/machine.txt"
    cp "$WORK/agent.log" "$OUT/agent.log"
    cp "$WORK/nginx-error.log" "$OUT/nginx-error.log"
    if [ "$MODE" = smoke ]; then
      python3 "$BENCH/report.py" --smoke "$OUT/results.jsonl"
    else
      PLOT=${PLOT:-$ROOT/docs/img/bench-spoa.png}
      python3 "$BENCH/report.py" "$OUT/results.jsonl" | tee "$OUT/table.md"
      if "$PLOT_PY" -c 'import matplotlib' 2>/dev/null; then
        mkdir -p "$(dirname "$PLOT")"
        "$PLOT_PY" "$BENCH/report.py" --plot "$PLOT" --title "$PLOT_TITLE" "$OUT/results.jsonl" >/dev/null
        log "plot: $PLOT"
      else
        log "no matplotlib for $PLOT_PY (Debian's python3-matplotlib: bash scripts/setup.sh): no plot"
      fi
    fi
    ;;
  soak)
    SOAK_SECONDS=${SOAK_SECONDS:-600}
    CONC=${CONC:-32}
    SOAK_SETUP=${SOAK_SETUP:-b}
    case $SOAK_SETUP in
      b)
        start_spoa
        measured() { rss_kib "$AGENT_PID"; }
        ;;
      c) # the control: nginx + ModSecurity, RSS of its two workers together
        start_nginx
        measured() {
          local t=0 p
          for p in $(pgrep -P "$NGINX_PID"); do t=$((t + $(rss_kib "$p"))); done
          echo "$t"
        }
        ;;
      *) die "SOAK_SETUP must be b or c" ;;
    esac
    machine_info
    log "soak: ($SOAK_SETUP) mixed traffic, c=$CONC, ${SOAK_SECONDS}s; RSS every 10 s"
    echo "t_s,rss_kib,load1" >"$OUT/rss.csv"
    TRAFFIC=mixed taskset -c 1 wrk -t1 -c"$CONC" -d"${SOAK_SECONDS}s" --timeout 10s \
      -s "$BENCH/traffic.lua" "$(url_of "$SOAK_SETUP")" >"$OUT/wrk.out" 2>&1 &
    WRK_PID=$!
    PIDS+=($WRK_PID)
    # A sample every 10 s on a fixed schedule (t = 0, 10, 20, ...), and one at the end.
    t0=$(date +%s.%N)
    k=0
    while kill -0 "$WRK_PID" 2>/dev/null; do
      echo "$((k * 10)),$(measured),$(load1)" >>"$OUT/rss.csv"
      k=$((k + 1))
      while kill -0 "$WRK_PID" 2>/dev/null &&
        python3 -c "import sys,time; sys.exit(0 if time.time() < $t0 + $k * 10 else 1)"; do
        sleep 0.2
      done
    done
    echo "$(python3 -c "import time; print(int(time.time() - $t0))"),$(measured),$(load1)" >>"$OUT/rss.csv"
    wait "$WRK_PID" || true
    echo "loadavg at end: $(cat /proc/loadavg)" >>"$OUT/machine.txt"
    if [ "$SOAK_SETUP" = b ]; then
      curl -s "http://127.0.0.1:$AGENT_ADMIN/metrics" >"$OUT/agent-metrics.txt" || true
      cp "$WORK/agent.log" "$OUT/agent.log"
    fi
    PLOT=${PLOT:-$ROOT/docs/img/bench-spoa-soak.png}
    if "$PLOT_PY" -c 'import matplotlib' 2>/dev/null; then
      "$PLOT_PY" "$BENCH/report.py" --soak "$OUT/rss.csv" --plot "$PLOT" \
        --label "$([ "$SOAK_SETUP" = b ] && echo lastcall-spoa || echo 'nginx + ModSecurity (2 workers)')" "$OUT/wrk.out"
    else
      python3 "$BENCH/report.py" --soak "$OUT/rss.csv" "$OUT/wrk.out"
    fi
    ;;
  profile)
    start_spoa
    start_spoa_noresp
    start_nginx
    machine_info
    command -v perf >/dev/null || { apt-get install -y linux-perf >/dev/null 2>&1 || die "perf missing"; }
    SECS=${PROFILE_SECONDS:-15}
    CONC=${CONC:-32}
    CPU_SECONDS=${CPU_SECONDS:-10}
    TRAFFIC_KIND=${TRAFFIC_KIND:-mixed}
    : >"$OUT/cpu-per-request.txt"
    log "CPU per request, $TRAFFIC_KIND c=$CONC, ${CPU_SECONDS}s each, (c) then (b), twice"
    for _ in 1 2; do
      cpu_per_request c "nginx=$NGINX_PID" "origin=$ORIGIN_PID"
      cpu_per_request b "haproxy=$HAPROXY_SPOA_PID" "agent=$AGENT_PID" "origin=$ORIGIN_PID"
      cpu_per_request d "haproxy=$HAPROXY_NORESP_PID" "agent=$AGENT_PID" "origin=$ORIGIN_PID"
    done
    log "profile: (b) $TRAFFIC_KIND c=$CONC; perf record of the agent for ${SECS}s"
    TRAFFIC=$TRAFFIC_KIND taskset -c 1 wrk -t1 -c"$CONC" -d"$((SECS + 6))s" --timeout 10s \
      -s "$BENCH/traffic.lua" "$(url_of b)" >"$OUT/wrk.out" 2>&1 &
    WRK_PID=$!
    PIDS+=($WRK_PID)
    sleep 2 # warm-up (the load is already running; nothing to await)
    perf record -F "${PERF_FREQ:-997}" --call-graph dwarf,16384 -p "$AGENT_PID" \
      -o "$OUT/perf.data" -- sleep "$SECS" 2>"$OUT/perf-record.log"
    wait "$WRK_PID" || true
    sed -n 's/^RESULT //p' "$OUT/wrk.out" >"$OUT/wrk-result.json"
    perf script -i "$OUT/perf.data" -F tid,period,ip,sym,dso 2>/dev/null >"$OUT/perf.script"
    python3 "$BENCH/perf_split.py" "$OUT/perf.script" | tee "$OUT/split.txt"
    ;;
esac
log "results in $OUT"
