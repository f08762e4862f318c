#!/usr/bin/env bash
# fresh_machine.sh: runs `cargo test` as a new machine would, whatever this
# one was tuned to, twice:
#   1. untuned: a new network namespace, where every net.* sysctl is the
#      kernel's default (somaxconn 4096, port range 32768-60999 ...), and a
#      soft open-file limit of 1024, as a fresh login has;
#   2. tuned: the same, after `tuning/apply.sh 1000000 --both-ends` inside
#      it (what a user does before the million-connection run).
# The namespace's own values go with it; apply.sh raises only the fs.*
# values that are below what it needs, as it would on the host.
# WSPUSH_TEST_NETNS=required makes the tests that build their own namespace
# fail instead of skip if they cannot.
#
# Needs root (unshare -n) or user namespaces (unshare -rn). Extra arguments
# go to cargo test. Exit status: cargo test's first failure, else 0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Build and fetch outside: the namespace has no network but loopback.
cargo test --no-run "$@"

if [[ $(id -u) == 0 ]]; then
  unshare=(unshare -n)
else
  unshare=(unshare -rn)
fi
export WSPUSH_TEST_NETNS=required

run() {
  local name=$1 setup=$2
  shift 2
  printf '\n---- cargo test, %s ----\n' "$name"
  "${unshare[@]}" bash -c '
    set -euo pipefail
    ip link set lo up
    ulimit -Sn 1024
    eval "$1"
    shift
    exec cargo test "$@"
  ' fresh "$setup" "$@"
}

run "untuned: a new network namespace, soft open-file limit 1024" ":" "$@"
run "tuned: the same after tuning/apply.sh 1000000 --both-ends" \
  "tuning/apply.sh 1000000 --both-ends >/dev/null" "$@"
