#!/usr/bin/env bash
# What the history costs in memory: wspush with PROCESSES instances (1:
# a lone server) is fed LINES lines of 64 bytes (the history sized to keep
# them all), then the RSS and PSS of its process tree are read from
# /proc/PID/smaps_rollup, against the same server fed nothing.
#
# Usage: bench/history-memory.sh WSPUSH_BINARY [PROCESSES] [LINES]
# Prints one line: processes, lines, RSS and PSS growth (MiB), messages held.
set -euo pipefail
bin="$1"
processes="${2:-1}"
lines="${3:-100000}"

# The sum of a field of smaps_rollup (kB) over a process and its children.
tree_kb() {
  local pid="$1" field="$2" total=0 p
  for p in "$pid" $(cat "/proc/$pid/task/$pid/children" 2>/dev/null); do
    total=$((total + $(awk -v f="$field:" '$1 == f { print $2 }' "/proc/$p/smaps_rollup")))
  done
  echo "$total"
}

# Starts the server, feeds it COUNT lines, waits for them to be taken,
# and prints "RSS_KB PSS_KB HELD".
measure() {
  local count="$1" fifo dir pid port metrics held
  dir="$(mktemp -d)"
  fifo="$dir/in"
  mkfifo "$fifo"
  flags=(--listen 127.0.0.1:0 --quiet --history-messages "$((lines + 1000))" --history-bytes 268435456
    --metrics-listen 127.0.0.1:0)
  [[ "$processes" != 1 ]] && flags+=(--processes "$processes")
  "$bin" "${flags[@]}" <"$fifo" 2>"$dir/log" &
  pid=$!
  exec 3>"$fifo"
  for _ in $(seq 100); do
    grep -q "listening on" "$dir/log" && break
    sleep 0.1
  done
  sleep 1
  python3 -c "
import sys
line = b'x' * 64 + b'\n'
sys.stdout.buffer.write(line * $count)" >&3
  sleep 3
  rss="$(tree_kb "$pid" Rss)"
  pss="$(tree_kb "$pid" Pss)"
  exec 3>&-
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  echo "$rss $pss"
}

read -r base_rss base_pss < <(measure 0)
read -r fed_rss fed_pss < <(measure "$lines")
awk -v p="$processes" -v n="$lines" -v br="$base_rss" -v bp="$base_pss" -v fr="$fed_rss" -v fp="$fed_pss" \
  'BEGIN { printf "processes %d, %d lines of 64 B: RSS +%.1f MiB, PSS +%.1f MiB, RSS+PSS +%.1f MiB\n",
           p, n, (fr - br) / 1024, (fp - bp) / 1024, (fr - br + fp - bp) / 1024 }'
