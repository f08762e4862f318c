#!/usr/bin/env bash
# A deploy under load, in one command: `wspush --processes INSTANCES`
# serving CONNS clients (a quarter each: plain, with positions, with
# permessage-deflate, with both), a feed of FEED_RATE lines/s for
# FEED_SECS, and SIGUSR2 ROLL_AT seconds into it with the binary on disk
# replaced (a fresh copy of the build, renamed over the old one as a
# deploy does). Every delivery is checked at every client: lost,
# duplicated, out of order; the failures line counts connections closed,
# and the redials those that came back. The instances' handover log lines
# (connections handed over, and each loop's pause) are copied into the
# report.
#
# With INSTANCES=0, a lone server (no --processes), which SIGUSR2
# re-executes in place.
#
# Usage: bench/deploy.sh [wspush-bench push flags ...]
#   Environment: CONNS (60000), INSTANCES (4), FEED_RATE (20), FEED_SECS
#   (60), ROLL_AT (10; `none`: no deploy, the run to compare with), WSPUSH (target/release/wspush), OUT
#   (/tmp/wspush-deploy: report.txt); HOST_TABLE=1 runs in this network
#   namespace instead of a new one (see bench/million.sh for why one).
#
# Raises the kernel's limits in the namespace (tuning/apply.sh CONNS
# --both-ends; needs root). Builds what is missing. Time: FEED_SECS plus
# the setup (60,000: ~5 s; 1,000,000: ~70 s).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
conns="${CONNS:-60000}"
instances="${INSTANCES:-4}"
feed_rate="${FEED_RATE:-20}"
feed_secs="${FEED_SECS:-60}"
roll_at="${ROLL_AT:-10}"
wspush="${WSPUSH:-target/release/wspush}"
out="${OUT:-/tmp/wspush-deploy}"
bench=target/release/wspush-bench

if [[ ! -x "$bench" || ! -x "$wspush" ]]; then
  cargo build --release -p wspush-cli -p wspush-bench
fi

in_netns=()
if [[ -z "${HOST_TABLE:-}" ]]; then
  netns="wspush-deploy-$$"
  source bench/big_netns.sh
  big_netns "$netns" "$conns" || {
    echo "deploy.sh: cannot make a network namespace (HOST_TABLE=1 runs without one)" >&2
    exit 1
  }
fi
deployed="$(mktemp -d /tmp/wspush-deploy-bin.XXXXXX)"
cleanup() {
  rm -rf "$deployed"
  [[ -z "${netns:-}" ]] || ip netns del "$netns"
}
trap cleanup EXIT
"${in_netns[@]}" tuning/apply.sh "$conns" --both-ends >/dev/null
mkdir -p "$out"
cp "$wspush" "$deployed/wspush"

# The new binary is on disk before the signal; what runs until then is
# the copy the supervisor started from.
(
  sleep 1
  cp "$wspush" "$deployed/wspush.next"
  mv "$deployed/wspush.next" "$deployed/wspush"
) &

roll=(--roll-at-secs "$roll_at" --roll-signal USR2)
[[ "$roll_at" != none ]] || roll=()
processes="--processes $instances"
[[ "$instances" != 0 ]] || processes=""
echo "deploy.sh: $conns clients over $instances instances (0: a lone server), $feed_rate lines/s for $feed_secs s, SIGUSR2 at $roll_at s; report in $out/report.txt" >&2
started=$SECONDS
"${in_netns[@]}" "$bench" push \
  --spawn "$deployed/wspush $processes --listen 127.0.0.1:{port}" \
  --conns "$conns" --rate 20000 --max-in-flight 1024 --positions --deflate --mixed \
  --messages 1 --payload-bytes 64 --feed-rate "$feed_rate" --feed-secs "$feed_secs" \
  "${roll[@]}" --probe-ms 50 "$@" \
  >"$out/report.txt" 2>"$out/log.txt" || {
  tail -n 30 "$out/log.txt" >&2
  exit 1
}
{
  echo "the handover, as the instances logged it:"
  grep -E "upgrad|handed|took .* connections (over|back)|suspended|re-exec|refused|fallback|starting it again" "$out/log.txt" |
    sed 's/^/  /'
} >>"$out/report.txt"
cat "$out/report.txt"
echo "deploy.sh: done in $((SECONDS - started)) s" >&2
