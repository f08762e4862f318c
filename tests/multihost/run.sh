#!/usr/bin/env bash
# wspush on separate hosts fed through Redis: network namespaces joined by a
# bridge (netns.sh): redis-server (Debian's package) in one, a wspush in each
# of three (started by the tests), and the test process, with its clients
# and publisher, in the last.
#
# The checks are the ignored tests of cli/tests/multihost.rs, run inside the
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

source "$here/netns.sh"
netns_need_tools || die "cannot install redis-server and iproute2"
redis_server="$(command -v redis-server)"

log "building the tests (cargo test -p wspush-cli --test multihost --no-run)"
# The test binary's artifact (the build may also name the wspush binary).
test_bin="$(cargo test -p wspush-cli --test multihost --no-run --message-format=json-render-diagnostics |
  grep '"name":"multihost"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
[[ -x "$test_bin" ]] || die "cargo named no test binary"

prefix="wsp-$$-"
trap 'netns_down "$prefix"' EXIT
log "making namespaces ${prefix}{redis,h1,h2,h3,clients,lan}"
netns_up "$prefix"

log "running cli/tests/multihost.rs in ${prefix}clients"
WSPUSH_NETNS_PREFIX="$prefix" WSPUSH_REDIS_SERVER="$redis_server" \
  ip netns exec "${prefix}clients" "$test_bin" --ignored --test-threads 1 "$@"
