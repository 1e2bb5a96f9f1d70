#!/usr/bin/env bash
# What one hostile or large request costs libmodsecurity + CRS with the built-in engine settings
# (docs/spoa.md, *Limits*): thread CPU time per request, by input size and place, and whether it
# was denied. Prints one line per case.
#
# Usage: bash bench/spoa/limits.sh [hostile|benign|counts|all]
# Environment:
#   RUN    a command prefix to run the measuring program with, e.g. to load another
#          libmodsecurity: RUN="scripts/peer-run trixie" (a Debian 13 chroot, scripts/peers.sh)
#   EXTRA  more directives after the engine settings, one per line
#          (e.g. EXTRA="SecPcreMatchLimit 10000000" to see the cost without the limit)
#   SIZES  KB per case (default 16,64,256,1024)
#   LIMITS 0: without the engine's limits (lastcall_modsec::crs::ENGINE_LIMITS), to compare
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-all}
SIZES=${SIZES:-16,64,256,1024}
cargo build --release -q -p lastcall-modsec --example cost
BIN=$PWD/target/release/examples/cost
extra=()
if [ -n "${EXTRA:-}" ]; then
  while IFS= read -r line; do
    [ -n "$line" ] && extra+=(--extra "$line")
  done <<<"$EXTRA"
fi
[ "${LIMITS:-1}" = 0 ] && extra+=(--without-limits)
run() { ${RUN:-} "$BIN" "$@" ${extra[@]+"${extra[@]}"}; }

if [ "$MODE" = hostile ] || [ "$MODE" = all ]; then
  for place in query body json header; do
    echo "== hostile ($place): 1' OR 1=1-- repeated"
    run sizes "$SIZES" --in "$place" | tail -n +2
  done
fi
if [ "$MODE" = benign ] || [ "$MODE" = all ]; then
  for pattern in "It's the \"best\" day; don't you think? We'll see. " \
    '{"name":"alice","note":"its fine","n":1,"tags":["a","b"]} ' \
    'QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkwYWJjZGVm+/=='; do
    for place in body json; do
      echo "== benign ($place): $pattern"
      run sizes "$SIZES" --in "$place" --pattern "$pattern" | tail -n +2
    done
  done
fi
if [ "$MODE" = counts ] || [ "$MODE" = all ]; then
  # Here a "KB" is 1,000 arguments or headers.
  for place in names headers; do
    echo "== many $place (thousands)"
    run sizes "${COUNTS:-1,5,20}" --in "$place" | tail -n +2
  done
fi
