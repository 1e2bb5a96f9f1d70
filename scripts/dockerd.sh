#!/usr/bin/env bash
# A private Docker daemon for building and testing the images, beside whatever else runs on
# the machine: its own data root (kept, so images and build cache survive between runs), its
# own exec root, socket and pidfile, no bridge and no iptables rules (containers use
# `--network host` or `--network none`). Debian's docker.io (dockerd 20.10) is enough.
#
#   bash scripts/dockerd.sh start    # starts it (or finds it running); prints DOCKER_HOST=...
#   bash scripts/dockerd.sh stop     # removes its containers, stops it, unmounts what it left
#   bash scripts/dockerd.sh env      # prints DOCKER_HOST=... (running or not)
#
# Paths: the data root is $LASTCALL_CACHE/docker (default ~/.cache/lastcall/docker); the
# socket, pidfile and exec root are under $LASTCALL_RUN (default /run/lastcall). One user of
# these paths at a time: callers hold `flock $LASTCALL_CACHE/images.lock` (scripts/images.sh
# --own-dockerd and the image tests do). Needs root.
set -euo pipefail

CACHE=${LASTCALL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lastcall}
RUN=${LASTCALL_RUN:-/run/lastcall}
DATA=$CACHE/docker
EXEC=$RUN/docker
SOCK=$RUN/docker.sock
PIDFILE=$RUN/docker.pid
LOG=$CACHE/dockerd.log
DOCKER=${DOCKER:-/usr/bin/docker}
export DOCKER_HOST=unix://$SOCK

running() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = /usr/sbin/dockerd ]
}

# Unmount what a stopped daemon left under its roots (overlay layers of containers that were
# running, network namespace files), deepest first.
unmount_leftovers() {
  local mnt
  for root in "$EXEC" "$DATA"; do
    awk -v r="$root/" 'index($2, r) == 1 {print $2}' /proc/self/mounts | sort -r |
      while read -r mnt; do
        umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
      done
  done
}

# The containerd this daemon started and its shims: they outlive a dockerd that was
# killed. Their command lines name our exec root (containerd's config and socket are there).
kill_leftovers() {
  local pid
  for pid in $(pgrep -f "containerd.* $EXEC/containerd/" || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
}

start() {
  [ "$(id -u)" -eq 0 ] || { echo "dockerd.sh: needs root" >&2; exit 1; }
  command -v dockerd >/dev/null || { echo "dockerd.sh: dockerd not installed (apt-get install docker.io; scripts/setup.sh does)" >&2; exit 1; }
  if running && "$DOCKER" version >/dev/null 2>&1; then
    echo "DOCKER_HOST=$DOCKER_HOST"
    return
  fi
  # A daemon of ours that is not answering, or one left by a run that was killed.
  stop >/dev/null 2>&1 || true
  mkdir -p "$DATA" "$EXEC"
  setsid dockerd \
    --data-root "$DATA" --exec-root "$EXEC" -H "$DOCKER_HOST" --pidfile "$PIDFILE" \
    --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
    --log-level=warn </dev/null >>"$LOG" 2>&1 &
  local i
  for ((i = 0; i < 600; i++)); do
    if "$DOCKER" version >/dev/null 2>&1; then
      echo "DOCKER_HOST=$DOCKER_HOST"
      return
    fi
    if ! kill -0 $! 2>/dev/null; then
      echo "dockerd.sh: dockerd exited; the end of $LOG:" >&2
      tail -20 "$LOG" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "dockerd.sh: dockerd did not answer within 60 s; the end of $LOG:" >&2
  tail -20 "$LOG" >&2
  exit 1
}

stop() {
  local pid i
  if running; then
    pid=$(cat "$PIDFILE")
    # Our own daemon: every container in it is ours (tests remove theirs; this catches
    # what a failed test left).
    "$DOCKER" ps -aq 2>/dev/null | xargs -r "$DOCKER" rm -f >/dev/null 2>&1 || true
    kill -TERM "$pid" 2>/dev/null || true
    i=0
    while kill -0 "$pid" 2>/dev/null && ((i++ < 300)); do
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  kill_leftovers
  unmount_leftovers
  rm -f "$PIDFILE" "$SOCK"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) echo "DOCKER_HOST=$DOCKER_HOST" ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 64 ;;
esac
