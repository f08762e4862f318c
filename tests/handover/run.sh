#!/usr/bin/env bash
# Handing connections over, checked by independent clients against the
# binary: Python's websockets clients with permessage-deflate across a
# roll of `--processes 2` (tests/handover/deflate_check.py).
#
# Installs what is missing (tests/python_env.sh: python3-venv with apt-get,
# then websockets from PyPI into a virtual environment outside the source
# tree). Builds wspush in release mode. Fails, never skips. Time: ~5 s
# after the build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."

log() { printf '[handover] %s\n' "$*"; }
die() {
  printf '[handover] ERROR: %s\n' "$*" >&2
  exit 1
}

source "$here/../python_env.sh"

log "building wspush (release)"
cargo build --release -q --bin wspush
WSPUSH_BIN="$PWD/target/release/wspush" "$venv/bin/python" "$here/deflate_check.py"
