#!/usr/bin/env bash
# Builds every fuzz target (fuzz/src/bin/*.rs) with cargo-fuzz (libFuzzer + AddressSanitizer)
# on the stable toolchain, and runs each one for a bounded time. A crash, leak, panic or
# timeout fails the script; the failing input is in fuzz/artifacts/TARGET/ and cargo-fuzz
# prints how to reproduce it. Part of scripts/test.sh.
#
#   bash scripts/fuzz.sh                        # every target, FUZZ_SECONDS (20) each
#   FUZZ_SECONDS=3600 bash scripts/fuzz.sh stun_message   # one target, an hour
#
# Each run starts from the committed seeds (fuzz/seeds/TARGET/, if any) in a scratch corpus
# (FUZZ_CORPUS_DIR, default a temporary directory), so nothing in the tree changes; keep a
# corpus across runs with FUZZ_CORPUS_DIR=fuzz/corpus (ignored by git).
# Adding a target is one file: fuzz/src/bin/NAME.rs with a `fuzz_target!` (seeds optional).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${FUZZ_SECONDS:-20}
# cargo-fuzz drives nightly-only rustc flags (-Zsanitizer=address, sancov passes); the
# stable compiler accepts them with RUSTC_BOOTSTRAP=1, so no second toolchain is needed.
export RUSTC_BOOTSTRAP=1
export CARGO_TERM_COLOR=never

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz (crates.io)"
  cargo install cargo-fuzz --locked --version 0.13.2
fi

cargo fmt --check --manifest-path Cargo.toml
# Resolve the fuzz crate's dependencies to the workspace's locked versions (cargo keeps what
# matches and adds libFuzzer's own); the lock file is derived, not committed.
[ -f Cargo.lock ] || cp ../Cargo.lock Cargo.lock

if (($#)); then
  targets=("$@")
else
  targets=()
  for f in src/bin/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi

echo "fuzz: building ${targets[*]}"
build_start=$SECONDS
cargo fuzz build
echo "fuzz: built in $((SECONDS - build_start)) s"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
  corpus=${FUZZ_CORPUS_DIR:-$scratch}/$t
  mkdir -p "$corpus"
  dirs=("$corpus")
  [ -d "seeds/$t" ] && dirs+=("seeds/$t")
  log=$scratch/$t.log
  echo "== fuzz $t (${seconds} s)"
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: libFuzzer's default.
  if cargo fuzz run "$t" "${dirs[@]}" -- -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || tail -n 3 "$log"
  else
    cat "$log"
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds} s each without a finding"
