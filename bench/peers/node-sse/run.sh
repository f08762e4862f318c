#!/usr/bin/env bash
# Usage: run.sh PORT   (standard-input lines go to every stream as events)
set -euo pipefail
exec node "$(dirname "$0")/server.js" "${1:?usage: run.sh PORT}"
