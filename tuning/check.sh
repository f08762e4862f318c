#!/usr/bin/env bash
# check.sh N: every limit N concurrent WebSocket connections need, against
# what this machine (and this shell) has. One line per limit, OK, SHORT or
# WARN (a risk, not a shortage), with "needs X, has Y" and the fix; then a
# summary. Exit status: 0 all OK, 1 something is SHORT, 2 bad usage.
# Reads /proc/sys only: no root needed. See tuning/README.md.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$here/common.sh"

usage="check.sh N [--both-ends] [--processes K] [--client-processes C] [--source-addrs S] [--port P]"

usage_error() {
  printf 'check.sh: %s; usage: %s\n' "$1" "$usage" >&2
  exit 2
}

help() {
  cat <<EOF
usage: $usage

Checks the limits N concurrent connections to wspush need on this machine.

  N                      connections to hold (all server processes together)
  --both-ends            the clients run on this machine too (load test over
                         loopback): 2 sockets per connection, client limits
  --processes K          wspush server processes (wspush --processes K
                         --reuse-port); default 1
  --client-processes C   client processes, with --both-ends; default 1
  --source-addrs S       client source addresses 127.0.0.2 ... 127.0.0.(1+S),
                         with --both-ends (wspush-bench push --sources S);
                         default 1
  --port P               the port wspush listens on; default 8080

Exit status: 0 every limit is OK, 1 at least one is SHORT, 2 bad usage.
EOF
}

