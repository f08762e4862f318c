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
# cryptography and websockets (pinned in tests/python_env.sh) from PyPI
# into a virtual environment outside the source tree. Builds wspush in release mode. Fails,
# never skips, when any of it cannot be had. Time: ~2 s after the build; a
# first install adds ~10 s.
#
# Environment:
#   WSPUSH_PYJWT_HOME  the virtual environment (default ~/.cache/wspush-pyjwt)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."

log() { printf '[pyjwt] %s\n' "$*"; }
die() {
  printf '[pyjwt] ERROR: %s\n' "$*" >&2
  exit 1
}

source "$here/../python_env.sh"

log "building wspush (release)"
cargo build --release -q --bin wspush
WSPUSH_BIN="$PWD/target/release/wspush" WSPUSH_KEYS="$PWD/tests/keys" \
  "$venv/bin/python" "$here/pyjwt_check.py"
