#!/usr/bin/env bash
# Autobahn|Testsuite conformance run for wspush (cases 1.* .. 10.*, and 12.*
# and 13.* with permessage-deflate: 517 cases).
#
# Installs the original Autobahn|Testsuite (Python 2.7 only) once into a cache
# outside the source tree: a private CPython 2.7.18 unpacked from Debian
# bullseye's .debs (apt-get download with a private apt state; no system-wide
# change), then pip/Twisted/autobahntestsuite from PyPI pinned by
# constraints-py27.txt. Builds wspush in release mode, starts it in --echo mode
# on loopback, runs `wstest -m fuzzingclient`, prints per-behavior counts and
# every case that is not OK/INFORMATIONAL, and exits non-zero if there is any
# such case (NON-STRICT, UNCLEAN, UNIMPLEMENTED, FAILED...) or if the number of
# cases run is not 517. Reports (index.json + html): target/autobahn/report
# and target/autobahn/report-2, one per wstest process (see the shards below).
#
# Time: the one-time install ~30 s here (up to ~1.5 min on a slow network;
# ~125 MB in the cache); then a full run ~6.5 min (two wstest processes at
# once), plus the cargo build.
#
# Environment:
#   WSPUSH_AUTOBAHN_HOME        install cache   (default ~/.cache/wspush-autobahn)
#   WSPUSH_AUTOBAHN_PORT        port on 127.0.0.1 (default 9001, else a free one)
#   WSPUSH_AUTOBAHN_SERVER_CMD  server command line instead of the release
#                               wspush; "{PORT}" in it is replaced by the port
#                               (also exported as WSPUSH_AUTOBAHN_PORT); it must
#                               listen on 127.0.0.1:PORT and echo messages
#   WSPUSH_AUTOBAHN_CASES       e.g. "1.*,9.1.1": run only these (skips the
#                               517-case check)
#   WSPUSH_AUTOBAHN_REPORT_DIR  report dir       (default target/autobahn/report)
#   WSPUSH_AUTOBAHN_TIMEOUT     seconds for wstest (default 1200)
#   WSPUSH_AUTOBAHN_APT_MIRROR  Debian mirror for bullseye (default: the
#                               system's Debian mirror from /etc/apt/sources*)
#   WSPUSH_AUTOBAHN_INSTALL_ONLY=1  install (or check) the suite and stop
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

if [[ -z "${HOME:-}" ]]; then
  HOME="$(getent passwd "$(id -u)" | cut -d: -f6)"
  export HOME
fi
ab_home="${WSPUSH_AUTOBAHN_HOME:-$HOME/.cache/wspush-autobahn}"
mkdir -p "$ab_home"
ab_home="$(cd "$ab_home" && pwd)"
expected_cases=517

log() { printf '[autobahn] %s\n' "$*"; }
die() {
  printf '[autobahn] ERROR: %s\n' "$*" >&2
  exit 1
}

# ---------------------------------------------------------------- install --

# Debian bullseye packages that make up a private CPython 2.7.18.
debs=(python2.7-minimal libpython2.7-minimal libpython2.7-stdlib python2.7 libpython2.7
  python2.7-dev libpython2.7-dev libssl1.1 libffi7)
pip_whl="pip-20.3.4-py2.py3-none-any.whl"
pip_whl_sha256="217ae5161a0e08c0fb873858806e3478c9775caffce5168b50ec885e358c199d"
constraints="$here/constraints-py27.txt"
# Changing any of these forces a reinstall of the cache.
stamp="wspush-autobahn v1; bullseye: ${debs[*]}; constraints: $(sha256sum "$constraints" | cut -d' ' -f1)"

py_root="$ab_home/py27"
py2="$ab_home/bin/python2.7"
# Debian's python2.7 installs pip's scripts under <prefix>/local/bin.
wstest="$py_root/usr/local/bin/wstest"
marker="$ab_home/.installed"

