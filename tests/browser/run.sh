#!/usr/bin/env bash
# wspush in a real browser: headless Chromium driven by playwright-core
# against wspush servers on 127.0.0.1 (the checks are in e2e.mjs: the --demo
# page, three tabs, SIGTERM's 1001, --allow-origin, --token-file, heartbeats).
#
# Installs what is missing: Debian's chromium, and nodejs and npm (apt-get, as
# root), then playwright-core (pinned below) from npm into a cache outside the
# source tree. Builds wspush in release mode. Fails, never skips, when any of
# it cannot be had. Time: ~15 s after the build; a first install adds a
# minute or two for apt-get and a few seconds for npm.
#
# Environment:
#   WSPUSH_BROWSER_HOME  cache for playwright-core (default ~/.cache/wspush-browser)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."

playwright_version=1.65.1
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
installed="$(node -p "require('$modules/playwright-core/package.json').version" 2>/dev/null || true)"
if [[ "$installed" != "$playwright_version" ]]; then
  log "installing playwright-core@$playwright_version into $cache (npm)"
  mkdir -p "$cache"
  npm install --prefix "$cache" --no-save --no-audit --no-fund --loglevel=error \
    "playwright-core@$playwright_version" || die "npm install playwright-core failed"
fi

# ------------------------------------------------------------------ build --

log "building wspush (cargo build --release --bin wspush)"
bin="$(cargo build --release --bin wspush --message-format=json-render-diagnostics |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
[[ -x "$bin" ]] || die "cargo build named no wspush binary"

# -------------------------------------------------------------------- run --

log "$("$chromium" --version 2>/dev/null), node $(node --version), playwright-core $playwright_version"
# e2e.mjs bounds itself (100 s) and ends what it started; the timeout and
# the trap are for a run that hangs anyway.
WSPUSH_BIN="$bin" WSPUSH_CHROMIUM="$chromium" WSPUSH_BROWSER_MODULES="$modules" \
  timeout --kill-after=5 150 node "$here/e2e.mjs" &
run_pid=$!
trap 'kill "$run_pid" 2>/dev/null || true' EXIT
wait "$run_pid"
