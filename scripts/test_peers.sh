#!/usr/bin/env bash
# Runs the interop tests again against today's peers from scripts/peers.sh's chroots
# (docs/peers.md): HAProxy 3.0 (Debian 13) and 3.2 (unstable) in front of lastcall-spoa,
# lastcall-spoa itself on libmodsecurity 3.0.14 and 3.0.16 with those releases' CRS and
# nginx for the differential test, and coturn 4.18's turnutils_uclient and turnutils_peer
# around lastcall-turn.
# Prints one line per peer with the versions and the tests that ran against them.
#
# Usage: bash scripts/test_peers.sh [trixie|sid ...]   (default: both). Needs root (chroots).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
(($#)) || set -- trixie sid
bash scripts/peers.sh ensure "$@"
cargo build --workspace --bins --locked

# The modules of the spoa tests that talk to HAProxy and nginx, and of the TURN tests that
# drive coturn's uclient (each crate has one test binary, a module per subject).
SPOA_TESTS='haproxy|drain|rollout|coraza_spoa|differential'
TURN_TESTS='interop|coturn_configs|termination'
spoa_filter="test(/^($SPOA_TESTS)::/) | test(=cli::engine_version_is_the_loaded_library)"
turn_filter="test(/^($TURN_TESTS)::/)"

run=$PWD/scripts/peer-run
status=0
summary=()
for suite in "$@"; do
  versions=$(bash scripts/peers.sh versions "$suite" | tr '\n' ',' | sed 's/,$//; s/,/, /g')
  echo "== $suite peers: $versions"
  rc=0
  LASTCALL_HAPROXY="$run $suite /usr/sbin/haproxy" \
    LASTCALL_NGINX="$run $suite /usr/sbin/nginx" \
    LASTCALL_SPOA_RUNNER="$run $suite" \
    cargo nextest run --locked -p lastcall-spoa --no-fail-fast -E "$spoa_filter" || rc=$?
  summary+=("$suite: lastcall-spoa on its libmodsecurity behind its HAProxy, differential against its nginx ($SPOA_TESTS): exit $rc")
  ((rc == 0)) || status=1
  # coturn's clients only where the suite's coturn is not this machine's (trixie has 4.6.1).
  theirs=$(awk '$1 == "coturn" { print $2 }' <(bash scripts/peers.sh versions "$suite"))
  ours=$(dpkg-query -W -f='${Version}' coturn 2>/dev/null || true)
  if [ -n "$theirs" ] && [ "${theirs%%-*}" != "${ours%%-*}" ]; then
    rc=0
    LASTCALL_UCLIENT="$run $suite /usr/bin/turnutils_uclient" \
      LASTCALL_PEER="$run $suite /usr/bin/turnutils_peer" \
      cargo nextest run --locked -p lastcall-turn --no-fail-fast -E "$turn_filter" || rc=$?
    summary+=("$suite: lastcall-turn driven by its turnutils_uclient ($TURN_TESTS): exit $rc")
    ((rc == 0)) || status=1
  fi
done
echo "== today's peers"
printf '%s\n' "${summary[@]}"
exit "$status"
