#!/usr/bin/env bash
# Kept for scripts/test.sh and habits: the Python tests now live in scripts/test_python.sh
# (tests/charts and tests/images). Arguments are passed on.
exec bash "$(dirname "$0")/test_python.sh" "$@"
