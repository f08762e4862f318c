#!/usr/bin/env bash
# The standard comparisons of two wspush builds, before and after a change,
# in one command: what every change to the loop, heartbeats, delivery,
# timers or memory records in bench/RESULTS.md.
#
#   1. 19,000 connections in one instance: the floor, before, after and
#      fastwebsockets, 2 rounds (the order reversed in the second): lone
#      fan-out, CPU per delivery, a burst of 200 lines, the upgrade and
#      ping probes during it; then the same as a channel's (`pub hot`,
#      wspush with `--input commands`), before and after;
#   2. idle memory per connection at 19,000 (`channels memory`: `/`,
#      `/?id=N`, `/?id=N&channel=c`), for each build;
#   3. 100,000 connections over 8 instances: the floor, before and after,
#      4 rounds; then before and after with `--ping-interval 3s` (33,333
#      pings a second, a million's load at 30 s), 2 rounds;
#   4. instructions (callgrind) of each build through one `push` of 2,000
#      connections, 20 broadcasts and a burst, no pings: the program's and
#      the delivery visits' (`Visitor::visit`, inclusive);
#   5. a million connections over 64 instances (bench/million.sh), the
#      floor, before and after.
#
# Usage: bench/standard.sh BEFORE AFTER [STEP ...]
#   BEFORE and AFTER are wspush binaries (build each commit with `cargo
#   build --release -p wspush-cli` and copy target/release/wspush away).
#   STEPs (default: all) pick among 19000 memory 100000 callgrind million.
#   Environment: OUT (default /tmp/wspush-standard) gets each step's table
#   and reports (FLOOR_PINGS=1 goes on to bench/million.sh);
#   FASTWEBSOCKETS, the peer's run.sh (default: built from ../shared/peers
#   into /tmp/peers when missing).
#
# Time on the 2-vCPU machine: about 40 minutes, 14 of them the million.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
(($# >= 2)) || {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}
before="$(realpath "$1")"
after="$(realpath "$2")"
shift 2
steps=("$@")
((${#steps[@]})) || steps=(19000 memory 100000 callgrind million)
out="${OUT:-/tmp/wspush-standard}"
bench=target/release/wspush-bench
for binary in "$before" "$after"; do
  [[ -x "$binary" ]] || {
    echo "standard.sh: $binary is not an executable" >&2
    exit 2
  }
done
[[ -x "$bench" ]] || cargo build --release -p wspush-bench
mkdir -p "$out"

fastwebsockets="${FASTWEBSOCKETS:-/tmp/peers/rust-fastwebsockets/run.sh}"
peer() {
  [[ -x "$fastwebsockets" ]] && return
  local peers="$root/../shared/peers"
  mkdir -p /tmp/peers
  cp -r "$peers/rust-fastwebsockets" /tmp/peers/
  chmod -R u+w /tmp/peers/rust-fastwebsockets
  (cd /tmp/peers/rust-fastwebsockets && ./build.sh) >"$out/fastwebsockets-build.log" 2>&1
}

run() {
  local name="$1"
  shift
  echo "standard.sh: $name" >&2
  local started=$SECONDS
  "$@" >"$out/$name.txt" 2>"$out/$name.reports.txt"
  cat "$out/$name.txt"
  echo "standard.sh: $name took $((SECONDS - started)) s" >&2
}

instructions() {
  local name="$1" binary="$2" file="$out/callgrind.$1.out"
  "$bench" push --spawn "valgrind --tool=callgrind --callgrind-out-file=$file $binary --listen 127.0.0.1:{port} --quiet --ping-interval 1h" \
    --conns 2000 --rate 2000 --messages 20 --burst 200 --idle-secs 5 --settle-ms 1000 \
    >"$out/callgrind.$name.reports.txt" 2>&1
  local total visits
  total="$(callgrind_annotate "$file" 2>/dev/null | awk '!found && /PROGRAM TOTALS/ { gsub(",", "", $1); print $1; found = 1 }')"
  visits="$(callgrind_annotate --inclusive=yes "$file" 2>/dev/null |
    awk '!found && $NF ~ /^\[/ && $(NF-1) ~ /wspush::server::(deliver|walk)::Visitor::visit$/ { gsub(",", "", $1); print $1; found = 1 }')"
  printf '%-8s program %6.2f M instructions, delivery visits %6.2f M\n' "$name" \
    "$(echo "${total:-0} / 1000000" | bc -l)" "$(echo "${visits:-0} / 1000000" | bc -l)"
}

for step in "${steps[@]}"; do
  case "$step" in
    19000)
      peer
      run 19000 "$bench" compare --conns 19000 --messages 10 --payload-bytes 64 --burst 200 --probe-ms 10 \
        --no-echo --rounds 2 --idle-secs 3 --settle-ms 1000 --wait-quiet 30 --server floor \
        --server "before=$before --listen 127.0.0.1:{port} --quiet" \
        --server "after=$after --listen 127.0.0.1:{port} --quiet" \
        --server "fastwebsockets=$fastwebsockets"
      run 19000.channel "$bench" compare --conns 19000 --messages 10 --payload-bytes 64 --burst 200 --probe-ms 10 \
        --no-echo --rounds 2 --idle-secs 3 --settle-ms 1000 --wait-quiet 30 --channel hot --baseline before \
        --server "before=$before --listen 127.0.0.1:{port} --quiet --input commands" \
        --server "after=$after --listen 127.0.0.1:{port} --quiet --input commands"
      ;;
    memory)
      for build in before after; do
        binary="$before"
        [[ "$build" == after ]] && binary="$after"
        run "memory.$build" "$bench" channels memory --conns 19000 --variants plain,id,id+channel \
          --server "$binary --listen 127.0.0.1:{port} --input commands --quiet --ping-interval 1h"
      done
      ;;
    100000)
      run 100000 "$bench" compare --conns 100000 --messages 10 --rounds 4 --rate 40000 --max-in-flight 1024 \
        --no-echo --idle-secs 10 --wait-quiet 60 --baseline before --server "floor=floor --processes 8" \
        --server "before=$before --processes 8 --listen 127.0.0.1:{port}" \
        --server "after=$after --processes 8 --listen 127.0.0.1:{port}"
      run 100000.pings "$bench" compare --conns 100000 --messages 10 --rounds 2 --rate 40000 --max-in-flight 1024 \
        --no-echo --idle-secs 10 --wait-quiet 60 --baseline before \
        --server "before=$before --processes 8 --listen 127.0.0.1:{port} --ping-interval 3s" \
        --server "after=$after --processes 8 --listen 127.0.0.1:{port} --ping-interval 3s"
      ;;
    callgrind)
      echo "standard.sh: callgrind" >&2
      instructions before "$before" | tee "$out/callgrind.txt"
      instructions after "$after" | tee -a "$out/callgrind.txt"
      ;;
    million)
      OUT="$out/million" bench/million.sh "before=$before" "after=$after"
      ;;
    *)
      echo "standard.sh: no step '$step' (19000 memory 100000 callgrind million)" >&2
      exit 2
      ;;
  esac
done
