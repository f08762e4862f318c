#!/usr/bin/env bash
# Signed tokens from an independent signer: Python's PyJWT signs HS256,
# RS256 and ES256 tokens with the test keys (tests/keys/), and Python's
# websockets client presents them to a wspush server it starts
# (tests/tokens/pyjwt_check.py): each algorithm's token is taken, by header
# and by query, and its client gets the messages for its `sub`; an expired
# one and one signed with another algorithm are refused with 401, and so
# is one with a null claim (PyJWT writes None as null).
#
# Installs what is missing: python3-venv (apt-get, as root), then PyJWT,
# cryptography and websockets (pinned below) from PyPI into a virtual
# environment outside the source tree. Builds wspush in release mode. Fails,
# never skips, when any of it cannot be had. Time: ~2 s after the build; a
# first install adds ~10 s.
#
# Environment:
#   WSPUSH_PYJWT_HOME  the virtual environment (default ~/.cache/wspush-pyjwt)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."

pyjwt_version=2.10.1
cryptography_version=44.0.2
websockets_version=15.0.1
home_dir="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
venv="${WSPUSH_PYJWT_HOME:-$home_dir/.cache/wspush-pyjwt}"

log() { printf '[pyjwt] %s\n' "$*"; }
die() {
  printf '[pyjwt] ERROR: %s\n' "$*" >&2
  exit 1
}

command -v python3 >/dev/null || die "python3 is needed"
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  [[ "$(id -u)" == 0 ]] || die "need python3-venv: run as root, or apt-get install -y python3-venv"
  log "installing python3-venv (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null || die "apt-get install python3-venv failed"
fi
wanted="PyJWT==$pyjwt_version cryptography==$cryptography_version websockets==$websockets_version"
if [[ "$(cat "$venv/wspush-wanted" 2>/dev/null)" != "$wanted" ]]; then
  log "installing $wanted into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "python3 -m venv $venv failed"
  # shellcheck disable=SC2086 # the words are the packages
  "$venv/bin/pip" install -q --disable-pip-version-check $wanted || die "pip install failed"
  echo "$wanted" >"$venv/wspush-wanted"
fi

log "building wspush (release)"
cargo build --release -q --bin wspush
WSPUSH_BIN="$PWD/target/release/wspush" WSPUSH_KEYS="$PWD/tests/keys" \
  "$venv/bin/python" "$here/pyjwt_check.py"
