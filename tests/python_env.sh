# Sourced by the scripts whose checks are written in Python: makes (once,
# outside the source tree) a virtual environment with PyJWT, cryptography
# and websockets, pinned here, and sets `venv` to it. Installs
# python3-venv with apt-get (as root) when missing. Fails, never skips.
#
# Environment:
#   WSPUSH_PYJWT_HOME  the virtual environment (default ~/.cache/wspush-pyjwt)
#
# Needs `log` and `die` from the sourcing script.

pyjwt_version=2.10.1
cryptography_version=44.0.2
websockets_version=15.0.1
home_dir="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
venv="${WSPUSH_PYJWT_HOME:-$home_dir/.cache/wspush-pyjwt}"

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
