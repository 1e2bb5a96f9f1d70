#!/usr/bin/env bash
# The container tests, one group that can run beside the rest of the suite:
# - builds the images with no registry (scripts/images.sh: Debian 13 bases made with
#   debootstrap and cached, docker/Dockerfile's stages, Debian 13's HAProxy as an image),
#   on a private dockerd (scripts/dockerd.sh: its own data root, socket and pidfile);
# - tests/images: the images run with what the charts render (docker stop idle, under
#   HAProxy load, during a TURN call), and their runtime libraries checked inside them;
# - tests/cri: the charts' pods run through containerd's CRI plugin (a containerd per test
#   host, in network namespaces) by a kubelet-like driver, rolled under load.
# Needs root (dockerd, debootstrap, network namespaces), as CI has. Whatever happens, the
# daemons are stopped and their mounts and namespaces removed at the end. Two runs on one
# machine take turns (flock on $LASTCALL_CACHE/images.lock).
# Usage: bash scripts/test_containers.sh [pytest args...]
#   LASTCALL_IMAGE_BINARIES=prebuilt LASTCALL_PREBUILT_DIR=target/release  (skip the
#   in-image cargo build: copy binaries built on the host)
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${LASTCALL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lastcall}
mkdir -p "$CACHE"
exec 9>"$CACHE/images.lock"
if ! flock -n 9; then
  echo "test_containers: waiting for $CACHE/images.lock (another run on this machine)"
  flock 9
fi
export LASTCALL_IMAGES_LOCKED=1   # the tests' engine fixture: this script holds the lock

cleanup() {
  python3 tests/cri/nodes.py cleanup || true
  bash scripts/dockerd.sh stop || true
}
trap cleanup EXIT
start=$SECONDS
status=0
bash scripts/test_python.sh -m containers tests/images tests/cri "$@" || status=$?
echo "test_containers: $((SECONDS - start)) s, exit $status"
exit "$status"
