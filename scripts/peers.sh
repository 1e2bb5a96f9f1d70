#!/usr/bin/env bash
# Today's peers for the test suite (issue: HAProxy 3.0/3.2, coturn 4.18, libmodsecurity 3.0.14+):
# minimal Debian 13 (trixie) and unstable (sid) chroots made with debootstrap from the mirror
# apt already uses on this machine (read from its configuration, never written down), with
# haproxy, coturn, nginx + libnginx-mod-http-modsecurity, libmodsecurity and modsecurity-crs.
# Built once and cached; rebuilt when the recipe or the package list below changes.
#
# Usage: bash scripts/peers.sh ensure [SUITE...]   build what is missing (default: trixie sid);
#                                                  prints each suite's peer versions
#        bash scripts/peers.sh versions SUITE      the versions file of a built suite
#        bash scripts/peers.sh root SUITE          the chroot's directory
# A program in a built chroot runs with scripts/peer-run SUITE PROGRAM [ARGS...] (same PID,
# host network, /tmp and the checkout bind-mounted at the same paths); the tests take such a
# command from LASTCALL_HAPROXY, LASTCALL_NGINX, LASTCALL_UCLIENT, ... (docs/peers.md).
# Environment: LASTCALL_CACHE (default ~/.cache/lastcall). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/debian.sh

CACHE=${LASTCALL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lastcall}
PEERS=$CACHE/peers
PACKAGES=(haproxy coturn nginx libnginx-mod-http-modsecurity modsecurity-crs)
VERSIONED=(haproxy coturn nginx libnginx-mod-http-modsecurity 'libmodsecurity3*' modsecurity-crs)

log() { printf 'peers.sh: %s\n' "$*" >&2; }

# apt in the chroot: an unstable mirror's Release file may be past its Valid-Until date
# (a mirror that is a snapshot); the signatures are still checked.
APT=(apt-get -q -o Acquire::Check-Valid-Until=false -o Acquire::Languages=none)

recipe() {  # recipe SUITE DIR MIRROR SECURITY: debootstrap, sources, then the peers
  local suite=$1 dir=$2 mirror=$3 security=$4
  debootstrap --variant=minbase "$suite" "$dir" "$mirror" >&2
  {
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\n' "$mirror" "$suite"
    if [ "$suite" != sid ] && [ -n "$security" ]; then
      printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n' "$security" "$suite"
    fi
  } >"$dir/etc/apt/sources.list.d/debian.sources"
  rm -f "$dir/etc/apt/sources.list"
  # Packages start no services in the chroot (invoke-rc.d asks this first).
  printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
  chmod 0755 "$dir/usr/sbin/policy-rc.d"
  mount -t proc proc "$dir/proc"
  local rc=0
  chroot "$dir" env DEBIAN_FRONTEND=noninteractive "${APT[@]}" update >&2 || rc=$?
  ((rc)) || chroot "$dir" env DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y \
    --no-install-recommends "${PACKAGES[@]}" >&2 || rc=$?
  chroot "$dir" "${APT[@]}" clean >&2 || true
  umount "$dir/proc"
  ((rc == 0)) || return "$rc"
  # shellcheck disable=SC2068  # the patterns are dpkg-query's own
  chroot "$dir" dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\n' ${VERSIONED[@]} |
    awk '$1 == "ii" { print $2, $3 }' >"$dir/lastcall-peer-versions"
}

key() { (declare -f recipe; echo "$1" "${PACKAGES[*]}") | sha256sum | cut -c1-16; }

ensure() {
  local suite=$1 k root work mirror security start
  k=$(key "$suite")
  root=$PEERS/$suite-$k
  if [ -s "$root/lastcall-peer-versions" ]; then
    ln -sfn "$suite-$k" "$PEERS/$suite"
    return
  fi
  [ "$(id -u)" -eq 0 ] || { log "making the $suite chroot needs root"; exit 1; }
  command -v debootstrap >/dev/null || { log "debootstrap is not installed (scripts/setup.sh installs it)"; exit 1; }
  mirror=$(apt_uri archive)
  security=$(apt_uri security)
  [ -n "$mirror" ] || { log "no Debian archive in apt's configuration"; exit 1; }
  log "debootstrap $suite from the mirror in apt's configuration, then ${PACKAGES[*]}"
  start=$SECONDS
  work=$(mktemp -d "$PEERS/.debootstrap.XXXXXX")
  if ! recipe "$suite" "$work" "$mirror" "$security" 2>"$PEERS/$suite.log"; then
    tail -n 40 "$PEERS/$suite.log" >&2
    remove_tree "$work"
    log "making the $suite chroot failed (log: $PEERS/$suite.log)"
    exit 1
  fi
  # Older chroots of this suite (another recipe) go; the new one takes their name.
  for old in "$PEERS/$suite"-*; do
    [ -d "$old" ] && [ "$old" != "$root" ] && remove_tree "$old"
  done
  mv "$work" "$root"
  ln -sfn "$suite-$k" "$PEERS/$suite"
  log "$suite chroot made in $((SECONDS - start)) s: $root"
}

cmd=${1:-ensure}
shift || true
case "$cmd" in
  ensure)
    mkdir -p "$PEERS"
    exec 9>"$PEERS/.lock"
    flock 9
    (($#)) || set -- trixie sid
    for suite in "$@"; do
      ensure "$suite"
      sed "s/^/$suite: /" "$PEERS/$suite/lastcall-peer-versions"
    done
    ;;
  versions) cat "$PEERS/${1:?suite}/lastcall-peer-versions" ;;
  root) readlink -f "$PEERS/${1:?suite}" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 64 ;;
esac
