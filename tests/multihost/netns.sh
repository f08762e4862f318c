# Network namespaces as separate hosts on one LAN, for tests/multihost/run.sh
# and bench/multihost.sh (source this file). Each host has its own network
# stack (sockets, loopback, sysctls at the kernel's defaults) and one end of
# a veth pair; the other ends hang on a bridge in a namespace of its own, as
# machines hang on a switch. Nothing reaches beyond these namespaces.
#
#   ${prefix}redis    10.77.0.1      redis-server
#   ${prefix}h1..h3   10.77.0.11-13  one wspush each
#   ${prefix}clients  10.77.0.100    the clients and the publisher (and
#                     10.77.0.101-104, source addresses for many clients)
#   ${prefix}lan      the bridge

netns_hosts=(redis h1 h2 h3 clients)
declare -A netns_address=([redis]=10.77.0.1 [h1]=10.77.0.11 [h2]=10.77.0.12 [h3]=10.77.0.13 [clients]=10.77.0.100)

# netns_need_tools: installs redis-server and iproute2 (apt-get) if missing.
netns_need_tools() {
  local packages=()
  command -v redis-server >/dev/null || packages+=(redis-server)
  command -v ip >/dev/null || packages+=(iproute2)
  ((${#packages[@]})) || return 0
  echo "installing ${packages[*]} (apt-get)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
}

# netns_up PREFIX: makes the namespaces PREFIX{redis,h1,h2,h3,clients,lan}.
netns_up() {
  local prefix="$1" host ns
  ip netns add "${prefix}lan"
  ip -n "${prefix}lan" link add br0 type bridge
  ip -n "${prefix}lan" link set br0 up
  ip -n "${prefix}lan" link set lo up
  for host in "${netns_hosts[@]}"; do
    ns="$prefix$host"
    ip netns add "$ns"
    ip -n "${prefix}lan" link add "v-$host" type veth peer name eth0 netns "$ns"
    ip -n "${prefix}lan" link set "v-$host" master br0 up
    ip -n "$ns" addr add "${netns_address[$host]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
  for host in 101 102 103 104; do
    ip -n "${prefix}clients" addr add "10.77.0.$host/24" dev eth0
  done
}

# netns_remove NAME...: kills what still runs in those namespaces (only
# processes started in them, by pid) and removes them.
netns_remove() {
  local name pid
  for name in "$@"; do
    ip netns list | grep -qw "$name" || continue
    for pid in $(ip netns pids "$name" 2>/dev/null); do
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns del "$name" 2>/dev/null || true
  done
}

# netns_down PREFIX: removes the namespaces netns_up made.
netns_down() {
  local prefix="$1" host names=()
  for host in "${netns_hosts[@]}" lan; do
    names+=("$prefix$host")
  done
  netns_remove "${names[@]}"
}
