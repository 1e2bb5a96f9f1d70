#!/usr/bin/env bash
# Runs the interop tests again against today's peers from scripts/peers.sh's chroots
# (docs/peers.md): HAProxy 3.0 (Debian 13) and 3.2 (unstable) in front of lastcall-spoa,
# lastcall-spoa itself on libmodsecurity 3.0.14 and 3.0.16 with those releases' CRS and
# nginx for the differential test, and coturn 4.18's turnutils_uclient and turnutils_peer
# around lastcall-turn.
# Then the image's engine (sid's libmodsecurity 3.0.16) behind HAProxy 2.6 (this machine's)
# and 3.0 (trixie's). Prints one line per peer with the versions and the tests that ran.
#
# Usage: bash scripts/test_peers.sh [trixie|sid ...]   (default: both). Needs root (chroots).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
(($#)) || set -- trixie sid
bash scripts/peers.sh ensure "$@"
# lastcall-turn with its kernel fast path: the uclient test of `kernel::` runs with 4.18's.
cargo build --workspace --bins --locked --features lastcall-turn/kernel-relay

# The modules of the spoa tests that talk to HAProxy and nginx, and of the TURN tests that
# drive coturn's uclient (each crate has one test binary, a module per subject).
SPOA_TESTS='haproxy|drain|rollout|spread|hung|coraza_spoa|differential|bodies|request_bodies'
TURN_TESTS='interop|coturn_configs|termination'
spoa_filter="test(/^($SPOA_TESTS)::/) | test(=cli::engine_version_is_the_loaded_library)"
# and the SQLite user database written by that release's turnadmin (coturn 4.6.1 and 4.18
# have the same schema; this shows it).
turn_filter="test(/^($TURN_TESTS)::/) | test(=kernel::uclient_relays_through_the_kernel) | test(=userdb::sqlite_written_by_turnadmin)"

run=$PWD/scripts/peer-run
log=$(mktemp "${TMPDIR:-/tmp}/lastcall-peers.XXXXXX")
trap 'rm -f "$log"' EXIT
status=0
summary=()
# nextest [ARGS...]: runs, keeps the exit status, and leaves nextest's own summary line in $ran.
nextest() {
  local rc=0
  cargo nextest run --locked --no-fail-fast "$@" 2>&1 | tee "$log" || rc=$?
  ran=$(grep -E '^ +Summary ' "$log" | tail -n 1 | sed -E 's/^ +Summary +//') || true
  return "$rc"
}
version_of() { awk -v p="$1" '$1 ~ "^"p { print $2; exit }' <<<"$2"; }
for suite in "$@"; do
  versions=$(bash scripts/peers.sh versions "$suite")
  echo "== $suite peers: $(tr '\n' ',' <<<"$versions" | sed 's/,$//; s/,/, /g')"
  rc=0
  LASTCALL_HAPROXY="$run $suite /usr/sbin/haproxy" \
    LASTCALL_NGINX="$run $suite /usr/sbin/nginx" \
    LASTCALL_SPOA_RUNNER="$run $suite" \
    nextest -p lastcall-spoa -E "$spoa_filter" || rc=$?
  summary+=("$suite: HAProxy $(version_of haproxy "$versions"), lastcall-spoa on libmodsecurity $(version_of libmodsecurity3 "$versions") + CRS $(version_of modsecurity-crs "$versions"), nginx $(version_of nginx "$versions") + ModSecurity-nginx $(version_of libnginx-mod-http-modsecurity "$versions"): spoa modules $SPOA_TESTS and the engine-version check: $ran: exit $rc")
  ((rc == 0)) || status=1
  # coturn's clients only where the suite's coturn is not this machine's (trixie has 4.6.1).
  theirs=$(version_of coturn "$versions")
  ours=$(dpkg-query -W -f='${Version}' coturn 2>/dev/null || true)
  if [ -n "$theirs" ] && [ "${theirs%%-*}" != "${ours%%-*}" ]; then
    rc=0
    LASTCALL_UCLIENT="$run $suite /usr/bin/turnutils_uclient" \
      LASTCALL_TURNSERVER="$run $suite /usr/bin/turnserver" \
      LASTCALL_PEER="$run $suite /usr/bin/turnutils_peer" \
      LASTCALL_TURNADMIN="$run $suite /usr/bin/turnadmin" \
      nextest -p lastcall-turn --features lastcall-turn/kernel-relay -E "$turn_filter" || rc=$?
    summary+=("$suite: coturn $theirs's turnutils_uclient and turnutils_peer around lastcall-turn, its turnserver for comparison, its turnadmin writing the SQLite user database: turn modules $TURN_TESTS, the kernel fast path's uclient test and userdb::sqlite_written_by_turnadmin: $ran: exit $rc")
    ((rc == 0)) || status=1
  else
    summary+=("$suite: coturn $theirs is this machine's release: the main suite covers it")
  fi
done
# The image's engine (libmodsecurity 3.0.16, docs/images.md#engine: the same Debian build as
# sid's) behind the older HAProxy releases too: this machine's (2.6 on Debian 12) and trixie's
# 3.0 in front of the agent run in the sid chroot.
if [[ " $* " == *" sid "* ]]; then
  fronts=("this machine's:")
  [[ " $* " != *" trixie "* ]] || fronts+=("trixie:$run trixie /usr/sbin/haproxy")
  engine=$(version_of libmodsecurity3 "$(bash scripts/peers.sh versions sid)")
  for front in "${fronts[@]}"; do
    where=${front%%:*} haproxy=${front#*:}
    version=$(${haproxy:-/usr/sbin/haproxy} -v 2>/dev/null | awk 'NR == 1 { print $3 }')
    echo "== HAProxy $version ($where) in front of lastcall-spoa on libmodsecurity $engine (sid)"
    rc=0
    LASTCALL_HAPROXY=$haproxy \
      LASTCALL_NGINX="$run sid /usr/sbin/nginx" \
      LASTCALL_SPOA_RUNNER="$run sid" \
      nextest -p lastcall-spoa -E "$spoa_filter" || rc=$?
    summary+=("HAProxy $version ($where) in front of lastcall-spoa on libmodsecurity $engine (sid's, the image's engine), sid's nginx: spoa modules $SPOA_TESTS and the engine-version check: $ran: exit $rc")
    ((rc == 0)) || status=1
  done
fi
echo "== today's peers (the main suite ran against this machine's: HAProxy $(dpkg-query -W -f='${Version}' haproxy 2>/dev/null), libmodsecurity $(dpkg-query -W -f='${Version}' 'libmodsecurity3*' 2>/dev/null | head -n 1), coturn $(dpkg-query -W -f='${Version}' coturn 2>/dev/null))"
printf '%s\n' "${summary[@]}"
exit "$status"