# The system's Debian mirror (the one serving its own codename, not -security).
detect_mirror() {
  local codename f
  codename="$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")"
  {
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [[ -r "$f" ]] || continue
      awk -v cn="$codename" '
        $1 == "deb" {
          i = 2
          if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
          if ($(i + 1) == cn && $i !~ /security/) { print $i; exit }
        }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
      [[ -r "$f" ]] || continue
      awk -v cn="$codename" '
        BEGIN { RS = ""; FS = "\n" }
        {
          types = ""; uris = ""; suites = ""; enabled = "yes"
          for (i = 1; i <= NF; i++) {
            line = $i
            if (line ~ /^[ \t]*#/) continue
            if (line ~ /^Types:/)   { sub(/^Types:[ \t]*/, "", line);   types = " " line " " }
            if (line ~ /^URIs:/)    { sub(/^URIs:[ \t]*/, "", line);    uris = line }
            if (line ~ /^Suites:/)  { sub(/^Suites:[ \t]*/, "", line);  suites = " " line " " }
            if (line ~ /^Enabled:/) { sub(/^Enabled:[ \t]*/, "", line); enabled = line }
          }
          if (types ~ / deb / && suites ~ (" " cn " ") && enabled != "no") {
            n = split(uris, u, /[ \t]+/)
            for (j = 1; j <= n; j++) if (u[j] != "" && u[j] !~ /security/) { print u[j]; exit }
          }
        }' "$f"
    done
  } 2>/dev/null | head -n1 || true
}

multiarch_of() {
  case "$1" in
    amd64) echo x86_64-linux-gnu ;;
    arm64) echo aarch64-linux-gnu ;;
    i386) echo i386-linux-gnu ;;
    *) die "unsupported architecture $1" ;;
  esac
}

write_python_wrapper() {
  local triplet="$1"
  mkdir -p "$ab_home/bin"
  cat >"$py2" <<EOF
#!/bin/sh
# Private CPython 2.7.18 (Debian bullseye build) for the Autobahn|Testsuite.
R='$py_root'
unset PYTHONPATH PYTHONSTARTUP
export PYTHONHOME="\$R/usr" PYTHONNOUSERSITE=1
export LD_LIBRARY_PATH="\$R/usr/lib/$triplet:\$R/lib/$triplet\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "\$R/usr/bin/python2.7" "\$@"
EOF
  chmod +x "$py2"
}

