#!/usr/bin/env bash
# Installs what is missing, then runs every check and test: formatting, clippy, the Rust test
# suite (unit, paused-clock, process-level and interop tests against real HAProxy, coturn's
# clients and libmodsecurity), the chart tests, and every fuzz target for a bounded time
# (FUZZ_SECONDS, default 20 s each; see scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

export CARGO_TERM_COLOR=never
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== build binaries used by the process-level tests"
cargo build --workspace --bins --examples --locked
echo "== Python tests (charts, images)"
bash scripts/test_python.sh
echo "== doc tests"
cargo test --workspace --locked --doc
echo "== cargo test"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
echo "== fuzz targets (${FUZZ_SECONDS:-20} s each)"
bash scripts/fuzz.sh