# A positive integer of at most 12 digits (so the arithmetic cannot overflow).
positive() {
  if ! [[ $2 =~ ^[0-9]{1,12}$ ]] || ((10#$2 == 0)); then
    usage_error "$1 must be a positive integer, not '$2'"
  fi
}

n=""
both_ends=0
procs=1
client_procs=""
sources=""
port=8080
while (($# > 0)); do
  arg=$1
  shift
  value=""
  case $arg in
    --*=*)
      value=${arg#*=}
      arg=${arg%%=*}
      ;;
    --processes | --client-processes | --source-addrs | --port)
      (($# > 0)) || usage_error "$arg needs a value"
      value=$1
      shift
      ;;
  esac
  case $arg in
    -h | --help) help; exit 0 ;;
    --both-ends) both_ends=1 ;;
    --processes) positive "$arg" "$value"; procs=$((10#$value)) ;;
    --client-processes) positive "$arg" "$value"; client_procs=$((10#$value)) ;;
    --source-addrs) positive "$arg" "$value"; sources=$((10#$value)) ;;
    --port)
      if ! [[ $value =~ ^[0-9]{1,5}$ ]] || ((10#$value < 1 || 10#$value > 65535)); then
        usage_error "--port must be a port number (1-65535), not '$value'"
      fi
      port=$((10#$value))
      ;;
    -*) usage_error "unknown option '$arg'" ;;
    *)
      [[ -z $n ]] || usage_error "one N only ('$n' and '$arg')"
      positive N "$arg"
      n=$((10#$arg))
      ;;
  esac
done
[[ -n $n ]] || usage_error "N, the number of connections, is missing"
if ((!both_ends)); then
  [[ -z $client_procs ]] || usage_error "--client-processes needs --both-ends"
  [[ -z $sources ]] || usage_error "--source-addrs needs --both-ends"
fi
client_procs=${client_procs:-1}
sources=${sources:-1}
per_conn=$((both_ends ? 2 : 1))

compute_needs "$n" "$per_conn" "$procs" "$client_procs"

ok=0
warn=0
short_names=()

# report STATUS LABEL DETAIL [MORE LINES...]
report() {
  local status=$1 label=$2 detail=$3 line
  shift 3
  case $status in
    OK) ok=$((ok + 1)) ;;
    WARN) warn=$((warn + 1)) ;;
    SHORT) short_names+=("$label") ;;
  esac
  printf '%-5s  %s: %s\n' "$status" "$label" "$detail"
  for line in "$@"; do
    printf '       %s\n' "$line"
  done
}

# sysctl_value KEY: the value, or exits with a message if it cannot be read.
sysctl_value() {
  read_sysctl "$1" || {
    printf 'check.sh: cannot read %s\n' "$(sysctl_path "$1")" >&2
    exit 1
  }
}

# host_wide KEY: reads into $value a limit that only the host's first network
# namespace shows (tcp_mem, netdev_max_backlog, tcp_max_orphans). In any
# other one (a container, `unshare -n`) the key is absent, though the host's
# value still applies: that is reported as a WARN, and host_wide fails.
host_wide() {
  if value=$(read_sysctl "$1"); then
    return 0
  fi
  report WARN "$1" "not visible in this network namespace: a host-wide value (a container or unshare -n shows only its own net.* values)" \
    "check it on the host: tuning/check.sh $n there"
  return 1
}

# --- header -------------------------------------------------------------------

if ((both_ends)); then
  where="both ends on this machine: $SOCKETS sockets"
else
  where="remote clients: $SOCKETS sockets"
fi
plural() { if (($1 == 1)); then echo "$1 $2"; else echo "$1 ${2}es"; fi; }
printf 'wspush tuning check: %s connections (%s), %s, port %s\n' \
  "$n" "$where" "$(plural "$procs" "server process")" "$port"
if ((both_ends)); then
  printf '                     %s, %s source address(es)\n' \
    "$(plural "$client_procs" "client process")" "$sources"
fi
echo

# --- open files per process -------------------------------------------------

soft=$(nofile_limit -S)
hard=$(nofile_limit -H)
nr_open=$(sysctl_value fs.nr_open)
if has_cap_sys_resource; then
  this_shell="this shell may raise it (it has CAP_SYS_RESOURCE): ulimit -n {NEED}"
else
  this_shell="this shell cannot raise its own hard limit (it lacks CAP_SYS_RESOURCE)"
fi

# open_files LABEL NEED PROCESSES MORE_PROCESSES_FIX PERMANENT_FIX SOFT_NOTE
open_files() {
  local label=$1 need=$2 count=$3 more_fix=$4 permanent_fix=$5 soft_note=$6
  local per more detail
  per=$((hard > HEADROOM_FDS ? hard - HEADROOM_FDS : 1))
  more=$(ceil_div "$n" "$per")
  detail="needs $need ($n / $(plural "$count" process) + $HEADROOM_FDS), has soft $soft, hard $hard (ulimit -n)"
  if ((hard >= need)); then
    if ((soft >= need)); then
      report OK "$label" "$detail"
    else
      report OK "$label" "$detail" "the soft limit is lower: $soft_note"
    fi
    return
  fi
  local fixes=("fix: run $more processes or more (${more_fix//\{M\}/$more}): $per connections each fit this hard limit;")
  fixes+=("     or raise the hard limit to $need: ${permanent_fix//\{NEED\}/$need};")
  fixes+=("     ${this_shell/\{NEED\}/$need}")
  if ((need > nr_open)); then
    fixes+=("     (and raise fs.nr_open to $need first: no hard limit can exceed it)")
  fi
  report SHORT "$label" "$detail" "without it: accept/connect fail with EMFILE \"Too many open files\"" "${fixes[@]}"
}

open_files "open files per server process" "$NEED_FILES_SERVER" "$procs" \
  "wspush --processes {M}; check with --processes {M}" \
  "LimitNOFILE={NEED} in the systemd unit (tuning/wspush.service)" \
  "wspush raises its soft limit to the hard limit when it starts"
if ((both_ends)); then
  open_files "open files per client process" "$NEED_FILES_CLIENT" "$client_procs" \
    "--client-processes {M}" \
    "nofile {NEED} in /etc/security/limits.d/ for new login sessions (tuning/limits.conf)" \
    "the client must raise its soft limit to the hard limit (wspush-bench does)"
fi

# --- fs.nr_open, fs.file-max, epoll -----------------------------------------

if ((nr_open >= NEED_NR_OPEN)); then
  report OK "fs.nr_open" "needs $NEED_NR_OPEN (the largest per-process need), has $nr_open"
else
  report SHORT "fs.nr_open" "needs $NEED_NR_OPEN (the largest per-process need), has $nr_open" \
    "without it: setrlimit/ulimit -n above $nr_open fails (EPERM), systemd units fail with status 205/LIMITS" \
    "fix: sysctl -w fs.nr_open=$NEED_NR_OPEN"
fi

file_max=$(sysctl_value fs.file-max)
files_in_use=$(read_sysctl fs.file-nr | awk '{ print $1 }')
detail="needs $NEED_FILE_MAX ($SOCKETS sockets + $OTHER_FILES for the rest; in use now: ${files_in_use:-?}), has $file_max"
if ((file_max >= NEED_FILE_MAX)); then
  report OK "fs.file-max" "$detail"
else
  report SHORT "fs.file-max" "$detail" \
    "without it: ENFILE \"Too many open files in system\", dmesg \"VFS: file-max limit $file_max reached\"" \
    "fix: sysctl -w fs.file-max=$(round_up "$NEED_FILE_MAX" 65536)"
fi

if epoll=$(read_sysctl fs.epoll.max_user_watches); then
  detail="needs $NEED_EPOLL (one per socket, per user), has $epoll"
  if ((epoll >= NEED_EPOLL)); then
    report OK "fs.epoll.max_user_watches" "$detail"
  else
    report SHORT "fs.epoll.max_user_watches" "$detail" \
      "without it: epoll_ctl fails with ENOSPC, the connection is dropped" \
      "fix: sysctl -w fs.epoll.max_user_watches=$(round_up "$NEED_EPOLL" 65536)"
  fi
fi

# --- ports: listen port and source addresses --------------------------------

read -r port_lo port_hi <<<"$(sysctl_value net.ipv4.ip_local_port_range)"
reserved=$(read_sysctl net.ipv4.ip_local_reserved_ports || true)
range_size=$((port_hi - port_lo + 1 - $(reserved_in_range "$port_lo" "$port_hi" "$reserved")))
((range_size > 0)) || range_size=1
label="listen port $port"
if ((port < port_lo || port > port_hi)); then
  report OK "$label" "outside the ephemeral range $port_lo-$port_hi (net.ipv4.ip_local_port_range)"
elif port_reserved "$port" "$reserved"; then
  report OK "$label" "inside the ephemeral range $port_lo-$port_hi but reserved (net.ipv4.ip_local_reserved_ports)"
else
  report WARN "$label" "inside the ephemeral range $port_lo-$port_hi (net.ipv4.ip_local_port_range) and not reserved" \
    "an outgoing connection may take port $port while wspush is down; wspush then fails to start: EADDRINUSE \"Address already in use\"" \
    "fix: sysctl -w net.ipv4.ip_local_reserved_ports=${reserved:+$reserved,}$port (apply.sh --port $port does it), or listen outside $port_lo-$port_hi"
fi

# A source address is planned at no more than 45% of the range, as
# wspush-bench push --sources does by default: connect() takes even ports
# first (odd ones are left to bind(0)), and once the even half is taken
# every connect() scans the whole range, about 20 times slower.
SOURCE_RANGE_PERCENT=45
per_source=$((range_size * SOURCE_RANGE_PERCENT / 100))
((per_source > 0)) || per_source=1
need_sources=$(ceil_div "$n" "$per_source")
least_sources=$(ceil_div "$n" "$range_size")
if ((both_ends)); then
  label="client source addresses"
  detail="needs $need_sources ($SOURCE_RANGE_PERCENT% of ports $port_lo-$port_hi per address: $per_source connections to one ip:port; at least $least_sources), has $sources (--source-addrs)"
  wide=$(ceil_div "$n" $(((65535 - 10000 + 1) * SOURCE_RANGE_PERCENT / 100)))
  if ((sources >= need_sources)); then
    report OK "$label" "$detail"
  elif ((sources >= least_sources)); then
    report WARN "$label" "$detail" \
      "connect() slows down about 20 times once an address has used half of its ports: the setup rate collapses near the end" \
      "fix: bind the client to $need_sources source addresses (wspush-bench push --sources $need_sources, its default) and check with --source-addrs $need_sources"
  else
    report SHORT "$label" "$detail" \
      "without it: connect fails with EADDRNOTAVAIL \"Cannot assign requested address\" after $((sources * range_size)) connections" \
      "fix: bind the client to $need_sources source addresses 127.0.0.2 ... 127.0.0.$((1 + need_sources)) (wspush-bench push --sources $need_sources, its default;" \
      "     loopback 127.0.0.0/8 needs no ip addr add) and check with --source-addrs $need_sources;" \
      "     or widen the range (net.ipv4.ip_local_port_range=\"10000 65535\": $wide addresses; reserve listen ports inside it)"
  fi
else
  report INFO "client addresses" "at most $range_size connections per client address to one ip:port (with an ephemeral range like $port_lo-$port_hi on the clients):" \
    "$n connections need $least_sources or more client addresses ($need_sources to keep each under $SOURCE_RANGE_PERCENT% of its ports, where a Linux client's connect() stays fast);" \
    "ask the clients' owners, nothing to change here"
fi

# --- accept queue, SYN queue --------------------------------------------------

somaxconn=$(sysctl_value net.core.somaxconn)
overflows=$(net_counter TcpExt ListenOverflows)
detail="needs $NEED_BACKLOG per listener (its connections all at once, at most the $LISTEN_BACKLOG wspush asks), has $somaxconn; overflows since boot: ${overflows:-?}"
if ((somaxconn >= NEED_BACKLOG)); then
  report OK "net.core.somaxconn" "$detail"
else
  report SHORT "net.core.somaxconn" "$detail" \
    "without it: a full accept queue drops SYNs and handshakes; clients' connect waits 1 s, 3 s, 7 s... (TcpExtListenOverflows, TcpExtListenDrops grow)" \
    "fix: sysctl -w net.core.somaxconn=$NEED_BACKLOG"
fi

syn_backlog=$(sysctl_value net.ipv4.tcp_max_syn_backlog)
syncookies=$(read_sysctl net.ipv4.tcp_syncookies || echo 0)
if ((syncookies > 0)); then
  when_short="a burst logs \"Possible SYN flooding on port ...:$port. Sending cookies.\" and answers with SYN cookies"
else
  when_short="\"Possible SYN flooding on port ...:$port. Dropping request.\" (syncookies are off), clients retry after 1 s, 3 s..."
fi
detail="needs $NEED_BACKLOG (half-open connections of a burst), has $syn_backlog"
if ((syn_backlog >= NEED_BACKLOG)); then
  report OK "net.ipv4.tcp_max_syn_backlog" "$detail"
else
  report SHORT "net.ipv4.tcp_max_syn_backlog" "$detail" "without it: $when_short" \
    "fix: sysctl -w net.ipv4.tcp_max_syn_backlog=$NEED_BACKLOG"
fi

# --- TCP memory -------------------------------------------------------------------

if host_wide net.ipv4.tcp_mem; then
  read -r mem_min mem_pressure mem_max <<<"$value"
  pressures=$(net_counter TcpExt TCPMemoryPressures)
  aborts=$(net_counter TcpExt TCPAbortOnMemory)
  detail="needs pressure >= $NEED_TCP_MEM_PRESSURE, max >= $NEED_TCP_MEM_MAX pages (1-2 pages of $PAGE_BYTES bytes per connection: $(human_bytes $((NEED_TCP_MEM_MAX * PAGE_BYTES)))), has $mem_min $mem_pressure $mem_max"
  evidence="memory pressure episodes since boot: ${pressures:-?}, sockets aborted for memory: ${aborts:-?}"
  if ((mem_pressure >= NEED_TCP_MEM_PRESSURE && mem_max >= NEED_TCP_MEM_MAX)); then
    report OK "net.ipv4.tcp_mem" "$detail" "$evidence"
  else
    new_pressure=$(max "$mem_pressure" "$NEED_TCP_MEM_PRESSURE")
    new_max=$(max "$mem_max" "$NEED_TCP_MEM_MAX")
    report SHORT "net.ipv4.tcp_mem" "$detail" "$evidence" \
      "without it: a broadcast to slow readers puts TCP under memory pressure (buffers shrink, sends stall);" \
      "     at max, dmesg \"TCP: out of memory -- consider tuning tcp_mem\" and sockets are reset" \
      "fix: sysctl -w net.ipv4.tcp_mem=\"$(min "$mem_min" "$new_pressure") $new_pressure $new_max\""
  fi
fi

# --- input backlog ---------------------------------------------------------------

if host_wide net.core.netdev_max_backlog; then
  netdev=$value
  detail="needs $NEED_NETDEV (a broadcast sends one packet per connection at once), has $netdev (packets dropped for it since boot: $(softnet_drops))"
  if ((netdev >= NEED_NETDEV)); then
    report OK "net.core.netdev_max_backlog" "$detail"
  else
    report SHORT "net.core.netdev_max_backlog" "$detail" \
      "without it: packets dropped on input (2nd column of /proc/net/softnet_stat grows), retransmits, late deliveries" \
      "fix: sysctl -w net.core.netdev_max_backlog=$(pow2_at_least "$NEED_NETDEV")"
  fi
fi

# --- established-socket hash ------------------------------------------------------

# Every arriving segment finds its socket in this table: a table smaller
# than the sockets makes chains that each lookup walks, a cache miss a
# link. Its size is fixed when it is made: the host's at boot, a network
# namespace's when the namespace is made. Not a shortage, a cost: WARN.
if ehash=$(read_sysctl net.ipv4.tcp_ehash_entries); then
  own="its own"
  if ((ehash < 0)); then
    ehash=$((-ehash))
    own="the host's, shared by this namespace"
  fi
  need_ehash=$(pow2_at_least "$SOCKETS")
  chains=$(((SOCKETS + ehash - 1) / ehash))
  detail="$SOCKETS sockets in $ehash buckets ($own): chains of about $chains"
  if ((ehash >= SOCKETS)); then
    report OK "net.ipv4.tcp_ehash_entries" "$detail"
  else
    report WARN "net.ipv4.tcp_ehash_entries" "$detail" \
      "without more: each segment's lookup walks its chain, a cache miss a link, and broadcasts take longer (measured: bench/RESULTS.md, \"an established-socket hash of a bucket per socket\")" \
      "fix (read-only, sized when made): thash_entries=$need_ehash on the kernel command line, then reboot;" \
      "     or sysctl -w net.ipv4.tcp_child_ehash_entries=$need_ehash, then run the server in a network namespace made after that (ip netns add)"
  fi
else
  report INFO "net.ipv4.tcp_ehash_entries" "not shown by this kernel (Linux 6.1 and later show it); dmesg's \"TCP established hash table entries\" gives the host's"
fi

# --- connection tracking -------------------------------------------------------------

if conntrack_max=$(read_sysctl net.netfilter.nf_conntrack_max); then
  tracked=$(read_sysctl net.netfilter.nf_conntrack_count || echo "?")
  detail="needs $NEED_CONNTRACK ($n connections + 1/4 closing), has $conntrack_max (tracked now: $tracked)"
  idle_note="nothing tracked now: no firewall rule uses it yet, but one that does (NAT, docker, -m state) makes it count"
  if ((conntrack_max >= NEED_CONNTRACK)); then
    if [[ $tracked == 0 ]]; then
      report OK "net.netfilter.nf_conntrack_max" "$detail" "$idle_note"
    else
      report OK "net.netfilter.nf_conntrack_max" "$detail"
    fi
  else
    extra=()
    [[ $tracked == 0 ]] && extra=("$idle_note")
    report SHORT "net.netfilter.nf_conntrack_max" "$detail" "${extra[@]}" \
      "without it: dmesg \"nf_conntrack: table full, dropping packet\", new connections time out" \
      "fix: sysctl -w net.netfilter.nf_conntrack_max=$(round_up "$NEED_CONNTRACK" 65536)"
  fi
else
  report OK "net.netfilter.nf_conntrack_max" "nf_conntrack not loaded, no limit"
fi

# --- mass close -------------------------------------------------------------------------

if host_wide net.ipv4.tcp_max_orphans; then
  orphans=$value
  detail="needs $NEED_ORPHANS (every connection closed at once: shutdown, restart), has $orphans"
  if ((orphans >= NEED_ORPHANS)); then
    report OK "net.ipv4.tcp_max_orphans" "$detail"
  else
    report SHORT "net.ipv4.tcp_max_orphans" "$detail" \
      "without it: dmesg \"TCP: too many orphaned sockets\", the rest are reset instead of closed" \
      "fix: sysctl -w net.ipv4.tcp_max_orphans=$(round_up "$NEED_ORPHANS" 65536)"
  fi
fi

# --- memory --------------------------------------------------------------------------------

mem_total=$(meminfo_bytes MemTotal)
mem_available=$(meminfo_bytes MemAvailable)
parts="$SOCKETS sockets x $SOCKET_KERNEL_BYTES B kernel + $n x $PAGE_BYTES B in flight + $n x $SERVER_CONN_BYTES B wspush"
((both_ends)) && parts="$parts + $n x $CLIENT_CONN_BYTES B client"
detail="needs $(human_bytes "$NEED_MEMORY") ($parts), has $(human_bytes "$mem_total") ($(human_bytes "$mem_available") available now)"
if ((NEED_MEMORY > mem_total)); then
  report SHORT "memory" "$detail" \
    "without it: the OOM killer, or TCP memory pressure first; fix: more RAM, or fewer connections per machine"
elif ((NEED_MEMORY > mem_available)); then
  report WARN "memory" "$detail" "more than is available now: other processes hold the rest"
else
  report OK "memory" "$detail"
fi

# --- summary ---------------------------------------------------------------------------------

echo
if ((${#short_names[@]} == 0)); then
  printf 'summary: OK: %s OK, %s WARN, 0 SHORT: this machine can hold %s connections\n' "$ok" "$warn" "$n"
  exit 0
fi
shorts=$(printf '%s, ' "${short_names[@]}")
printf 'summary: SHORT: %s OK, %s WARN, %s SHORT (%s): this machine cannot hold %s connections yet\n' \
  "$ok" "$warn" "${#short_names[@]}" "${shorts%, }" "$n"
for name in "${short_names[@]}"; do
  if [[ $name == net.* || $name == fs.* ]]; then
    printf '         raise the sysctls for this boot: sudo %s/apply.sh %s%s; for good: %s/sysctl.conf\n' \
      "$(dirname "$0")" "$n" "$([[ $both_ends == 1 ]] && echo " --both-ends")" "$(dirname "$0")"
    break
  fi
done
exit 1
