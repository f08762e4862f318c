# A network namespace for a run of many loopback connections (source this
# file; bench/million.sh and bench/deploy.sh do): made with an
# established-socket hash of a bucket per socket
# (net.ipv4.tcp_child_ehash_entries, Linux 6.1 and later; set back at
# once), because this machine's own table, sized at boot, holds 2,000,000
# sockets in chains of 8, whose walk slows every broadcast
# (tuning/README.md).
#
# big_netns NAME CONNS: makes namespace NAME for CONNS connections, brings
# its loopback up and sets `in_netns` to the command prefix that runs in
# it; returns 1 if it cannot be made. The caller removes it
# (`ip netns del NAME`).
big_netns() {
  local name="$1" conns="$2" buckets=1 before made=0
  while ((buckets < 2 * conns)); do buckets=$((buckets * 2)); done
  before="$(sysctl -n net.ipv4.tcp_child_ehash_entries)"
  sysctl -qw net.ipv4.tcp_child_ehash_entries="$buckets"
  ip netns add "$name" && made=1
  sysctl -qw net.ipv4.tcp_child_ehash_entries="$before"
  ((made)) || return 1
  in_netns=(ip netns exec "$name")
  "${in_netns[@]}" ip link set lo up
}
