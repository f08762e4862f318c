# shellcheck shell=bash
# Shared by check.sh and apply.sh (sourced, not run): how to read the
# machine's limits and how much of each N connections need. Keeping the
# arithmetic in one place is what lets `apply.sh N` leave the machine in a
# state that `check.sh N` accepts.

# Files a process holds besides its sockets: stdio, the listener, the poll
# and waker descriptors, log files... wspush-bench keeps the same 64 spare.
HEADROOM_FDS=64
# Files the rest of the machine holds, counted in fs.file-max on top of the
# sockets (check.sh shows how many are in use right now).
OTHER_FILES=16384
# Measured here: kernel memory of one idle TCP socket (socket, inode,
# dentry, file, epoll item, TCP state).
SOCKET_KERNEL_BYTES=3900
# User-space bytes per idle connection: wspush (~122 measured, README) and
# the wspush-bench client (under 100).
SERVER_CONN_BYTES=128
CLIENT_CONN_BYTES=128
# The accept queue wspush asks for in listen(2); the kernel caps it at
# net.core.somaxconn.
LISTEN_BACKLOG=65535

PAGE_BYTES=$(getconf PAGESIZE 2>/dev/null || echo 4096)

# /proc/sys path of a sysctl key: net.core.somaxconn -> /proc/sys/net/core/somaxconn.
sysctl_path() {
  printf '/proc/sys/%s' "${1//.//}"
}

# Prints a sysctl's value, fields separated by single spaces; fails when the
# key does not exist (module not loaded) or cannot be read.
read_sysctl() {
  local path
  path=$(sysctl_path "$1")
  [[ -r $path ]] || return 1
  tr -s '\t ' '  ' <"$path" | sed 's/^ //; s/ $//'
}

# Integer ceiling of $1 / $2.
ceil_div() {
  echo $((($1 + $2 - 1) / $2))
}

# $1 rounded up to a multiple of $2.
round_up() {
  echo $((($1 + $2 - 1) / $2 * $2))
}

# Smallest power of two >= $1.
pow2_at_least() {
  local p=1
  while ((p < $1)); do p=$((p * 2)); done
  echo "$p"
}

max() { if (($1 > $2)); then echo "$1"; else echo "$2"; fi; }
min() { if (($1 < $2)); then echo "$1"; else echo "$2"; fi; }

# Bytes as a short human figure: 4096 -> 4.0 KiB.
human_bytes() {
  awk -v b="$1" 'BEGIN {
    split("B KiB MiB GiB TiB", unit, " "); i = 1
    while (b >= 1024 && i < 5) { b /= 1024; i++ }
    printf(i == 1 ? "%d %s" : "%.1f %s", b, unit[i])
  }'
}

# A line of /proc/meminfo in bytes: meminfo_bytes MemTotal.
meminfo_bytes() {
  awk -v key="$1:" '$1 == key { printf("%.0f\n", $2 * 1024); found = 1 } END { if (!found) print 0 }' /proc/meminfo
}

# Sum of one counter of /proc/net/netstat or /proc/net/snmp ("TcpExt" "ListenOverflows").
net_counter() {
  awk -v group="$1:" -v name="$2" '
    $1 == group && !header { for (i = 2; i <= NF; i++) col[$i] = i; header = 1; next }
    $1 == group && header  { if (name in col) print $(col[name]); exit }
  ' /proc/net/netstat /proc/net/snmp 2>/dev/null | head -n 1
}

# Packets dropped because a CPU's input backlog was full, since boot
# (second column of /proc/net/softnet_stat, hexadecimal, one row per CPU).
softnet_drops() {
  local total=0 drops
  [[ -r /proc/net/softnet_stat ]] || { echo 0; return; }
  while read -r _ drops _; do
    total=$((total + 16#$drops))
  done </proc/net/softnet_stat
  echo "$total"
}

# Whether this process may raise its hard limits (CAP_SYS_RESOURCE, bit 24).
has_cap_sys_resource() {
  local caps
  caps=$(awk '/^CapEff:/ { print $2 }' /proc/self/status 2>/dev/null)
  [[ -n $caps ]] && (((16#$caps >> 24) & 1))
}

# Current soft/hard open-file limit as a number ("unlimited" -> very large).
nofile_limit() {
  local value
  value=$(ulimit "$1" -n)
  [[ $value == unlimited ]] && value=$((1 << 62))
  echo "$value"
}

# Whether port $1 is listed in an ip_local_reserved_ports value ($2, e.g.
# "8080,9000-9100").
port_reserved() {
  local item lo hi
  local IFS=,
  for item in $2; do
    item=${item// /}
    [[ -z $item ]] && continue
    lo=${item%-*}
    hi=${item#*-}
    if (($1 >= lo && $1 <= hi)); then return 0; fi
  done
  return 1
}

# How many ports of lo..hi ($1..$2) are reserved by the list $3.
reserved_in_range() {
  local item lo hi count=0
  local IFS=,
  for item in $3; do
    item=${item// /}
    [[ -z $item ]] && continue
    lo=$(max "${item%-*}" "$1")
    hi=$(min "${item#*-}" "$2")
    ((hi >= lo)) && count=$((count + hi - lo + 1))
  done
  echo "$count"
}

# compute_needs N SOCKETS_PER_CONNECTION SERVER_PROCESSES CLIENT_PROCESSES
# Sets SOCKETS and the NEED_* globals: what N connections need of each limit.
# shellcheck disable=SC2034 # the globals are read by the scripts that source this
compute_needs() {
  local n=$1 per_conn=$2 procs=$3 client_procs=$4
  SOCKETS=$((n * per_conn))
  NEED_FILES_SERVER=$(($(ceil_div "$n" "$procs") + HEADROOM_FDS))
  NEED_FILES_CLIENT=0
  if ((per_conn == 2)); then
    NEED_FILES_CLIENT=$(($(ceil_div "$n" "$client_procs") + HEADROOM_FDS))
  fi
  NEED_NR_OPEN=$(max "$NEED_FILES_SERVER" "$NEED_FILES_CLIENT")
  NEED_FILE_MAX=$((SOCKETS + OTHER_FILES))
  NEED_EPOLL=$((SOCKETS + 4096))
  # Every connection of one listener may arrive at once (all clients
  # reconnecting after a restart), up to what wspush asks of listen(2).
  NEED_BACKLOG=$(min "$(ceil_div "$n" "$procs")" "$LISTEN_BACKLOG")
  # A socket holding even a small unread frame is charged a whole page:
  # during a broadcast to slow readers that is 1 page per connection (2 when
  # the sending and the receiving socket are both charged).
  NEED_TCP_MEM_PRESSURE=$n
  NEED_TCP_MEM_MAX=$((2 * n))
  # One packet per connection per broadcast arrives as a burst; let a CPU's
  # backlog hold 1/64 of it between two softirq runs (1000, the kernel
  # default, up to 64k connections).
  NEED_NETDEV=$(min "$(max $((n / 64)) 1000)" 65536)
  # One entry per connection, a quarter more for closed connections whose
  # entries linger (TIME_WAIT: 120 s) while clients reconnect.
  NEED_CONNTRACK=$((n + n / 4))
  # Every connection closed at once (shutdown, restart) is an orphan until
  # its FIN is acknowledged.
  NEED_ORPHANS=$n
  NEED_MEMORY=$((SOCKETS * SOCKET_KERNEL_BYTES + n * PAGE_BYTES + n * SERVER_CONN_BYTES))
  if ((per_conn == 2)); then
    NEED_MEMORY=$((NEED_MEMORY + n * CLIENT_CONN_BYTES))
  fi
}
