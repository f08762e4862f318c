#!/usr/bin/env bash
# apply.sh [N]: raises, for the current boot, the kernel limits N concurrent
# WebSocket connections need (default N: 1000000), with `sysctl -w`. It
# only raises: a value already at least as big is kept. Running it twice
# changes nothing the second time. It prints every value before and after.
#
# Open-file limits (ulimit -n) belong to processes, not to the kernel: a
# script cannot raise its parent shell's, so apply.sh says what to do.
# The permanent versions of all this: sysctl.conf, limits.conf,
# wspush.service next to this script; tuning/README.md explains each knob.
#
# Exit status: 0 done (or nothing to do), 1 not root or a write failed,
# 2 bad usage.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$here/common.sh"

usage="apply.sh [N] [--both-ends] [--port P] [--dry-run]"

usage_error() {
  printf 'apply.sh: %s; usage: %s\n' "$1" "$usage" >&2
  exit 2
}

help() {
  cat <<EOF
usage: $usage

Raises this boot's kernel limits for N concurrent connections (default
1000000); never lowers a value. Needs root.

  N            connections to hold (all server processes together)
  --both-ends  the clients run on this machine too: size for 2 sockets per
               connection
  --port P     the port wspush listens on (default 8080): reserved
               (net.ipv4.ip_local_reserved_ports) if it lies in the
               ephemeral range
  --dry-run    only print what would change

Exit status: 0 done or nothing to do, 1 not root or a write failed, 2 bad usage.
EOF
}

