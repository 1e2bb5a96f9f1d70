# Shell functions shared by scripts/images.sh and scripts/peers.sh (sourced, never run).

# The first Debian archive (kind=archive) or security archive (kind=security) URI in apt's
# configuration. Never written into the repository: read here, at run time.
apt_uri() {
  local kind=$1 f
  {
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -r "$f" ] || continue
      awk 'BEGIN { RS = ""; FS = "\n" }
        { uris = ""; suites = ""; types = ""; on = 1
          for (i = 1; i <= NF; i++) {
            l = $i
            if (l ~ /^[ \t]*#/) continue
            if (sub(/^URIs:[ \t]*/, "", l)) uris = l
            else if (sub(/^Suites:[ \t]*/, "", l)) suites = l
            else if (sub(/^Types:[ \t]*/, "", l)) types = l
            else if (l ~ /^Enabled:[ \t]*no/) on = 0
          }
          if (on && types ~ /(^| )deb( |$)/) {
            split(uris, u, " "); n = split(suites, s, " ")
            for (j = 1; j <= n; j++) print u[1], s[j]
          } }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -r "$f" ] || continue
      sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" { print $2, $3 }'
    done
  } | awk -v kind="$kind" '{ sec = ($2 ~ /-security$/) }
      (kind == "security" && sec) || (kind == "archive" && !sec) { print $1; exit }'
}

# A directory debootstrap worked in: what it may have left mounted there (proc, sys, after
# a failure) unmounted first, then removed.
remove_tree() {
  awk -v r="$1/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r | xargs -r -n1 umount -l
  rm -rf --one-file-system "$1"
}
