#!/usr/bin/env bash
# The million-connection row of the standard comparisons, in one command:
# the bench's floor and wspush (default flags: pings every 30 s), 64
# instances each behind SO_REUSEPORT, one after the other in one `compare`
# run: the setup rate, the idle CPU over one ping interval, the memory per
# connection and five lone broadcasts 20 s apart (each one's fan-out and
# the latency percentiles), every delivery checked.
#
# Usage: bench/million.sh [NAME=WSPUSH ...]
#   Each NAME=WSPUSH is a wspush binary measured beside the floor (default:
#   wspush=target/release/wspush); give two (before=..., after=...) for a
#   before-and-after record, which adds about 4.5 minutes.
#   Environment: OUT (default /tmp/wspush-million) gets the table
#   (table.txt) and the reports (reports.txt); CONNS (1000000) and
#   INSTANCES (64) change the size, for a try at a smaller one;
#   HOST_TABLE=1 runs in this network namespace instead of a new one;
#   FLOOR_PINGS=1 adds the floor pinging every connection once per 30 s
#   (`floor-pings`), the kernel's own cost of the heartbeat's rate beside
#   wspush's idle CPU (about 4.5 minutes more); SCRAPE=NAME runs the
#   server NAME with `--metrics-listen 127.0.0.1:19100` and scrapes the
#   host's /metrics there once a second for the whole run
#   (bench/scrape-host.py: answer times, and the sums checked against the
#   instances' own pages; its line ends the reports), and the bench reads
#   that page before and after the lone broadcasts (`--metrics-from`): the
#   server's latency histogram against the clients' send-to-last-receipt.
#
# Servers and clients run in a network namespace of their own, made for
# the run with an established-socket hash of a bucket per socket
# (net.ipv4.tcp_child_ehash_entries, Linux 6.1 and later; set back at
# once) and removed after it: this machine's own table, sized at boot,
# holds 2,000,000 sockets in chains of 8, whose walk slows every broadcast
# (tuning/README.md). Raises the kernel's limits there
# first (tuning/apply.sh 1000000 --both-ends; needs root, raises only).
# Builds what is missing (cargo build --release -p wspush-cli -p
# wspush-bench). Time on the 2-vCPU machine: about 9 minutes for the floor
# and one wspush.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
conns="${CONNS:-1000000}"
instances="${INSTANCES:-64}"
out="${OUT:-/tmp/wspush-million}"
bench=target/release/wspush-bench

servers=("$@")
((${#servers[@]})) || servers=("wspush=target/release/wspush")
for server in "${servers[@]}"; do
  [[ "$server" == *=* ]] || {
    echo "million.sh: '$server' is not NAME=WSPUSH" >&2
    exit 2
  }
done
if [[ ! -x "$bench" || ! -x target/release/wspush ]]; then
  cargo build --release -p wspush-cli -p wspush-bench
fi
for server in "${servers[@]}"; do
  binary="${server#*=}"
  [[ -x "$binary" ]] || {
    echo "million.sh: ${binary} is not an executable" >&2
    exit 2
  }
done

in_netns=()
if [[ -z "${HOST_TABLE:-}" ]]; then
  netns="wspush-million-$$"
  source bench/big_netns.sh
  big_netns "$netns" "$conns" || {
    echo "million.sh: cannot make a network namespace (HOST_TABLE=1 runs without one)" >&2
    exit 1
  }
  trap 'ip netns del "$netns"' EXIT
  echo "million.sh: in network namespace $netns, $("${in_netns[@]}" sysctl -n net.ipv4.tcp_ehash_entries) established-hash buckets" >&2
fi
"${in_netns[@]}" tuning/apply.sh "$conns" --both-ends >/dev/null
mkdir -p "$out"

spawn=(--server "floor=floor --processes $instances")
if [[ -n "${FLOOR_PINGS:-}" ]]; then
  spawn+=(--server "floor-pings=floor --processes $instances --ping-interval-ms 30000")
fi
scrape_port=19100
for server in "${servers[@]}"; do
  extra=""
  [[ "${server%%=*}" == "${SCRAPE:-}" ]] && extra=" --metrics-listen 127.0.0.1:$scrape_port"
  spawn+=(--server "${server%%=*}=${server#*=} --processes $instances --listen 127.0.0.1:{port}$extra")
done
scraper=""
metrics_from=()
if [[ -n "${SCRAPE:-}" ]]; then
  metrics_from=(--metrics-from "127.0.0.1:$scrape_port")
  "${in_netns[@]}" python3 bench/scrape-host.py "$scrape_port" "$instances" >"$out/scrape.txt" &
  scraper=$!
fi
echo "million.sh: $conns connections over $instances instances: floor, ${servers[*]}; reports in $out" >&2
started=$SECONDS
"${in_netns[@]}" "$bench" compare --conns "$conns" --rate 30000 --max-in-flight 1024 --settle-ms 3000 \
  --idle-secs 30 --messages 5 --gap-ms 20000 --no-echo --wait-quiet 30 "${metrics_from[@]}" "${spawn[@]}" \
  >"$out/table.txt" 2>"$out/reports.txt"
if [[ -n "$scraper" ]]; then
  kill -TERM "$scraper"
  wait "$scraper" || true
  cat "$out/scrape.txt" | tee -a "$out/reports.txt" >&2
fi
cat "$out/table.txt"
echo "million.sh: done in $((SECONDS - started)) s" >&2
