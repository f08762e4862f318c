#!/usr/bin/env bash
# wspush on separate hosts fed through Redis: network namespaces joined by a
# bridge, as machines on one LAN are by a switch, each with its own network
# stack (sockets, loopback, sysctls at the kernel's defaults).
#
#   wsp-N-redis    10.77.0.1    redis-server (Debian's package)
#   wsp-N-h1..h3   10.77.0.11-13  one wspush each (started by the tests)
#   wsp-N-clients  10.77.0.100  the test process: its clients and publisher
#   wsp-N-lan      the bridge, and one end of each host's veth pair
#
# The checks are the ignored tests of tests/multihost.rs, run inside the
# clients' namespace (they start redis-server and the wspush hosts in
# theirs with `ip netns exec`). Installs redis-server and iproute2 with
# apt-get when missing. Needs root. Every namespace made here is removed on
# exit, with any process still in it. Time: ~30 s after the build.
#
# Usage: tests/multihost/run.sh [TEST NAME FILTER]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."

log() { printf '[multihost] %s\n' "$*"; }
die() {
  printf '[multihost] ERROR: %s\n' "$*" >&2
  exit 1
}

[[ "$(id -u)" == 0 ]] || die "needs root (ip netns add)"

packages=()
command -v redis-server >/dev/null || packages+=(redis-server)
command -v ip >/dev/null || packages+=(iproute2)
if ((${#packages[@]})); then
  log "installing ${packages[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  apt-get install -y -qq "${packages[@]}" >/dev/null || die "apt-get install ${packages[*]} failed"
fi
redis_server="$(command -v redis-server)"

log "building the tests (cargo test --test multihost --no-run)"
test_bin="$(cargo test --test multihost --no-run --message-format=json-render-diagnostics |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
[[ -x "$test_bin" ]] || die "cargo named no test binary"

prefix="wsp-$$-"
hosts=(redis h1 h2 h3 clients)
declare -A address=([redis]=10.77.0.1 [h1]=10.77.0.11 [h2]=10.77.0.12 [h3]=10.77.0.13 [clients]=10.77.0.100)

cleanup() {
  for ns in "${hosts[@]}" lan; do
    local name="$prefix$ns"
    ip netns list | grep -qw "$name" || continue
    # Only the processes started in these namespaces, by pid.
    for pid in $(ip netns pids "$name" 2>/dev/null); do
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns del "$name" 2>/dev/null || true
  done
}
trap cleanup EXIT

log "making namespaces ${prefix}{${hosts[*]// /,},lan}"
ip netns add "${prefix}lan"
ip -n "${prefix}lan" link add br0 type bridge
ip -n "${prefix}lan" link set br0 up
ip -n "${prefix}lan" link set lo up
for host in "${hosts[@]}"; do
  ns="$prefix$host"
  ip netns add "$ns"
  ip -n "${prefix}lan" link add "v-$host" type veth peer name eth0 netns "$ns"
  ip -n "${prefix}lan" link set "v-$host" master br0 up
  ip -n "$ns" addr add "${address[$host]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done

log "running tests/multihost.rs in ${prefix}clients"
WSPUSH_NETNS_PREFIX="$prefix" WSPUSH_REDIS_SERVER="$redis_server" \
  ip netns exec "${prefix}clients" "$test_bin" --ignored --test-threads 1 "$@"
