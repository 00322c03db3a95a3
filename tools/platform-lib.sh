# Shared by tools/platform-up, platform-run and platform-down (sourced
# after common.sh): the second platform, a Debian root of the other
# generation than the machine's (trixie: QEMU 10, libvirt 11, on a
# bookworm machine; bookworm: QEMU 7.2, libvirt 9.0, on a trixie one),
# under /var/tmp.
#
# Layout ($PLATFORM_DIR, default /var/tmp/prealloc-platform):
#   trixie/ (bookworm/) the root (cached: platform-up rebuilds it only when
#                       its package list or suite changed, see STAMP)
#   trixie/srv/prealloc a copy of this checkout (its own .venv, .tox,
#                       .stestr: the machine's are never shared)
#   state/              the holder's PID, what platform-up installed on the
#                       machine, the holder's log
#
# The holder: a process in new mount and PID namespaces (unshare) whose
# mounts are the root's /proc, /dev, /sys and /run; platform-run enters
# them (nsenter) and chroots. Killing the holder (PID 1 of its namespace)
# ends everything in it and drops every mount with it: nothing is ever
# mounted in the machine's own namespace.

PLATFORM_DIR=${PREALLOC_PLATFORM_DIR:-/var/tmp/prealloc-platform}
# The other generation than the machine's: a Debian 13 root (QEMU 10,
# libvirt 11) on a Debian 12 machine (QEMU 7.2, libvirt 9.0) or anything
# else, a Debian 12 root on a Debian 13 one.
case "$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-}")" in
  trixie) default_suite=bookworm ;;
  *) default_suite=trixie ;;
esac
PLATFORM_SUITE=${PREALLOC_PLATFORM_SUITE:-$default_suite}
PLATFORM_MIRROR=${PREALLOC_PLATFORM_MIRROR:-http://deb.debian.org/debian}
PLATFORM_ROOT=$PLATFORM_DIR/$PLATFORM_SUITE
PLATFORM_STATE=$PLATFORM_DIR/state
# Where the checkout's copy sits inside the root.
PLATFORM_SRC=/srv/prealloc
# The packages of the root: QEMU, libvirt and Python (quickstart's and
# run-tests' own installs then find them there), and bindep.txt's default,
# "test" and "real" profiles, so that run-tests inside installs nothing;
# git for pbr's version, ca-certificates for PyPI over HTTPS, procps for
# nova's libvirt driver (it runs uptime; minbase has no procps); for the
# cloud's compute host in the root (tools/cloud-up): sshd and ssh (nova's
# cold migrations copy over SSH), iproute2 and iptables (the host's link
# and its firewall rules are set from inside).
PLATFORM_PACKAGES="qemu-utils qemu-system-x86 libvirt-daemon-system
  libvirt-clients python3 python3-venv python3-dev libvirt-dev pkg-config
  gcc libc6-dev busybox-static util-linux e2fsprogs xfsprogs libxml2-utils
  mount passwd dosfstools rsync sudo git ca-certificates procps
  openssh-server openssh-client iproute2 iptables"
STAMP=$PLATFORM_ROOT/.prealloc-platform
HOLDER_PID=$PLATFORM_STATE/holder.pid

# The stamp: line 1 what the root was made from (a change: a new root),
# line 2 its packages (a change: the missing ones installed in it).
platform_stamp() {
  echo "suite=$PLATFORM_SUITE mirror=$PLATFORM_MIRROR"
  echo "packages=$(echo $PLATFORM_PACKAGES)"
}

# holder_pid: the holder's PID (PID 1 of its namespace, seen from here)
# when it still runs, else fails.
holder_pid() {
  local pid
  [ -s "$HOLDER_PID" ] || return 1
  pid=$(tr -dc '0-9' <"$HOLDER_PID")
  [ -n "$pid" ] || return 1
  # The holder is the reaper of its PID namespace (platform-up), with the
  # root as its root directory.
  [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$PLATFORM_ROOT" ] ||
    return 1
  echo "$pid"
}

# in_platform CMD...: CMD inside the root, in the holder's namespaces, as
# root, with a plain environment: PREALLOC_PLATFORM=1 (.ci/libvirt-up
# reads it), CI, and the machine's certificate bundle
# variables (the same paths inside: platform-up adds the machine's CAs to
# the root's bundle) passed on.
in_platform() {
  local pid
  pid=$(holder_pid) || die "the platform is not up: run tools/platform-up"
  nsenter --target "$pid" --mount --pid --root --wd -- \
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" ${CI:+CI=$CI} \
    PREALLOC_PLATFORM=1 \
    ${SSL_CERT_FILE:+SSL_CERT_FILE=$SSL_CERT_FILE} \
    ${SSL_CERT_DIR:+SSL_CERT_DIR=$SSL_CERT_DIR} \
    ${PIP_CERT:+PIP_CERT=$PIP_CERT} \
    ${REQUESTS_CA_BUNDLE:+REQUESTS_CA_BUNDLE=$REQUESTS_CA_BUNDLE} \
    "$@"
}

# platform_sync: copy this checkout into the root's /srv/prealloc. The
# copy's own virtualenvs, tox envs and stestr history stay (rsync leaves
# excluded files alone); build output is not copied. Its .git is a
# repository of its own with this checkout's HEAD fetched into it (pbr
# reads the version from git; a worktree's .git file points outside the
# root); the index is HEAD's, the files are this checkout's, uncommitted
# changes included.
platform_sync() {
  local dst=$PLATFORM_ROOT$PLATFORM_SRC
  say "copying this checkout into $dst"
  mkdir -p "$dst"
  rsync -a --delete --exclude=/.git --exclude=/.venv --exclude=/.tox \
    --exclude=/.stestr --exclude='*.egg-info' --exclude=/doc/build \
    --exclude=/releasenotes/build --exclude=__pycache__ \
    "$TOP/" "$dst/"
  # The copy's own egg-info (setuptools' metadata of an editable install)
  # is kept by --delete as excluded: stale, it names old entry points,
  # which importlib.metadata finds before the installed ones.
  find "$dst" -maxdepth 2 -name '*.egg-info' -prune -exec rm -rf {} +
  if [ ! -d "$dst/.git" ]; then
    rm -f "$dst/.git"
    git init -q "$dst"
  fi
  git --git-dir="$dst/.git" fetch -q "$TOP" HEAD
  git --git-dir="$dst/.git" --work-tree="$dst" reset -q FETCH_HEAD
}
