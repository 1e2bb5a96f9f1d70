#!/usr/bin/env bash
# lastcall-turn against coturn 4.6.1 (Debian's turnserver), side by side, on loopback.
#
#   bash bench/turn/run.sh [full|smoke] [bench.py options...]
#
# full  (default): release builds, 5 alternating rounds (the first discarded), ~6 minutes.
#        Add --realtime to run server and generator SCHED_FIFO (chrt) instead of nice -15 (as
#        root): on a machine with other load this is what makes rounds comparable.
# smoke: debug builds, one short round, under a minute once built; checks every figure is
#        produced for both servers (tests/bench/test_turn_smoke.py runs it).
#
# Figures (bench.py prints them per server and as a ratio lastcall-turn / coturn):
#   server CPU seconds per million relayed datagrams at a fixed offered rate
#   (utime+stime deltas of /proc/PID/stat), the highest rate with < 0.1 % loss (ladder +
#   bisection), allocations per second, resident memory per allocation at 1,000 and 10,000
#   live allocations (VmRSS delta / N), added latency p50/p99 over a direct echo.
# With two or more CPUs the server runs on CPU 0 and the load generator on CPU 1 (taskset).
# Results: docs/benchmarks.md ("lastcall-turn"); raw data of the published runs: bench/turn/results/.
# The plot goes to docs/img/turn-bench.png (--whole-path: docs/img/turn-whole-path.png), drawn
# with Debian's python3-matplotlib.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
MODE=${1:-full}
shift || true
case "$MODE" in
  full) PROFILE=release; FLAG=--release ;;
  smoke) PROFILE=debug; FLAG= ;;
  *) echo "usage: $0 [full|smoke] [options]" >&2; exit 64 ;;
esac
PROFILE=${LASTCALL_BENCH_PROFILE:-$PROFILE}
[ "$PROFILE" = release ] && FLAG=--release
command -v turnserver >/dev/null || { echo "run.sh: coturn's turnserver is not installed (apt-get install coturn)" >&2; exit 69; }
# 10,000 allocations: a socket each in the generator and one or two in the server.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
# With the kernel fast path built in (clang, libbpf-dev: scripts/setup.sh); it runs only with
# --kernel-relay (the lastcall-turn+kernel server of --whole-path).
echo "run.sh: cargo build $FLAG -p lastcall-turn -p lastcall-turnload --features lastcall-turn/kernel-relay" >&2
cargo build $FLAG -q -p lastcall-turn -p lastcall-turnload --features lastcall-turn/kernel-relay
# Debian's Python runs the benchmark and draws its plots with Debian's matplotlib
# (python3-matplotlib, scripts/setup.sh); without it the plot is skipped.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
"$PY" -c 'import matplotlib' 2>/dev/null ||
  echo "run.sh: no matplotlib for $PY (Debian's python3-matplotlib: bash scripts/setup.sh); the plot is skipped" >&2
exec "$PY" bench/turn/bench.py --mode "$MODE" --bin-dir "target/$PROFILE" "$@"
