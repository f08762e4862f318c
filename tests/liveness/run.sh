#!/usr/bin/env bash
# Dead peers whose link is down: the ignored tests of tests/liveness.rs,
# run in a network namespace of their own (the server's, 10.78.0.1) joined
# by a veth pair to another (the clients', 10.78.0.2), whose end the tests
# set down to cut a client off. The other liveness tests (a stopped
# client) run in plain `cargo test`.
#
# Installs iproute2 with apt-get when missing. Needs root. Both namespaces
# are removed on exit, with any process still in them. Time: ~10 s after
# the build.
#
# Usage: tests/liveness/run.sh [TEST NAME FILTER]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."

log() { printf '[liveness] %s\n' "$*"; }
die() {
  printf '[liveness] ERROR: %s\n' "$*" >&2
  exit 1
}

[[ "$(id -u)" == 0 ]] || die "needs root (ip netns add)"
if ! command -v ip >/dev/null; then
  log "installing iproute2 (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null ||
    die "cannot install iproute2"
fi

log "building the tests (cargo test --test liveness --no-run)"
test_bin="$(cargo test --test liveness --no-run --message-format=json-render-diagnostics |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
[[ -x "$test_bin" ]] || die "cargo named no test binary"

server="wsl-$$-server"
clients="wsl-$$-clients"
source "$here/../multihost/netns.sh"
trap 'netns_remove "$server" "$clients"' EXIT
log "making namespaces $server (10.78.0.1) and $clients (10.78.0.2)"
ip netns add "$server"
ip netns add "$clients"
ip -n "$server" link add veth0 type veth peer name veth0 netns "$clients"
ip -n "$server" addr add 10.78.0.1/24 dev veth0
ip -n "$clients" addr add 10.78.0.2/24 dev veth0
for ns in "$server" "$clients"; do
  ip -n "$ns" link set veth0 up
  ip -n "$ns" link set lo up
done

log "running tests/liveness.rs in $server"
# One test at a time: they share the clients' link, and one test setting it
# up again at its end would bring the other's dead client back to life.
WSPUSH_LIVENESS_NETNS="$clients" WSPUSH_LIVENESS_LISTEN=10.78.0.1:0 \
  ip netns exec "$server" "$test_bin" --ignored --skip client_process \
  --test-threads=1 "$@"
