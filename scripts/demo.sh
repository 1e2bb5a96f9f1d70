#!/usr/bin/env bash
# Installs what is missing, builds in release mode and runs the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --workspace --bins --examples --locked
exec cargo run --release --locked -p lastcall --example echo -- --help
