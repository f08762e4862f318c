#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 30) each, one at a time, at the
# lowest CPU priority, from the committed corpus (new inputs go to a scratch
# folder, not into fuzz/corpus). Exits non-zero on the first crash, invariant
# violation, leak, timeout or out-of-memory; libFuzzer writes the input to
# fuzz/artifacts/TARGET/.
#
# Usage: fuzz/run.sh [SECONDS]
#        fuzz/run.sh build     (only build the targets, at the lowest priority:
#                               CI does it in the background while its tests run)
#
# Installs cargo-fuzz from crates.io if it is missing. cargo fuzz needs a
# nightly compiler: the nightly toolchain if it is there or can be installed,
# else the default toolchain with RUSTC_BOOTSTRAP=1 (which lets a stable
# compiler take the unstable sanitizer flags).
set -euo pipefail
seconds="${1:-30}"
fuzz_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
if rustup run nightly rustc --version >/dev/null 2>&1 ||
  timeout 300 rustup toolchain install nightly --profile minimal; then
  fuzz=(cargo +nightly fuzz)
else
  echo "fuzz/run.sh: no nightly toolchain; the default one with RUSTC_BOOTSTRAP=1" >&2
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
nice -n 19 "${fuzz[@]}" build --fuzz-dir "$fuzz_dir"
if [[ "$seconds" == build ]]; then
  exit 0
fi
for target in $("${fuzz[@]}" list --fuzz-dir "$fuzz_dir"); do
  echo "fuzz/run.sh: $target for ${seconds} s"
  mkdir -p "$work/$target" "$fuzz_dir/artifacts/$target"
  found_before="$(ls "$fuzz_dir/artifacts/$target" | wc -l)"
  # libFuzzer writes its job log (fuzz-0.log) into the current folder.
  if ! (cd "$work" && nice -n 19 "${fuzz[@]}" run --fuzz-dir "$fuzz_dir" "$target" \
    "$work/$target" "$fuzz_dir/corpus/$target" -- \
    -max_total_time="$seconds" -jobs=1 -workers=1 -print_final_stats=1) \
    >"$work/$target.log" 2>&1; then
    cat "$work/$target.log"
    echo "fuzz/run.sh: $target FAILED; the input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  if [ "$(ls "$fuzz_dir/artifacts/$target" | wc -l)" != "$found_before" ]; then
    cat "$work/$target.log"
    echo "fuzz/run.sh: $target wrote a new input to fuzz/artifacts/$target/" >&2
    exit 1
  fi
  grep -E '^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec' \
    "$work/$target.log" || true
done
echo "fuzz/run.sh: every target ran ${seconds} s without a failure"
