# Shared by tools/quickstart and tools/run-tests (sourced, not run).
#
# Root or not: as root, apt-get runs directly; otherwise through sudo; with
# neither, the script stops with one line saying so. Packages are installed
# only when missing (then after one apt-get update), with
# --no-install-recommends. Python tooling goes into .venv at the top of the
# clone (python3 -m venv, then pip installs the pinned uv, which installs
# the rest with -c upper-constraints.txt).

set -euo pipefail

TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$TOP"
VENV=$TOP/.venv
UV_VERSION=$(sed -n 's/^uv==//p' "$TOP/tools/requirements.txt")
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
STARTED=$(date +%s)
APT_UPDATED=0

say() { echo "$PROG: $*"; }
die() { echo "$PROG: error: $*" >&2; exit 1; }
elapsed() { echo "$(( $(date +%s) - STARTED )) s"; }

is_root() { [ "$(id -u)" = 0 ]; }

# AS_ROOT: the prefix that runs a command as root ("" or "sudo"). Neither
# root nor sudo: NO_ROOT says what to do, and apt_install stops with it
# when a package is missing (with everything installed, nothing needs root).
AS_ROOT=()
NO_ROOT=
choose_root_prefix() {
  if is_root; then
    AS_ROOT=()
  elif command -v sudo >/dev/null 2>&1; then
    AS_ROOT=(sudo env DEBIAN_FRONTEND=noninteractive)
  else
    NO_ROOT="installing packages needs root or sudo: run this as root, or"
    NO_ROOT="$NO_ROOT install sudo and allow this user to use it ($1)"
  fi
}

# missing_packages PKG...: those not installed, on one line.
missing_packages() {
  local pkg out=()
  for pkg in "$@"; do
    if [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != \
         "install ok installed" ]; then
      out+=("$pkg")
    fi
  done
  echo "${out[*]:-}"
}

# apt_install PKG...: install the missing ones (apt-get update first).
apt_install() {
  local missing log
  command -v apt-get >/dev/null 2>&1 ||
    die "no apt-get: this script knows Debian and Ubuntu only (install" \
        "$* by hand)"
  missing=$(missing_packages "$@")
  if [ -z "$missing" ]; then
    return 0
  fi
  if [ -n "$NO_ROOT" ]; then
    die "$missing missing; $NO_ROOT"
  fi
  log=$(mktemp /tmp/prealloc-apt.XXXXXX)
  if [ "$APT_UPDATED" = 0 ]; then
    say "apt-get update"
    if ! "${AS_ROOT[@]}" apt-get update -q >"$log" 2>&1; then
      cat "$log" >&2
      die "apt-get update failed"
    fi
    APT_UPDATED=1
  fi
  say "apt-get install -y --no-install-recommends $missing"
  # shellcheck disable=SC2086
  if ! "${AS_ROOT[@]}" apt-get install -y -q --no-install-recommends \
      $missing >"$log" 2>&1; then
    cat "$log" >&2
    die "apt-get install failed"
  fi
  rm -f "$log"
}

# ensure_venv: .venv with pip and the pinned uv. Debian and Ubuntu ship
# python3's venv module (ensurepip) in python3-venv.
ensure_venv() {
  if ! command -v python3 >/dev/null 2>&1; then
    apt_install python3 python3-venv
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
      rm -rf "$VENV"
      apt_install python3-venv
      python3 -m venv "$VENV"
    fi
    say "made $VENV ($("$VENV/bin/python" --version))"
  fi
  if [ "$("$VENV/bin/uv" --version 2>/dev/null | awk '{print $2}')" != \
       "$UV_VERSION" ]; then
    say "pip install uv==$UV_VERSION into $VENV"
    "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION"
  fi
}

# uv_install ARGS...: uv pip install into .venv, pinned by
# upper-constraints.txt.
uv_install() {
  "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" \
    -c "$TOP/upper-constraints.txt" "$@"
}

# run_stoppable FILE CMD...: run CMD, its stdout into FILE (- : this
# script's own stdout, not reopened), so that the
# first SIGINT or SIGTERM this script gets stops it: CMD runs in the
# background (bash runs a trap only once its foreground command ends) and
# the signal is sent on to it as SIGTERM (a background job of a script
# ignores SIGINT: one that comes before CMD sets its own handler would be
# lost), then CMD is waited for. Sets RUN_STATUS (CMD's exit status) and
# RUN_STOPPED (130 after a SIGINT, 143 after a SIGTERM, the first one
# received; empty without one): the caller exits with it. The signal goes
# to CMD and to every process under it.
# tree_pids PID: PID and every descendant of it, parents first (read from
# /proc: procps is not on every machine).
tree_pids() {
  local table frontier next p
  table=$(for stat in /proc/[0-9]*/stat; do
            cat "$stat" 2>/dev/null && echo
          done | sed -n 's/^\([0-9]*\) .*) [A-Za-z] \([0-9]*\) .*/\1 \2/p')
  frontier=$1
  echo "$1"
  while [ -n "$frontier" ]; do
    next=
    for p in $frontier; do
      next="$next $(echo "$table" | awk -v p="$p" '$2 == p {print $1}')"
    done
    frontier=$(echo $next)
    [ -z "$frontier" ] || echo "$frontier"
  done
}

# _stop_tree STATUS PID: a stop: RUN_STOPPED (first signal wins) and
# SIGTERM to PID and every process under it (tox does not stop the tests
# it started; GNU timeout passes the signal on to its command's group).
_stop_tree() {
  # A second signal changes nothing: the stop is under way.
  [ -z "$RUN_STOPPED" ] || return 0
  RUN_STOPPED=$1
  # shellcheck disable=SC2046 # one PID a word, on purpose
  kill -TERM $(tree_pids "$2") 2>/dev/null || true
}

run_stoppable() {
  local file=$1 pid
  shift
  if [ "$file" = - ]; then
    "$@" &
  else
    "$@" > "$file" &
  fi
  pid=$!
  RUN_STOPPED=
  # shellcheck disable=SC2064 # $pid now, on purpose
  trap "_stop_tree 130 $pid" INT
  # shellcheck disable=SC2064
  trap "_stop_tree 143 $pid" TERM
  RUN_STATUS=0
  while :; do
    wait "$pid" && RUN_STATUS=0 || RUN_STATUS=$?
    # wait returns early when a trapped signal comes: wait again.
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - INT TERM
}

# root_path DIR: DIR and every directory above it are directories (no
# link) owned by root that no one else can change (writable by others only
# with the sticky bit, as /tmp and /var/tmp).
root_path() {
  local dir=$1 mode
  case "$dir" in /*) ;; *) return 1 ;; esac
  while :; do
    [ -d "$dir" ] && [ ! -L "$dir" ] || return 1
    [ "$(stat -c %u "$dir")" = 0 ] || return 1
    mode=$(stat -c %a "$dir")
    if [ $((8#$mode & 8#022)) -ne 0 ] && [ $((8#$mode & 8#1000)) -eq 0 ]; then
      return 1
    fi
    [ "$dir" != / ] || return 0
    dir=$(dirname "$dir")
  done
}
