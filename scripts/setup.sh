#!/usr/bin/env bash
# Installs, idempotently, what lastcall needs on Debian 12: the system packages the daemons,
# tests and benchmarks use, and the Python packages the chart tests use.
#   bash scripts/setup.sh          everything: the demo's packages and the test world (what
#                                  scripts/test.sh and CI run with)
#   bash scripts/setup.sh demo     only what scripts/demo.sh builds and runs with
# Run as root, or as a user with sudo. Without either it prints the command to run and fails.
set -euo pipefail

profile=${1:-all}
case $profile in
  demo | all) ;;
  *)
    echo "setup: unknown profile '$profile' (valid: demo, all; none means all)" >&2
    exit 64
    ;;
esac

# What the demo (scripts/demo.sh, crates/demo) builds and runs with: a C toolchain and
# libmodsecurity's headers for lastcall-spoa, the rule set it loads, HAProxy in front of the
# agents, and coturn's turnutils_uclient/turnutils_peer for the TURN call.
DEMO_PACKAGES=(
  build-essential pkg-config ca-certificates curl
  haproxy coturn libmodsecurity-dev libmodsecurity3 modsecurity-crs
)

# The rest of the test world (scripts/test.sh).
TEST_PACKAGES=(
  python3 python3-venv
  nginx libnginx-mod-http-modsecurity
  iproute2 procps util-linux psmisc openssl wrk
  # wire's coturn chart's command line (dumb-init -- /bin/sh -c '...'), run for real by
  # crates/turn/tests/turn/wire.rs.
  dumb-init
  # setcap/getcap: tests/turn/privileged.rs gives a copy of lastcall-turn the image's file
  # capability (setpriv and runuser come with util-linux).
  libcap2-bin
  # The container tests (scripts/test_containers.sh): they start their own dockerd and
  # containerds (own roots and sockets), never the system's services.
  docker.io containerd runc containernetworking-plugins debootstrap binutils
  # The browser tests of lastcall-turn (crates/turn/tests/turn/{chromium,firefox}.rs):
  # headless Chromium's and Firefox's own WebRTC stacks, driven by the page they load (no
  # driver needed).
  chromium firefox-esr
  # promtool, from Debian's Prometheus: the dashboards' and alert rules' checks
  # (tests/charts/test_observability.py, the demo's and the TURN tests' recorded series) and
  # lastcall-turn's /metrics read as Prometheus reads it (crates/turn/tests/turn/operations.rs).
  prometheus
  # The plots of bench/ and of the demo's timeline (lastcall-demo --timeline, not part of
  # the plain demo), drawn by Debian's /usr/bin/python3 with Debian's matplotlib.
  python3-matplotlib
  # lastcall-turn's user databases (crates/turn/tests/turn/userdb.rs, bench/turn/userdb.sh):
  # the tests start Debian's PostgreSQL (/usr/lib/postgresql/*/bin, as the postgres user the
  # package makes) and redis-server themselves, on loopback; sqlite3 holds a writer's lock.
  postgresql redis-server sqlite3
  # lastcall-turn's kernel fast path (feature kernel-relay): clang builds the eBPF object
  # (-target bpf) against libbpf's headers; nothing of it is needed at run time.
  clang libbpf-dev
)

PACKAGES=("${DEMO_PACKAGES[@]}")
[ "$profile" = demo ] || PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "setup: missing Debian packages: ${missing[*]}" >&2
    echo "setup: not root and no sudo; as root run:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The Debian packages start nothing by default in a container; on a full system they may
# have started services on well-known ports (postgresql and redis-server do: 5432, 6379).
# Our tests use their own servers and ports on loopback only.

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (rustup, stable >= 1.80) and run again" >&2
  exit 1
fi

# The chart tests install their Python packages themselves (scripts/test_charts.sh, in a venv
# when the system Python is externally managed).
