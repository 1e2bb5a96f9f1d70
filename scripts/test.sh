#!/usr/bin/env bash
# Installs what is missing, then runs every check and test: formatting, clippy, the Rust test
# suite (unit, paused-clock, process-level and interop tests against real HAProxy, coturn's
# clients and libmodsecurity), the chart tests (dashboards and alert rules included), the docs'
# test commands and paths (tests/docs), every fuzz target for a bounded time
# (FUZZ_SECONDS, default 20 s each; see scripts/fuzz.sh), and the container tests
# (scripts/test_containers.sh, in the background beside the rest), and the interop tests again
# against today's peers: HAProxy 3.0/3.2, libmodsecurity 3.0.14/3.0.16, nginx, coturn 4.18
# (scripts/test_peers.sh, from Debian 13 and unstable chroots built beside the rest;
# LASTCALL_PEER_SUITES, default "trixie sid"; empty skips them), then, once nothing else of
# the run is busy, the Python tests that measure (`-m measures`: the TURN benchmark's smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

export CARGO_TERM_COLOR=never
echo "== cargo fmt --check"
cargo fmt --all --check

# The container tests (images built without a registry, run on a private dockerd and
# through containerd's CRI; scripts/test_containers.sh) mostly wait on drains and rollouts:
# they run in the background, beside everything below, in their own session so that they
# can be stopped as a whole. Their output comes at the end.
bash scripts/test_python.sh --setup
containers_log=$(mktemp "${TMPDIR:-/tmp}/lastcall-containers.XXXXXX")
# Touched when the workspace is built: the prebuilt-binaries image test waits for it.
export LASTCALL_BUILT_MARKER=$containers_log.built
containers_start=$SECONDS
setsid bash scripts/test_containers.sh >"$containers_log" 2>&1 &
containers_pid=$!
stop_containers() {
  if kill -0 "$containers_pid" 2>/dev/null; then
    echo "== stopping the container tests"
    kill -TERM -- "-$containers_pid" 2>/dev/null || true
    wait "$containers_pid" 2>/dev/null || true
  fi
  cat "$containers_log"
  rm -f "$containers_log" "$LASTCALL_BUILT_MARKER"
}
trap stop_containers EXIT

# Today's peers: the chroots (scripts/peers.sh, cached; a cold build is mostly downloads and
# dpkg) are made in the background now; their tests run after the main suite.
read -r -a peer_suites <<<"${LASTCALL_PEER_SUITES-trixie sid}"
peers_pid=
peers_log=$(mktemp "${TMPDIR:-/tmp}/lastcall-peers-build.XXXXXX")
if ((${#peer_suites[@]})) && [ "$(id -u)" -eq 0 ]; then
  {
    built_from=$(date +%s)
    rc=0
    bash scripts/peers.sh ensure "${peer_suites[@]}" || rc=$?
    echo "== today's peers: scripts/peers.sh ensure took $(($(date +%s) - built_from)) s (exit $rc)"
    exit "$rc"
  } >"$peers_log" 2>&1 &
  peers_pid=$!
fi

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo clippy, with lastcall-turn's kernel fast path (eBPF, built by clang)"
cargo clippy --workspace --all-targets --locked --features lastcall-turn/kernel-relay -- -D warnings
echo "== build binaries used by the process-level tests"
cargo build --workspace --bins --examples --locked
touch "$LASTCALL_BUILT_MARKER"
echo "== Python tests (charts, PID 1, the SPOA benchmark's smoke)"
bash scripts/test_python.sh
echo "== doc tests"
cargo test --workspace --locked --doc
echo "== cargo test (with the kernel fast path: its tests load the eBPF program as root)"
kernel="--features lastcall-turn/kernel-relay"
rust_status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast $kernel || rust_status=$?
else
  cargo test --workspace --locked --no-fail-fast $kernel || rust_status=$?
fi
# The docs' test commands and paths (tests/docs), now that every test binary is built with the
# features above: `cargo nextest list` then builds nothing.
echo "== docs: every test command and repository path in docs/ and the READMEs"
docs_status=0
LASTCALL_DOCS_FEATURES=lastcall-turn/kernel-relay bash scripts/test_python.sh tests/docs || docs_status=$?
fuzz_status=0
if [ "$rust_status" -eq 0 ]; then
  echo "== fuzz targets (${FUZZ_SECONDS:-20} s each)"
  bash scripts/fuzz.sh || fuzz_status=$?
fi

peers_status=0
if [ -n "$peers_pid" ]; then
  echo "== today's peers: chroots (started in the background)"
  wait "$peers_pid" || peers_status=$?
  cat "$peers_log"
  if [ "$peers_status" -eq 0 ]; then
    peers_tests_start=$SECONDS
    bash scripts/test_peers.sh "${peer_suites[@]}" || peers_status=$?
    echo "== today's peers: tests took $((SECONDS - peers_tests_start)) s (exit $peers_status)"
  fi
elif ((${#peer_suites[@]})); then
  echo "== today's peers: skipped (making chroots needs root; as root: bash scripts/test_peers.sh)"
fi
rm -f "$peers_log"

echo "== container tests (started in the background; waiting)"
containers_status=0
wait "$containers_pid" || containers_status=$?
trap - EXIT
cat "$containers_log"
rm -f "$containers_log" "$LASTCALL_BUILT_MARKER"
echo "== container tests: exit $containers_status (started ${containers_start} s into this run; their own time is in the line test_containers: above)"
# What needs the machine's spare CPU (the TURN benchmark's smoke rounds, paced in real time)
# runs last, when nothing of this run builds or rolls beside it.
echo "== Python tests that measure (the TURN benchmark's smoke rounds)"
measures_status=0
bash scripts/test_python.sh -m measures || measures_status=$?
[ "$rust_status" -eq 0 ] && [ "$docs_status" -eq 0 ] && [ "$fuzz_status" -eq 0 ] && [ "$peers_status" -eq 0 ] &&
  [ "$containers_status" -eq 0 ] && [ "$measures_status" -eq 0 ]
