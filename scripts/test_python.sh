#!/usr/bin/env bash
# The Python test suites, in one pytest run:
# - tests/charts: renders charts/lastcall-spoa and charts/lastcall-turn offline with several
#   value sets (Helm 4 embedded in the PyPI package helm-python-sdk), lints them, validates
#   every rendered object against the Kubernetes API schemas (kubernetes-validate), checks
#   the sidecar HAProxy configuration with the real `haproxy -c`, and asserts the
#   termination invariants;
# - tests/images: each daemon as PID 1 of a new PID namespace (unshare) receiving real
#   signals, as the images run it. Needs root (unshare). The tests of the built images
#   themselves (and tests/cri) are the container tests: scripts/test_containers.sh.
# Tests that start a daemon skip when it is not built: build first
# (cargo build -p lastcall-spoa -p lastcall-turn; scripts/test.sh does).
# Installs the pinned Python packages from scripts/requirements.txt if missing.
# Usage: bash scripts/test_python.sh [--setup | pytest args...]   (PYTHON=... to pick an interpreter)
#   e.g. bash scripts/test_python.sh tests/images     (only the image tests)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
REQ=scripts/requirements.txt

have_requirements() {
  "$1" - "$REQ" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
ok = True
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, _, want = line.partition("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have != want:
        print(f"test_python: {name} {have or 'missing'}, want {want}", file=sys.stderr)
        ok = False
sys.exit(0 if ok else 1)
PY
}

if ! have_requirements "$PYTHON"; then
  echo "test_python: installing $REQ"
  if ! "$PYTHON" -m pip install -q --disable-pip-version-check -r "$REQ"; then
    # An externally managed interpreter (Debian's own python3): use a cached venv instead.
    VENV="${XDG_CACHE_HOME:-$HOME/.cache}/lastcall/chart-venv"
    echo "test_python: pip refused; using the virtualenv $VENV"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    PYTHON="$VENV/bin/python"
    have_requirements "$PYTHON" 2>/dev/null ||
      "$PYTHON" -m pip install -q --disable-pip-version-check -r "$REQ"
  fi
fi

# `--setup`: only install the requirements (scripts/test.sh does this once, before it starts
# the container tests beside the other Python tests).
if [ "${1:-}" = --setup ]; then
  exit 0
fi

export PYTHONDONTWRITEBYTECODE=1
# Suites: the given paths, or all of them. The container tests (marker `containers`: they
# need the private dockerd and build images) run in scripts/test_containers.sh, unless a
# `-m` is given.
SUITES=(tests/charts tests/images tests/bench)
MARK=(-m "not containers and not measures")
for a in "$@"; do
  case "$a" in
    tests/*) SUITES=() ;;
    -m) MARK=() ;;
  esac
done
exec "$PYTHON" -m pytest -p no:cacheprovider -q "${MARK[@]}" "${SUITES[@]}" "$@"
