#!/usr/bin/env bash
# Smoke test of the lastcall-spoa benchmark (under a minute once the agent is built): runs
# `bench/spoa/run.sh smoke` (every stack, benign and mixed traffic, 8 connections, 2 s each)
# and fails unless every request got its expected verdict (benign: 200; attacks: 403 from
# HAProxy + lastcall-spoa and nginx + ModSecurity) with no 5xx and no socket errors.
# Usage: bash bench/spoa/smoke_test.sh     (LASTCALL_SPOA_BIN=... to use a given agent binary)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=$(mktemp -d /tmp/bench-spoa-smoke.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
OUT=$OUT bash bench/spoa/run.sh smoke