args=("$@")
n=1000000
n_given=0
both_ends=0
port=8080
dry_run=0
while (($# > 0)); do
  arg=$1
  shift
  case $arg in
    -h | --help) help; exit 0 ;;
    --both-ends) both_ends=1 ;;
    --dry-run) dry_run=1 ;;
    --port | --port=*)
      if [[ $arg == --port ]]; then
        (($# > 0)) || usage_error "--port needs a value"
        value=$1
        shift
      else
        value=${arg#*=}
      fi
      if ! [[ $value =~ ^[0-9]{1,5}$ ]] || ((10#$value < 1 || 10#$value > 65535)); then
        usage_error "--port must be a port number (1-65535), not '$value'"
      fi
      port=$((10#$value))
      ;;
    -*) usage_error "unknown option '$arg'" ;;
    *)
      ((!n_given)) || usage_error "one N only"
      if ! [[ $arg =~ ^[0-9]{1,12}$ ]] || ((10#$arg == 0)); then
        usage_error "N must be a positive integer, not '$arg'"
      fi
      n=$((10#$arg))
      n_given=1
      ;;
  esac
done

root=0
[[ $(id -u) == 0 ]] && root=1
# Without root nothing can be written: show the plan instead.
write=$((root && !dry_run))

per_conn=$((both_ends ? 2 : 1))
# One process is the most demanding case for the per-listener numbers
# (somaxconn, fs.nr_open); anything sized for it suits more processes too.
compute_needs "$n" "$per_conn" 1 1

if ((both_ends)); then
  printf 'apply.sh: raising kernel limits for %s connections, both ends on this machine (%s sockets)\n' "$n" "$SOCKETS"
else
  printf 'apply.sh: raising kernel limits for %s connections (%s sockets)\n' "$n" "$SOCKETS"
fi
if ((!root)); then
  echo "apply.sh: not root: nothing will be changed; this is what root would do"
elif ((dry_run)); then
  echo "apply.sh: --dry-run: nothing will be changed"
fi
echo

changed=0
failed=0
would="would raise"
((write)) && would="raised"

# set_sysctl KEY OLD NEW: writes NEW (when allowed) and reports OLD -> NEW.
set_sysctl() {
  local key=$1 old=$2 new=$3 now
  if ((!write)); then
    printf '%-11s %s: %s -> %s\n' "$would" "$key" "$old" "$new"
    changed=$((changed + 1))
    return
  fi
  if command -v sysctl >/dev/null; then
    sysctl -q -w "$key=$new" >/dev/null 2>&1 || true
  else
    printf '%s\n' "$new" >"$(sysctl_path "$key")" 2>/dev/null || true
  fi
  now=$(read_sysctl "$key" || echo "?")
  # The kernel prints the reserved ports its own way (merged ranges).
  if [[ $now == "$new" ]] || { [[ $key == *reserved_ports ]] && port_reserved "$port" "$now"; }; then
    printf '%-11s %s: %s -> %s\n' "$would" "$key" "$old" "$new"
    changed=$((changed + 1))
  else
    printf '%-11s %s: could not set %s (still %s)\n' "FAILED" "$key" "$new" "$now"
    failed=$((failed + 1))
  fi
}

# Why a key may be missing: tcp_mem, netdev_max_backlog and tcp_max_orphans
# belong to the host's first network namespace; a container or `unshare -n`
# does not show them (and shows nf_conntrack_max read-only), but the host's
# values apply there too.
absent="not in this kernel, or a host-wide value this network namespace does not show: raise it on the host"

# raise KEY NEED TARGET WHY: a single-number sysctl; kept when it is at
# least NEED, else raised to TARGET (NEED rounded up to a round number).
raise() {
  local key=$1 need=$2 target=$3 why=$4 old
  if ! old=$(read_sysctl "$key"); then
    printf '%-11s %s: not present (%s): %s\n' "skip" "$key" "$why" "$absent"
    return
  fi
  if ((old >= need)); then
    printf '%-11s %s: %s (needs %s: %s)\n' "keep" "$key" "$old" "$need" "$why"
  elif [[ $(stat -c %A "$(sysctl_path "$key")") != *w* ]]; then
    # nf_conntrack_max, in any network namespace but the host's first one.
    printf '%-11s %s: %s, needs %s (%s): read-only here, a host-wide value: raise it on the host\n' \
      "skip" "$key" "$old" "$need" "$why"
  else
    set_sysctl "$key" "$old" "$target"
  fi
}

raise fs.nr_open "$NEED_NR_OPEN" "$(round_up "$NEED_NR_OPEN" 65536)" "the ceiling of any process's open-file limit"
raise fs.file-max "$NEED_FILE_MAX" "$(round_up "$NEED_FILE_MAX" 65536)" "open files of the whole machine"
raise fs.epoll.max_user_watches "$NEED_EPOLL" "$(round_up "$NEED_EPOLL" 65536)" "sockets in epoll, per user"
raise net.core.somaxconn "$NEED_BACKLOG" "$NEED_BACKLOG" "accept queue per listener"
raise net.ipv4.tcp_max_syn_backlog "$NEED_BACKLOG" "$NEED_BACKLOG" "half-open connections per listener"
raise net.core.netdev_max_backlog "$NEED_NETDEV" "$(pow2_at_least "$NEED_NETDEV")" "packets queued per CPU on input"
raise net.ipv4.tcp_max_orphans "$NEED_ORPHANS" "$(round_up "$NEED_ORPHANS" 65536)" "connections closed at once"
if read_sysctl net.netfilter.nf_conntrack_max >/dev/null; then
  raise net.netfilter.nf_conntrack_max "$NEED_CONNTRACK" "$(round_up "$NEED_CONNTRACK" 65536)" "tracked connections"
else
  printf '%-11s %s: nf_conntrack not loaded, no limit\n' "skip" "net.netfilter.nf_conntrack_max"
fi

# tcp_mem is three numbers of pages (min pressure max): raise pressure and
# max field by field, never past 3/4 of the RAM (a TCP limit above the RAM
# turns memory pressure into the OOM killer).
if ! tcp_mem=$(read_sysctl net.ipv4.tcp_mem); then
  printf '%-11s %s: not present: %s\n' "skip" "net.ipv4.tcp_mem" "$absent"
else
  read -r mem_min mem_pressure mem_max <<<"$tcp_mem"
  ram_pages=$(($(meminfo_bytes MemTotal) / PAGE_BYTES))
  cap=$((ram_pages * 3 / 4))
  want_pressure=$(min "$NEED_TCP_MEM_PRESSURE" "$cap")
  want_max=$(min "$NEED_TCP_MEM_MAX" "$cap")
  new_pressure=$(max "$mem_pressure" "$want_pressure")
  new_max=$(max "$mem_max" "$want_max")
  new_min=$(min "$mem_min" "$new_pressure")
  if ((new_pressure == mem_pressure && new_max == mem_max)); then
    printf '%-11s %s: %s %s %s (needs pressure %s, max %s pages)\n' "keep" "net.ipv4.tcp_mem" \
      "$mem_min" "$mem_pressure" "$mem_max" "$NEED_TCP_MEM_PRESSURE" "$NEED_TCP_MEM_MAX"
  else
    set_sysctl net.ipv4.tcp_mem "$mem_min $mem_pressure $mem_max" "$new_min $new_pressure $new_max"
  fi
  if ((want_max < NEED_TCP_MEM_MAX)); then
    printf '%-11s %s: capped at 3/4 of the RAM (%s pages); %s connections need %s pages at most\n' \
      "WARNING" "net.ipv4.tcp_mem" "$cap" "$n" "$NEED_TCP_MEM_MAX"
  fi
fi

# The listen port: reserved if it lies in the ephemeral range, so that no
# outgoing connection takes it while wspush is down.
read -r port_lo port_hi <<<"$(read_sysctl net.ipv4.ip_local_port_range)"
reserved=$(read_sysctl net.ipv4.ip_local_reserved_ports || true)
key=net.ipv4.ip_local_reserved_ports
if ((port < port_lo || port > port_hi)); then
  printf '%-11s %s: %s (port %s is outside the ephemeral range %s-%s)\n' "keep" "$key" "${reserved:-empty}" "$port" "$port_lo" "$port_hi"
elif port_reserved "$port" "$reserved"; then
  printf '%-11s %s: %s (port %s already reserved)\n' "keep" "$key" "$reserved" "$port"
else
  set_sysctl "$key" "${reserved:-empty}" "${reserved:+$reserved,}$port"
fi
printf '%-11s %s: %s-%s (%s connections per source address to one ip:port: a local client needs %s source address(es) for %s)\n' \
  "keep" "net.ipv4.ip_local_port_range" "$port_lo" "$port_hi" "$((port_hi - port_lo + 1))" \
  "$(ceil_div "$n" $((port_hi - port_lo + 1)))" "$n"

# --- what a script cannot do --------------------------------------------------------------

soft=$(nofile_limit -S)
hard=$(nofile_limit -H)
per=$((hard > HEADROOM_FDS ? hard - HEADROOM_FDS : 1))
if ((n <= per)); then
  processes="one process"
else
  processes="$(ceil_div "$n" "$per") processes (wspush --reuse-port --processes $(ceil_div "$n" "$per"))"
fi
cat <<EOF

Not changed (apply.sh cannot do it for you):
- Open files per process (RLIMIT_NOFILE). Your shell: soft $soft, hard $hard, so one
  process holds about $per connections: $n need $processes.
  * The soft limit can be raised up to the hard one by anyone: \`ulimit -n $hard\`;
    wspush does this itself when it starts.
  * The hard limit of a running shell can only be raised by root with
    CAP_SYS_RESOURCE, in that shell (\`ulimit -Hn $NEED_NR_OPEN\`); a script cannot change
    the shell that started it ($(has_cap_sys_resource && echo "this one has the capability" || echo "this one lacks the capability")).
  * Permanently: tuning/limits.conf into /etc/security/limits.d/ (new login
    sessions), or LimitNOFILE= in the systemd unit (tuning/wspush.service).
- The ephemeral port range (net.ipv4.ip_local_port_range) is left alone: a
  local load client uses more source addresses instead (127.0.0.2 ...).
- Nothing here survives a reboot: tuning/sysctl.conf into /etc/sysctl.d/.
EOF

echo
if ((failed > 0)); then
  printf 'apply.sh: %s value(s) could not be set (read-only /proc/sys in a container?)\n' "$failed" >&2
  exit 1
fi
if ((!root && changed > 0)); then
  printf 'apply.sh: not root: nothing changed (%s value(s) to raise); run: sudo %s\n' "$changed" "$0${args[*]:+ ${args[*]}}" >&2
  exit 1
fi
if ((dry_run && changed > 0)); then
  printf 'apply.sh: --dry-run: %s value(s) would be raised\n' "$changed"
elif ((changed == 0)); then
  echo "apply.sh: nothing to do: every limit was already high enough"
else
  printf 'apply.sh: raised %s value(s) for this boot; check with: %s/check.sh %s%s\n' \
    "$changed" "$(dirname "$0")" "$n" "$([[ $both_ends == 1 ]] && echo " --both-ends")"
fi
