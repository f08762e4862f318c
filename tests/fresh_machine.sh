#!/usr/bin/env bash
# fresh_machine.sh: runs `cargo test` as a new machine would, whatever this
# one was tuned to, twice, at the same time (each in a namespace of its own;
# the tests mostly wait, so two runs take little more than one), their
# outputs printed one after the other:
#   1. untuned: a new network namespace, where every net.* sysctl is the
#      kernel's default (somaxconn 4096, port range 32768-60999 ...), and a
#      soft open-file limit of 1024, as a fresh login has;
#   2. tuned: the same, after `tuning/apply.sh 1000000 --both-ends` inside
#      it (what a user does before the million-connection run).
# The namespace's own values go with it; apply.sh raises only the fs.*
# values that are below what it needs, as it would on the host.
#
# Needs root (unshare -n) or user namespaces (unshare -rn). Extra arguments
# go to cargo test. Exit status: the first failing run's, else 0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Build and fetch outside: the namespace has no network but loopback.
cargo test --no-run "$@"

if [[ $(id -u) == 0 ]]; then
  unshare=(unshare -n)
else
  unshare=(unshare -rn)
fi

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

# Starts one run in the background, its output into $logs/NAME.
start() {
  local name=$1 setup=$2
  shift 2
  "${unshare[@]}" bash -c '
    set -euo pipefail
    ip link set lo up
    ulimit -Sn 1024
    eval "$1"
    shift
    exec cargo test "$@"
  ' fresh "$setup" "$@" >"$logs/$name" 2>&1 &
}

start untuned ":" "$@"
untuned=$!
start tuned "tuning/apply.sh 1000000 --both-ends >/dev/null" "$@"
tuned=$!
untuned_status=0 tuned_status=0
wait "$untuned" || untuned_status=$?
wait "$tuned" || tuned_status=$?

printf '\n---- cargo test, untuned: a new network namespace, soft open-file limit 1024 ----\n'
cat "$logs/untuned"
printf '\n---- cargo test, tuned: the same after tuning/apply.sh 1000000 --both-ends ----\n'
cat "$logs/tuned"
((untuned_status == 0)) || echo "fresh_machine.sh: the untuned run failed ($untuned_status)" >&2
((tuned_status == 0)) || echo "fresh_machine.sh: the tuned run failed ($tuned_status)" >&2
((untuned_status == 0)) || exit "$untuned_status"
exit "$tuned_status"
