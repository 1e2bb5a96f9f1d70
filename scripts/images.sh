#!/usr/bin/env bash
# Builds the lastcall images with no container registry (docs/images.md):
#
# 1. a Debian 13 (trixie) base made with debootstrap --variant=minbase from the mirror apt
#    already uses on this machine (read from /etc/apt/sources.list.d/*.sources or
#    sources.list), slimmed like debian:trixie-slim, imported as lastcall-local/debian:trixie;
#    cached as a tarball and rebuilt only when its recipe changes (or with --refresh);
# 2. with --binaries source (the default), a Rust build base on top of it: Debian 13's own
#    cargo and rustc (1.85, the workspace's rust-version), lastcall-local/rust:trixie;
# 3. docker/Dockerfile's `spoa` and `turn` targets with those bases as its build arguments:
#    lastcall/lastcall-spoa:TAG and lastcall/lastcall-turn:TAG, what the charts pull;
# 4. with --haproxy, docker/haproxy.Dockerfile: Debian 13's haproxy package as an image that
#    behaves like the official one (the sidecar pod's HAProxy in the tests);
# then prints each image's size.
#
# Usage: bash scripts/images.sh [--binaries source|prebuilt] [--prebuilt-dir DIR]
#                               [--crs VERSION|debian] [--engine forky|trixie]
#                               [--haproxy] [--own-dockerd]
#                               [--refresh] [--tag TAG]
#   --binaries prebuilt   copy DIR/lastcall-spoa and DIR/lastcall-turn (default DIR:
#                         target/release; build them first) instead of compiling in the image
#   --crs VERSION|debian  the CRS release lastcall-spoa runs (the Dockerfile's CRS_VERSION:
#                         downloaded and its signature checked; default: the Dockerfile's),
#                         or `debian`: Debian 13's modsecurity-crs (CRS 3.3, end of life
#                         upstream), for a machine that reaches Debian's mirror only
#   --engine forky|trixie the libmodsecurity lastcall-spoa runs (the Dockerfile's ENGINE):
#                         3.0.16 from Debian 14 (default) or Debian 13's 3.0.14. The mirror's
#                         testing Release may be past its Valid-Until date (a snapshot):
#                         the build accepts that (APT_CHECK_VALID_UNTIL=no), signatures are
#                         still checked
#   --own-dockerd         start a private dockerd for the build (scripts/dockerd.sh) and stop
#                         it afterwards; otherwise the docker of DOCKER_HOST is used
#   --refresh             debootstrap the base again even if the cached one is current
# Environment: DOCKER (client, default /usr/bin/docker if present), LASTCALL_CACHE (default
# ~/.cache/lastcall). Needs root for debootstrap (only when the base is not cached yet).
set -euo pipefail
cd "$(dirname "$0")/.."

BINARIES=source
PREBUILT_DIR=${CARGO_TARGET_DIR:-target}/release
HAPROXY=0
CRS=
ENGINE=
OWN_DOCKERD=0
REFRESH=0
TAG=$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' charts/lastcall-spoa/Chart.yaml)
SUITE=trixie

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit "${1:-64}"; }
while (($#)); do
  case "$1" in
    --binaries) BINARIES=${2:?}; shift ;;
    --prebuilt-dir) PREBUILT_DIR=${2:?}; BINARIES=prebuilt; shift ;;
    --crs) CRS=${2:?}; shift ;;
    --engine) ENGINE=${2:?}; shift ;;
    --haproxy) HAPROXY=1 ;;
    --own-dockerd) OWN_DOCKERD=1 ;;
    --refresh) REFRESH=1 ;;
    --tag) TAG=${2:?}; shift ;;
    -h | --help) usage 0 ;;
    *) echo "images.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
case "$BINARIES" in source | prebuilt) ;; *) echo "images.sh: --binaries source|prebuilt, not $BINARIES" >&2; exit 64 ;; esac

CACHE=${LASTCALL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lastcall}
if [ -z "${DOCKER:-}" ]; then
  # Debian's docker.io client matches its daemon (BuildKit built in, no buildx plugin needed).
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
export DOCKER_BUILDKIT=1
mkdir -p "$CACHE/bases"

log() { printf 'images.sh: %s\n' "$*" >&2; }

