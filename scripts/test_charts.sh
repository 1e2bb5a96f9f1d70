#!/usr/bin/env bash
# Chart tests: renders charts/lastcall-spoa and charts/lastcall-turn offline with several
# value sets (Helm 4 embedded in the PyPI package helm-python-sdk), lints them, validates
# every rendered object against the Kubernetes API schemas (kubernetes-validate), checks the
# sidecar HAProxy configuration with the real `haproxy -c`, and asserts the termination
# invariants. Installs the pinned Python packages from scripts/requirements.txt if missing.
# Usage: bash scripts/test_charts.sh [pytest args...]     (PYTHON=... to pick an interpreter)
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
        print(f"test_charts: {name} {have or 'missing'}, want {want}", file=sys.stderr)
        ok = False
sys.exit(0 if ok else 1)
PY
}

if ! have_requirements "$PYTHON"; then
  echo "test_charts: installing $REQ"
  if ! "$PYTHON" -m pip install -q --disable-pip-version-check -r "$REQ"; then
    # An externally managed interpreter (Debian's own python3): use a cached venv instead.
    VENV="${XDG_CACHE_HOME:-$HOME/.cache}/lastcall/chart-venv"
    echo "test_charts: pip refused; using the virtualenv $VENV"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    PYTHON="$VENV/bin/python"
    have_requirements "$PYTHON" 2>/dev/null ||
      "$PYTHON" -m pip install -q --disable-pip-version-check -r "$REQ"
  fi
fi

export PYTHONDONTWRITEBYTECODE=1
exec "$PYTHON" -m pytest -p no:cacheprovider -q tests/charts "$@"
