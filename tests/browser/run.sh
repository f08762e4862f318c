#!/usr/bin/env bash
# The served client alone, then wspush against independent clients, on
# 127.0.0.1 servers it starts itself:
#   client.test.mjs  wspush.js in Node with a stand-in WebSocket and timers
#                  (node --test): 1,000 clients' reconnects spread, and a
#                  gap status handed on with both its ends;
#   e2e.mjs        headless Chromium driven by playwright-core: the --demo
#                  page, three tabs, channels and upstream, permessage-deflate,
#                  SIGINT's 1001, a drain's 1012 and hint, --allow-origin, --token-file, heartbeats;
#   ws_client.mjs  Node's ws client, whose permessage-deflate is C zlib's:
#                  what is negotiated, 200 broadcasts and --echo up to 1 MB,
#                  each message equal and the big ones compressed on the wire.
# Both import harness.mjs: setUp, the Wspush server class, check() with its
# PASS/FAIL lines, timeouts and server logs, and finish()'s summary and exit.
#
# Installs what is missing: Debian's chromium, and nodejs and npm (apt-get, as
# root), then playwright-core and ws (pinned below) from npm into a cache
# outside the source tree. Builds wspush in release mode. Runs both scripts
# (the second even if the first fails) and fails if either does. Fails, never
# skips, when any of it cannot be had. Time: ~15 s after the build (about 1 s
# of it ws_client.mjs); a first install adds a minute or two for apt-get and a
# few seconds for npm.
#
# Environment:
#   WSPUSH_BROWSER_HOME  cache for the npm packages (default ~/.cache/wspush-browser)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."

playwright_version=1.65.1
ws_version=8.23.0
chromium=/usr/bin/chromium
home_dir="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
cache="${WSPUSH_BROWSER_HOME:-$home_dir/.cache/wspush-browser}"

log() { printf '[browser] %s\n' "$*"; }
die() {
  printf '[browser] ERROR: %s\n' "$*" >&2
  exit 1
}

# ---------------------------------------------------------------- install --

packages=()
[[ -x "$chromium" ]] || packages+=(chromium)
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
if ((${#packages[@]})); then
  [[ "$(id -u)" == 0 ]] || die "need ${packages[*]}: run as root, or apt-get install -y ${packages[*]}"
  log "installing ${packages[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  apt-get install -y -qq "${packages[@]}" >/dev/null || die "apt-get install ${packages[*]} failed"
fi
[[ -x "$chromium" ]] || die "no $chromium after installing chromium"
node_major="$(node --version | sed 's/^v\([0-9]*\).*/\1/')"
((node_major >= 18)) || die "node $(node --version) is too old: playwright-core needs 18 or later"

modules="$cache/node_modules"
npm_packages=("playwright-core@$playwright_version" "ws@$ws_version")
for spec in "${npm_packages[@]}"; do
  name="${spec%@*}"
  installed="$(node -p "require('$modules/$name/package.json').version" 2>/dev/null || true)"
  if [[ "$installed" != "${spec##*@}" ]]; then
    # All of them in one install: npm may prune what it is not asked for.
    log "installing ${npm_packages[*]} into $cache (npm)"
    mkdir -p "$cache"
    npm install --prefix "$cache" --no-save --no-audit --no-fund --loglevel=error \
      "${npm_packages[@]}" || die "npm install ${npm_packages[*]} failed"
    break
  fi
done

# ------------------------------------------------------------------ build --

log "building wspush (cargo build --release --bin wspush)"
bin="$(cargo build --release --bin wspush --message-format=json-render-diagnostics |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
[[ -x "$bin" ]] || die "cargo build named no wspush binary"

# -------------------------------------------------------------------- run --

log "$("$chromium" --version 2>/dev/null), node $(node --version), playwright-core $playwright_version, ws $ws_version"
# Each script bounds itself (e2e.mjs 100 s, ws_client.mjs 60 s) and ends what
# it started; the timeout and the trap are for a run that hangs anyway. Both
# run even if the first fails.
run_pid=
trap '[[ -z "$run_pid" ]] || kill "$run_pid" 2>/dev/null || true' EXIT
run() { # SCRIPT SECONDS
  WSPUSH_BIN="$bin" WSPUSH_CHROMIUM="$chromium" WSPUSH_BROWSER_MODULES="$modules" \
    timeout --kill-after=5 "$2" node "$here/$1" &
  run_pid=$!
  wait "$run_pid"
}
status=0
log "client.test.mjs: the served client, with a stand-in WebSocket (node --test)"
timeout --kill-after=5 30 node --test "$here/client.test.mjs" || status=1
log "e2e.mjs: Chromium"
run e2e.mjs 150 || status=1
log "ws_client.mjs: Node's ws client (C zlib's permessage-deflate)"
run ws_client.mjs 90 || status=1
exit "$status"
