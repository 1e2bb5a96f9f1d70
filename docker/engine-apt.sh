#!/bin/sh
# apt's sources and pins for the WAF engine an image runs (docker/Dockerfile's ENGINE
# argument, docs/images.md#engine), written under OUT as etc/apt's sources.list.d/ and
# preferences.d/ (the stages copy OUT to /etc/apt/):
#
#   sh docker/engine-apt.sh ENGINE CHECK_VALID_UNTIL OUT
#
# ENGINE=forky: libmodsecurity 3.0.16 from Debian 14 (testing) on Debian 13. apt may take
# from forky only the two libmodsecurity packages, and from trixie-backports only the
# libraries forky's build links against that Debian 13 has too old or not at all (its curl,
# built against the newer ngtcp2/nghttp3, and libxml2's .so.16); everything else stays
# Debian 13's. When a newer forky build needs more than that, `apt-get install` fails and
# names the package: add it here, to the suite that has a build for Debian 13.
# ENGINE=trixie: Debian 13's own libmodsecurity; nothing is added.
set -eu

engine=${1:?ENGINE}
check_valid_until=${2:?CHECK_VALID_UNTIL}
out=${3:?OUT}
mkdir -p "$out/sources.list.d" "$out/preferences.d"

case "$check_valid_until" in
  yes | no) ;;
  *) echo "APT_CHECK_VALID_UNTIL=$check_valid_until: yes (the default) or no (a mirror snapshot past its Valid-Until date)" >&2; exit 64 ;;
esac

case "$engine" in
  trixie) exit 0 ;;
  forky) ;;
  *) echo "ENGINE=$engine: forky (libmodsecurity 3.0.16 from Debian 14, the default) or trixie (Debian 13's 3.0.14)" >&2; exit 64 ;;
esac

# The base image's Debian mirror (debian:trixie-slim's deb822 file), or Debian's CDN.
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | grep -v -- -security | head -n 1)
cat >"$out/sources.list.d/lastcall-engine.sources" <<EOF
# lastcall-spoa's engine (docker/engine-apt.sh): pinned in preferences.d/lastcall-engine.
Types: deb
URIs: ${mirror:-http://deb.debian.org/debian}
Suites: trixie-backports forky
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
Check-Valid-Until: $check_valid_until
EOF

cat >"$out/preferences.d/lastcall-engine" <<'EOF'
# lastcall-spoa's engine (docker/engine-apt.sh): these packages and no others from these suites.
Package: *
Pin: release n=forky
Pin-Priority: -1

Package: *
Pin: release n=trixie-backports
Pin-Priority: -1

Package: libmodsecurity3t64 libmodsecurity-dev
Pin: release n=forky
Pin-Priority: 990

Package: libcurl4-gnutls libcurl3t64-gnutls libxml2-16 libngtcp2-16 libngtcp2-crypto-gnutls8 libnghttp3-9
Pin: release n=trixie-backports
Pin-Priority: 990
EOF
