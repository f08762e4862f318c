#!/bin/sh
# Sets up connections to the bare loop (`floor`) and to wspush at the same
# time, each server with its own `push` client, so that both meet the same
# machine. On this VM a server's setup rate swings by 15-25% from one run
# to the next; comparing runs made one after the other mixes that swing
# into the ratio, comparing the server CPU per connection of runs made at
# once does not. Both clients offer the same rate, so the rates come out
# alike; what tells the servers apart is their CPU per connection.
#
# Usage: bench/together.sh [CONNS_EACH [INSTANCES_EACH [ROUNDS]]]
#   defaults: 200000 connections and 30 instances each (a million in all
#   is 500000 each), 1 round. Build first:
#   cargo build --release -p wspush-cli -p wspush-bench
# Reports go to $OUT (default /tmp/wspush-together), one pair per round.
set -eu

conns=${1:-200000}
instances=${2:-30}
rounds=${3:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
bench=$root/target/release/wspush-bench
wspush=$root/target/release/wspush
out=${OUT:-/tmp/wspush-together}
for binary in "$bench" "$wspush"; do
    [ -x "$binary" ] || { echo "together.sh: $binary missing: cargo build --release -p wspush-cli -p wspush-bench" >&2; exit 2; }
done
mkdir -p "$out"

# Each client paces at half the rate a lone run is offered (30,000/s, the
# README's million-connection command), over 4 active workers.
client="--conns $conns --rate 15000 --max-in-flight 512 --active-workers 4 --messages 3 --idle-secs 2"

server_cpu() { # the server's setup CPU per connection in µs, from a report
    sed -n 's/.*setup CPU *per connection: server \([0-9.]*\) µs.*/\1/p' "$1"
}

round=1
while [ "$round" -le "$rounds" ]; do
    "$bench" push --spawn "floor --processes $instances" --label floor $client \
        >"$out/floor.$round.txt" 2>"$out/floor.$round.log" &
    floor_pid=$!
    "$bench" push --spawn "$wspush --processes $instances --listen 127.0.0.1:{port} --quiet --ping-interval 1h --idle-timeout 2h" \
        --label wspush $client >"$out/wspush.$round.txt" 2>"$out/wspush.$round.log" &
    wspush_pid=$!
    failed=0
    wait "$floor_pid" || failed=1
    wait "$wspush_pid" || failed=1
    if [ "$failed" -ne 0 ]; then
        echo "together.sh: round $round: a push run failed, see $out/*.$round.log" >&2
        exit 1
    fi
    floor=$(server_cpu "$out/floor.$round.txt")
    ws=$(server_cpu "$out/wspush.$round.txt")
    for name in floor wspush; do
        printf 'round %s %-7s%s\n' "$round" "$name" "$(grep -E '^ *setup  ' "$out/$name.$round.txt" | sed 's/^ *setup *//')"
    done
    awk -v r="$round" -v f="$floor" -v w="$ws" \
        'BEGIN { printf "round %s server CPU per connection: floor %.1f µs, wspush %.1f µs = %.3f×\n", r, f, w, w / f }'
    round=$((round + 1))
done