install_suite() {
  local mirror arch triplet apt_dir apt_opts d
  log "installing Autobahn|Testsuite into $ab_home (one time, ~0.5-1.5 min)"
  # Only our own sub-directories: WSPUSH_AUTOBAHN_HOME may be a shared dir.
  rm -rf "$marker" "$ab_home/apt" "$ab_home/debs" "$py_root" "$ab_home/bin" \
    "$ab_home/wheels" "$ab_home/pip-cache"

  # 1. CPython 2.7 from Debian bullseye, with a private apt state.
  command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
    die "apt-get and dpkg are needed to fetch Python 2.7"
  arch="$(dpkg --print-architecture)"
  triplet="$(multiarch_of "$arch")"
  mirror="${WSPUSH_AUTOBAHN_APT_MIRROR:-$(detect_mirror)}"
  mirror="${mirror:-http://deb.debian.org/debian}"
  log "Debian mirror: $mirror (suite bullseye, arch $arch)"
  apt_dir="$ab_home/apt"
  mkdir -p "$apt_dir/state/lists/partial" "$apt_dir/cache/archives/partial" \
    "$apt_dir/etc/preferences.d" "$apt_dir/etc/trusted.gpg.d" "$ab_home/debs"
  : >"$apt_dir/state/status"
  local signed_by=""
  if [[ -r /usr/share/keyrings/debian-archive-keyring.gpg ]]; then
    signed_by="[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
  fi
  printf 'deb %s%s bullseye main\n' "$signed_by" "$mirror" >"$apt_dir/etc/sources.list"
  apt_opts=(
    -o "Dir::State=$apt_dir/state"
    -o "Dir::State::status=$apt_dir/state/status"
    -o "Dir::Cache=$apt_dir/cache"
    -o "Dir::Etc::SourceList=$apt_dir/etc/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::Etc::Preferences=/dev/null"
    -o "Dir::Etc::PreferencesParts=$apt_dir/etc/preferences.d"
    -o "APT::Architecture=$arch"
    -o "APT::Architectures=$arch"
    -o "APT::Sandbox::User=root"
    -o "Acquire::Languages=none"
    -o "Acquire::Retries=3"
    -o "Acquire::Check-Valid-Until=false"
    -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::CNF::DefaultEnabled=false"
  )
  if [[ -z "$signed_by" ]]; then
    apt_opts+=(-o "Dir::Etc::Trusted=/etc/apt/trusted.gpg" -o "Dir::Etc::TrustedParts=/etc/apt/trusted.gpg.d")
  fi
  apt-get "${apt_opts[@]}" -q update
  (cd "$ab_home/debs" && apt-get "${apt_opts[@]}" -q download "${debs[@]}")
  for d in "$ab_home"/debs/*.deb; do
    dpkg -x "$d" "$py_root"
  done
  write_python_wrapper "$triplet"
  if ! "$py2" -c 'import ssl, hashlib, zlib, ctypes, json, pyexpat, select, bz2' 2>/dev/null; then
    "$py2" -c 'import ssl, hashlib, zlib, ctypes, json, pyexpat, select, bz2' || true
    LD_LIBRARY_PATH="$py_root/usr/lib/$triplet" ldd "$py_root"/usr/lib/python2.7/lib-dynload/*.so |
      grep 'not found' | sort -u >&2 || true
    die "the private Python 2.7 is missing system libraries (see above)"
  fi
  log "$("$py2" -c 'import sys, ssl; print("Python %s, %s" % (sys.version.split()[0], ssl.OPENSSL_VERSION))')"

  # 2. pip, then the suite, from PyPI; everything pinned by the constraints file.
  unset PIP_REQUIRE_VIRTUALENV PIP_USER PIP_TARGET PIP_PREFIX
  export PIP_CACHE_DIR="$ab_home/pip-cache" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_PYTHON_VERSION_WARNING=1
  # pip 20.3's vendored certifi is from 2020: prefer the system's CA bundle.
  if [[ -z "${PIP_CERT:-}" && -r /etc/ssl/certs/ca-certificates.crt ]]; then
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt
  fi
  mkdir -p "$ab_home/wheels"
  "$py2" "$here/abtool.py" pypi-fetch pip 20.3.4 "$pip_whl" "$pip_whl_sha256" \
    "$ab_home/wheels/$pip_whl"
  "$py2" "$ab_home/wheels/$pip_whl/pip" install -q --no-warn-script-location \
    --no-index "$ab_home/wheels/$pip_whl"
  local pip=("$py2" -m pip install -q --no-warn-script-location -c "$constraints")
  "${pip[@]}" setuptools==44.0.0 wheel==0.36.2
  "${pip[@]}" incremental==16.10.1 pyOpenSSL==19.1.0 cryptography==3.3.2
  # C extensions (Twisted, wsaccel, ujson...) build against the unpacked headers;
  # pyconfig.h includes <x86_64-linux-gnu/python2.7/pyconfig.h>, hence usr/include.
  export CFLAGS="-I$py_root/usr/include -I$py_root/usr/include/python2.7${CFLAGS:+ $CFLAGS}"
  "${pip[@]}" --no-build-isolation Twisted==19.10.0
  "${pip[@]}" --no-build-isolation autobahntestsuite==25.10.1
  "$py2" -m pip check
  "$py2" "$wstest" --help >/dev/null
  rm -rf "$ab_home/apt" # apt lists: only needed to download the .debs
  printf '%s\n' "$stamp" >"$marker"
  log "Autobahn|Testsuite installed"
}

ensure_suite() {
  mkdir -p "$ab_home"
  exec 9>"$ab_home/.lock"
  flock 9
  # The cache counts only when it still runs: a half-deleted one, or one
  # whose system libraries were removed since, is installed again.
  if [[ -f "$marker" && "$(cat "$marker")" == "$stamp" && -x "$py2" ]] &&
    "$py2" "$wstest" --help >/dev/null 2>&1; then
    log "using cached Autobahn|Testsuite in $ab_home"
  else
    [[ -f "$marker" ]] && log "the cache in $ab_home is stale or broken: installing again"
    local t0=$SECONDS
    (install_suite) # a subshell: its CFLAGS/PIP_* exports stay there
    log "install took $((SECONDS - t0)) s"
  fi
  flock -u 9
  exec 9>&-
}

ensure_suite
if [[ "${WSPUSH_AUTOBAHN_INSTALL_ONLY:-0}" == 1 ]]; then
  exit 0
fi

# ----------------------------------------------------------------- server --

cd "$repo"
out_dir="$repo/target/autobahn"
report_dir="${WSPUSH_AUTOBAHN_REPORT_DIR:-$out_dir/report}"
mkdir -p "$out_dir"

port_is_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

port="${WSPUSH_AUTOBAHN_PORT:-}"
if [[ -z "$port" ]]; then
  if port_is_free 9001; then
    port=9001
  else
    port="$("$py2" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  fi
fi
port_is_free "$port" || die "port $port on 127.0.0.1 is already in use"
export WSPUSH_AUTOBAHN_PORT="$port"

if [[ -n "${WSPUSH_AUTOBAHN_SERVER_CMD:-}" ]]; then
  server_cmd="${WSPUSH_AUTOBAHN_SERVER_CMD//\{PORT\}/$port}"
else
  log "building wspush (cargo build --release --bin wspush)"
  cargo build --release --bin wspush
  target_dir="$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
  target_dir="${target_dir:-${CARGO_TARGET_DIR:-$repo/target}}"
  server_bin="$target_dir/release/wspush"
  [[ -x "$server_bin" ]] || die "no server binary at $server_bin"
  server_cmd="$(printf '%q' "$server_bin") --listen 127.0.0.1:$port --echo --max-message-bytes 16777216"
fi

# Alive and not a zombie.
alive() {
  kill -0 "$1" 2>/dev/null && [[ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" != Z ]]
}

server_pid=""
stop_server() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.1
    done
    if alive "$server_pid"; then kill -9 "$server_pid" 2>/dev/null || true; fi
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=""
}
trap stop_server EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

server_log="$out_dir/server.log"
log "starting server: $server_cmd"
bash -c "exec $server_cmd" </dev/null >"$server_log" 2>&1 &
server_pid=$!

for i in $(seq 300); do
  if ! alive "$server_pid"; then
    tail -n 30 "$server_log" >&2 || true
    die "server exited before listening on 127.0.0.1:$port (log: $server_log)"
  fi
  if ! port_is_free "$port"; then
    break
  fi
  [[ $i -lt 300 ]] || die "server did not listen on 127.0.0.1:$port within 30 s"
  sleep 0.1
done
log "server (pid $server_pid) is listening on 127.0.0.1:$port"

# ----------------------------------------------------------------- wstest --

# Two wstest processes against the one server, in parallel (wstest is one
# Python thread, and it spends most of the compression cases' minutes
# compressing and inflating): 1-10, 12.1-12.4 and 13.1 in one, 12.5 and
# 13.2-13.7 in the other, about 6.5 min of cases each. With
# WSPUSH_AUTOBAHN_CASES, one process runs those.
if [[ -n "${WSPUSH_AUTOBAHN_CASES:-}" ]]; then
  log "restricted to cases: $WSPUSH_AUTOBAHN_CASES (517-case check skipped)"
  shards=("$WSPUSH_AUTOBAHN_CASES")
  expects=(0)
else
  shards=("1.*,2.*,3.*,4.*,5.*,6.*,7.*,8.*,9.*,10.*,12.1.*,12.2.*,12.3.*,12.4.*,13.1.*"
    "12.5.*,13.2.*,13.3.*,13.4.*,13.5.*,13.6.*,13.7.*")
  expects=(391 126)
  ((expects[0] + expects[1] == expected_cases)) || die "bug: the shards do not add up to $expected_cases cases"
fi
rm -rf "$report_dir" "$report_dir"-*
mkdir -p "$report_dir"
report_dir="$(cd "$report_dir" && pwd)"
log "running wstest -m fuzzingclient, ${#shards[@]} at once (logs: $out_dir/wstest-*.log)"
t0=$SECONDS
pids=()
for i in "${!shards[@]}"; do
  dir="$report_dir"
  ((i == 0)) || dir="$report_dir-$((i + 1))"
  mkdir -p "$dir"
  spec="$out_dir/fuzzingclient-$((i + 1)).json"
  "$py2" "$here/abtool.py" spec "$here/fuzzingclient.json" "$spec" \
    --url "ws://127.0.0.1:$port" --outdir "$dir" --cases "${shards[$i]}"
  (cd "$out_dir" && timeout --kill-after=30 "${WSPUSH_AUTOBAHN_TIMEOUT:-1200}" \
    "$py2" "$wstest" -m fuzzingclient -s "$spec") \
    >"$out_dir/wstest-$((i + 1)).log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  if [[ $rc -ne 0 ]]; then
    tail -n 30 "$out_dir/wstest-$((i + 1)).log" >&2 || true
    log "wstest ${shards[$i]} exited with $rc"
    status=1
  fi
done
log "wstest finished in $((SECONDS - t0)) s"

if ! alive "$server_pid"; then
  tail -n 30 "$server_log" >&2 || true
  log "the server died during the run (log: $server_log)"
  status=1
fi
stop_server

for i in "${!shards[@]}"; do
  dir="$report_dir"
  ((i == 0)) || dir="$report_dir-$((i + 1))"
  log "cases ${shards[$i]}:"
  "$py2" "$here/abtool.py" summary "$dir/index.json" --expect "${expects[$i]}" || status=1
  log "HTML report: $dir/index.html"
done
exit "$status"
