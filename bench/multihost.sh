#!/usr/bin/env bash
# The multi-host measurement: three wspush hosts, a redis-server and the
# clients, each in a network namespace of its own (tests/multihost/netns.sh),
# measured by `wspush-bench hosts` twice in one run: every line published
# once on Redis, then (the baseline) written to each host's standard input.
# Installs redis-server and iproute2 when missing; needs root; removes its
# namespaces on exit.
#
# Usage: [FEEDS="redis stream stdin"] bench/multihost.sh [PUSH OPTIONS]   e.g.
#   bench/multihost.sh --conns 45000 --messages 20 --burst 200
#   bench/multihost.sh --conns 45000 --messages 5 --find-max-feed-rate --feed-secs 30 --feed-max-p99-ms 100
#   FEEDS=stream bench/multihost.sh --conns 45000 --positions --feed-rate 20 --feed-secs 60 \
#     --storm-at-secs 10 --storm-at-secs 25 --storm-at-secs 40        (clients move host to host)
#   FEEDS=stream bench/multihost.sh --conns 45000 --positions --feed-rate 20 --feed-secs 40 \
#     --broker-outage-at-secs 10 --broker-outage-secs 10              (Redis stopped for 10 s)
# (--conns counts all hosts; connection i goes to host i % 3, and to the
# next host after each storm.) FEEDS picks the feeds measured, one run each
# (default: redis, then stdin as the baseline).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
source tests/multihost/netns.sh

[[ "$(id -u)" == 0 ]] || { echo "bench/multihost.sh: needs root (ip netns add)" >&2; exit 1; }
netns_need_tools
cargo build --release -p wspush-cli -p wspush-bench >&2
bench=target/release/wspush-bench

prefix="wspb-$$-"
trap 'netns_down "$prefix"' EXIT
netns_up "$prefix"
hosts=()
for h in h1 h2 h3; do
  hosts+=(--host "$prefix$h=${netns_address[$h]}")
done
for feed in ${FEEDS:-redis stdin}; do
  echo "==================== feed: $feed ====================" >&2
  ip netns exec "${prefix}clients" "$bench" hosts --feed "$feed" "${hosts[@]}" \
    --redis "${prefix}redis=${netns_address[redis]}" --redis-server "$(command -v redis-server)" \
    --first-source 10.77.0.101 --sources 4 "$@"
done
