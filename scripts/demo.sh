#!/usr/bin/env bash
# The two-minute demo (README's first command): installs the missing Debian packages the demo
# uses (scripts/setup.sh demo: not the test world's browsers, containers and databases), builds
# the daemons and the demo in release mode, then runs it on 127.0.0.1 (nothing to configure).
# Extra arguments go to the demo: `bash scripts/demo.sh --fast`, `--keep`, `--help`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
cargo build --release --locked -p lastcall-spoa -p lastcall-turn -p lastcall-demo
target_dir="${CARGO_TARGET_DIR:-target}"
exec "$target_dir/release/lastcall-demo" "$@"