# What to undo at exit, last first (a private dockerd, a half-made base).
undo=()
on_exit() {
  local i
  for ((i = ${#undo[@]} - 1; i >= 0; i--)); do eval "${undo[i]}" || true; done
}
trap on_exit EXIT

if ((OWN_DOCKERD)); then
  exec 9>"$CACHE/images.lock"
  flock 9
  eval "export $(bash scripts/dockerd.sh start)"
  undo+=("bash scripts/dockerd.sh stop")
fi
"$DOCKER" version >/dev/null || { log "no docker daemon at ${DOCKER_HOST:-the default socket} (try --own-dockerd)"; exit 1; }

. scripts/lib/debian.sh

# debootstrap's minbase, then what debian:SUITE-slim leaves out (debuerreotype's slimify:
# documentation but copyright files, man and info pages, translations) and apt's caches.
# The sources list names the same mirror and its security archive.
make_base() {
  local dir=$1 mirror=$2 security=$3
  debootstrap --variant=minbase "$SUITE" "$dir" "$mirror" >&2
  cat >"$dir/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  cat >"$dir/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  printf 'Acquire::Languages "none";\n' >"$dir/etc/apt/apt.conf.d/docker-no-languages"
  # Packages start no services in an image build (invoke-rc.d asks this first).
  printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
  chmod 0755 "$dir/usr/sbin/policy-rc.d"
  find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$dir"/usr/share/{man,groff,info,lintian,linda}/* "$dir"/var/cache/apt/* "$dir"/var/lib/apt/lists/*
  find "$dir/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  rm -f "$dir/etc/apt/sources.list"
  cat >"$dir/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  if [ -n "$security" ]; then
    cat >>"$dir/etc/apt/sources.list.d/debian.sources" <<EOF

Types: deb
URIs: $security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  rm -f "$dir/etc/hostname" "$dir/etc/resolv.conf"
  : >"$dir/etc/resolv.conf"
}

# The cache key: the recipe above and the suite (not the mirror: any mirror gives the same).
BASE_KEY=$( (declare -f make_base; echo "$SUITE") | sha256sum | cut -c1-16)
BASE_TAR=$CACHE/bases/debian-$SUITE-minbase-$BASE_KEY.tar
BASE_IMAGE=lastcall-local/debian:$SUITE
RUST_IMAGE=lastcall-local/rust:$SUITE

label() { "$DOCKER" image inspect -f "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }

if ((REFRESH)) || [ ! -s "$BASE_TAR" ]; then
  [ "$(id -u)" -eq 0 ] || { log "debootstrap needs root"; exit 1; }
  command -v debootstrap >/dev/null || { log "debootstrap is not installed (scripts/setup.sh installs it)"; exit 1; }
  mirror=$(apt_uri archive)
  security=$(apt_uri security)
  [ -n "$mirror" ] || { log "no Debian archive in apt's configuration"; exit 1; }
  log "debootstrap --variant=minbase $SUITE from the mirror in apt's configuration"
  work=$(mktemp -d "$CACHE/bases/.debootstrap.XXXXXX")
  undo+=("remove_tree '$work'")
  start=$SECONDS
  make_base "$work/root" "$mirror" "$security"
  tar --numeric-owner --xattrs -C "$work/root" -cf "$work/base.tar" .
  rm -f "$CACHE"/bases/debian-"$SUITE"-minbase-*.tar
  mv "$work/base.tar" "$BASE_TAR"
  log "base made in $((SECONDS - start)) s: $BASE_TAR"
fi

if [ "$(label "$BASE_IMAGE" org.lastcall.base-key)" != "$BASE_KEY" ] || ((REFRESH)); then
  log "docker import $BASE_IMAGE"
  "$DOCKER" import \
    --change "LABEL org.lastcall.base-key=$BASE_KEY" \
    --change 'CMD ["bash"]' \
    "$BASE_TAR" "$BASE_IMAGE" >/dev/null
fi

build() {  # build [docker build arguments...]: quiet unless it fails
  local out
  out=$(mktemp)
  if ! "$DOCKER" build --network host --progress plain "$@" . >"$out" 2>&1; then
    cat "$out" >&2
    rm -f "$out"
    log "docker build $* failed"
    exit 1
  fi
  rm -f "$out"
}

args=(--build-arg "DEBIAN_IMAGE=$BASE_IMAGE" --build-arg "VERSION=$TAG" --build-arg "BINARIES=$BINARIES")
[ -z "$CRS" ] || args+=(--build-arg "CRS_VERSION=$CRS")
[ -z "$ENGINE" ] || args+=(--build-arg "ENGINE=$ENGINE")
args+=(--build-arg "APT_CHECK_VALID_UNTIL=no")
if [ "$BINARIES" = source ]; then
  log "build $RUST_IMAGE (Debian's cargo and rustc)"
  build -f docker/local-rust.Dockerfile --build-arg "DEBIAN_IMAGE=$BASE_IMAGE" -t "$RUST_IMAGE"
  args+=(--build-arg "RUST_IMAGE=$RUST_IMAGE")
else
  for bin in lastcall-spoa lastcall-turn; do
    [ -x "$PREBUILT_DIR/$bin" ] || { log "$PREBUILT_DIR/$bin not built (cargo build --release -p lastcall-spoa -p lastcall-turn)"; exit 1; }
  done
  mkdir -p docker/prebuilt
  # Without debug information, like the source build (CARGO_PROFILE_RELEASE_DEBUG=0).
  for bin in lastcall-spoa lastcall-turn; do
    objcopy --strip-debug "$PREBUILT_DIR/$bin" "docker/prebuilt/$bin"
  done
fi

# The build stages that download (cargo's crates, the CRS release) trust what this machine
# trusts (a TLS-inspecting proxy's CA).
ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[ -s "$ca" ] && args+=(--secret "id=cacerts,src=$ca")

images=()
for target in spoa turn; do
  start=$SECONDS
  log "build lastcall/lastcall-$target:$TAG (binaries: $BINARIES)"
  build -f docker/Dockerfile "${args[@]}" --target "$target" -t "lastcall/lastcall-$target:$TAG"
  log "  done in $((SECONDS - start)) s"
  images+=("lastcall/lastcall-$target:$TAG")
done
if ((HAPROXY)); then
  log "build lastcall-local/haproxy:$SUITE (Debian's haproxy package)"
  build -f docker/haproxy.Dockerfile --build-arg "DEBIAN_IMAGE=$BASE_IMAGE" -t "lastcall-local/haproxy:$SUITE"
  images+=("lastcall-local/haproxy:$SUITE")
fi

printf '%-36s %12s %10s  %s\n' IMAGE BYTES MB ID
for image in "$BASE_IMAGE" "${images[@]}"; do
  size=$("$DOCKER" image inspect -f '{{.Size}}' "$image")
  id=$("$DOCKER" image inspect -f '{{.Id}}' "$image")
  printf '%-36s %12s %10s  %s\n' "$image" "$size" "$(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1e6 }')" "${id:7:12}"
done
