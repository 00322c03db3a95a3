# Shared by tools/cloud-up, tools/cloud-tempest and tools/cloud-down
# (sourced after tools/common.sh, not run): where the one-box cloud lives
# and how its processes are started and stopped.
#
# Everything the cloud writes is under CLOUD_DIR (default
# /var/tmp/prealloc-cloud, PREALLOC_CLOUD_DIR to change it; not under a
# directory only root can enter: nova-compute runs as the nova user and
# QEMU as libvirt-qemu, and both must reach it):
#
#   venv/          the services' virtualenv (Debian's /usr/bin/python3, so
#                  that every user can execute it)
#   tempest-venv/  Tempest and the plugin's Tempest tests
#   etc/           generated configuration (root-owned; nova-compute's is
#                  etc/nova/nova.conf, read by the nova group)
#   run/           PID files ("PID STARTTIME", see record_pid), sockets
#   state/         what cloud-up changed outside CLOUD_DIR, to put back
#   log/           one log per service
#   data/          MariaDB, RabbitMQ, Glance's images; data/hosts/N/ each
#                  compute host's own files (instances, nova's state, the
#                  nova user's home with its SSH keys, libvirt's state,
#                  configuration and logs, sshd's keys)
#   tempest/       the Tempest workspace (etc/tempest.conf, .stestr)
#
# The compute hosts (COMPUTE_HOSTS of them, 2 unless cloud-up --hosts 1):
# host N is a network, mount and UTS namespace held open by one process
# (service ns-N), joined to the run's private link, a bridge in the
# machine's own network namespace, by a veth pair. In its mount namespace
# its own directories are bound over the paths a compute host has
# (/etc/libvirt, /var/lib/libvirt, ..., CLOUD_DIR/etc/nova, the instances
# path, the nova user's home) and /run is a tmpfs of its own: every host
# sees the same paths with its own files, as on separate machines. Its
# services (virtlogd, libvirtd, sshd, nova-compute, and what they start)
# run inside; tools/cloud-host runs a command there.
#
# Changed outside CLOUD_DIR while the cloud runs, and put back by
# cloud-down: /etc/sudoers.d/prealloc-cloud (the daemon's sudo rule), the
# nova system user (created when missing, with group libvirt and a shell
# for the migrations' SSH; an existing one gets both, then its own back),
# /dev/kvm's group and mode (where no udev set them), the link's bridge.

CLOUD_DIR=${PREALLOC_CLOUD_DIR:-/var/tmp/prealloc-cloud}
CLOUD_USER=${PREALLOC_CLOUD_USER:-nova}
SUDOERS_FILE=/etc/sudoers.d/prealloc-cloud
LIBVIRT_URI=qemu:///system
MAX_HOSTS=2

# The run's private link: link-local addresses (169.254.0.0/16, never
# routed), a bridge holding the control services' address, one veth pair
# per compute host. What the compute hosts reach (RabbitMQ, the APIs)
# listens there; MariaDB on 127.0.0.1 only.
LINK_BRIDGE=prealloc-br0
LINK_PREFIX=169.254.77
CTL_IP=$LINK_PREFIX.1
# host_ip N, host_name N: compute host N's address and name.
host_ip() { echo "$LINK_PREFIX.$((10 + $1))"; }
host_name() { echo "prealloc-cloud-$1"; }
# The fleet mid-upgrade (issue 46): compute host 2 runs the other Debian
# generation than the machine's, in the root tools/platform-up makes (on
# Debian 12, Debian 13's QEMU 10, libvirt 11 and Python 3.13; on Debian 13,
# Debian 12's), chrooted inside its namespaces, with nova-compute and the
# plugin installed there from the same pins (PLATFORM_VENV, bound over
# CLOUD_VENV in its mount namespace); host 1 stays on the machine's own.
# PREALLOC_CLOUD_MIXED=0: both hosts on the machine's generation.
# shellcheck source=tools/platform-lib.sh
. "$TOP/tools/platform-lib.sh"
# cloud-up decides it (one host: one generation) and records it in
# STATE_DIR/mixed, which the other tools read while the cloud is up.
CLOUD_MIXED=${PREALLOC_CLOUD_MIXED:-1}
# The cloud's virtualenv inside the root (Python of the root's generation).
PLATFORM_VENV=/opt/prealloc-cloud/venv
cloud_mixed() {
  if [ -s "$STATE_DIR/mixed" ]; then
    cat "$STATE_DIR/mixed"
  else
    echo "$CLOUD_MIXED"
  fi
}
# host_root N: the root host N runs in (nothing: the machine's own).
host_root() {
  if [ "$(cloud_mixed)" = 1 ] && [ "$1" = 2 ]; then
    echo "$PLATFORM_ROOT"
  fi
}
# newer_host: the host of the newer generation (a bookworm root on a
# trixie machine is the older one): the host in mode space. nova's
# conductor refuses a live migration to a host whose hypervisor is older
# than the source's (DestinationHypervisorTooOld): a fleet drains each
# host onto upgraded ones, so the reserving host, the destination of the
# block live migrations Tempest checks, is the newer one.
newer_host() {
  if [ "$(cloud_mixed)" = 1 ] && [ "$PLATFORM_SUITE" = trixie ]; then
    echo 2
  else
    echo 1
  fi
}
# host_mode N: the plugin's policy of host N. The newer host (host 1 on one
# generation) follows nova's preallocate_images = space (the one line of
# the install guide); the other sets [prealloc_backend] mode = metadata
# (cloud-up's host_mode_conf): a fleet whose hosts differ (a disk that
# moves gets the policy of the host it lands on, unless its flavor names a
# mode). Tempest's [prealloc] host_modes says the same.
host_mode() {
  if [ "$1" = "$(newer_host)" ]; then echo space; else echo metadata; fi
}
# host_fs_mb N: the size of host N's instances filesystem, an ext4 of its
# own on a sparse file, loop-mounted (cloud-up): the host in mode space
# small enough for Tempest to fill with files nova does not know about (the
# capacity test); the host in mode metadata (nova's inventory) large
# enough for the 160 GiB thin disk of the metadata-cache test (nova reports
# DISK_GB's max_unit as the filesystem's size, whatever the ratio).
# Sparse: the disks' reserved extents cost the machine's disk only their
# metadata; written zeros (mode full) cost it their size.
host_fs_mb() {
  if [ "$(host_mode "$1")" = space ]; then echo 16384; else echo 196608; fi
}
# unmount_host_fs: the hosts' filesystems, where still mounted (a run
# killed before its cloud-down). Never rm -r into one: see cloud-up.
unmount_host_fs() {
  local fs
  for fs in "$HOSTS_DIR"/*/fs; do
    if [ -d "$fs" ] && mountpoint -q "$fs"; then
      umount "$fs" || umount -l "$fs"
    fi
  done
}
KEYSTONE_PORT=5000
GLANCE_PORT=9292
PLACEMENT_PORT=8778
NOVA_PORT=8774
NEUTRON_PORT=9696
MYSQL_PORT=${PREALLOC_CLOUD_MYSQL_PORT:-3306}
RABBIT_PORT=${PREALLOC_CLOUD_RABBIT_PORT:-5672}
RABBIT_DIST_PORT=$((RABBIT_PORT + 20000))
EPMD_PORT=4369

RUN_DIR=$CLOUD_DIR/run
STATE_DIR=$CLOUD_DIR/state
LOG_DIR=$CLOUD_DIR/log
DATA_DIR=$CLOUD_DIR/data
CLOUD_VENV=$CLOUD_DIR/venv
TEMPEST_VENV=$CLOUD_DIR/tempest-venv
TEMPEST_DIR=$CLOUD_DIR/tempest
# nova-compute's configuration: root-owned, the file the sudo rule names.
# The path every compute host sees; host N's own file is
# CLOUD_DIR/etc/hosts/N/nova.conf, bound over CLOUD_DIR/etc/nova in its
# mount namespace.
COMPUTE_CONF=$CLOUD_DIR/etc/nova/nova.conf
HOSTS_DIR=$DATA_DIR/hosts

# A compute host's services, in the order cloud-down stops them.
host_services() {
  echo "nova-compute-$1 sshd-$1 libvirtd-$1 virtlogd-$1"
}
# The order cloud-down stops the services in (the reverse of start); each
# host's namespace holder (ns-N) after everything in it.
SERVICES="$(for i in $(seq 1 $MAX_HOSTS); do host_services "$i"; done)
  nova-scheduler nova-conductor nova-api neutron glance placement keystone
  rabbitmq epmd mariadb"

_starttime() {
  # Field 22 of /proc/PID/stat (the comm field may hold spaces: cut after
  # its closing parenthesis).
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  echo "$stat" | awk '{print $20}'
}

# record_pid NAME PID: remember PID and its start time, so that a later
# stop never signals a recycled PID.
record_pid() {
  local st
  st=$(_starttime "$2") || die "$1 (pid $2) exited at once: see $LOG_DIR/$1.log"
  echo "$2 $st" >"$RUN_DIR/$1.pid"
}

# our_pid NAME: print the PID of service NAME if it still runs.
our_pid() {
  local pid st
  [ -s "$RUN_DIR/$1.pid" ] || return 1
  read -r pid st <"$RUN_DIR/$1.pid"
  [ -n "$pid" ] && [ "$(_starttime "$pid" 2>/dev/null)" = "$st" ] || return 1
  echo "$pid"
}

# stop_pid NAME [WAIT]: SIGTERM, up to WAIT seconds (default 20), SIGKILL.
stop_pid() {
  local name=$1 wait=${2:-20} pid i
  if pid=$(our_pid "$name"); then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 $((wait * 5))); do
      our_pid "$name" >/dev/null || break
      sleep 0.2
    done
    if our_pid "$name" >/dev/null; then
      say "$name ($pid) still runs ${wait} s after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for i in $(seq 1 50); do
        our_pid "$name" >/dev/null || break
        sleep 0.2
      done
    fi
    say "stopped $name ($pid)"
  fi
  rm -f "$RUN_DIR/$name.pid"
}

# The services' PATH: the cloud's virtualenv first.
SERVICE_PATH=$CLOUD_VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# The environment every service starts with: nothing inherited from the
# caller (no TMPDIR: the sudo rule expects the daemon's socket under /tmp).
clean_env() {
  env -i PATH="$SERVICE_PATH" \
    LANG=C.UTF-8 HOME="$CLOUD_DIR/home" "$@"
}

# in_host N CMD...: run CMD (as root) in compute host N's namespaces.
# A host in a root (host_root): its holder chrooted there, and CMD with it
# (nsenter --root), in the holder's working directory, the root's /
# (nsenter opens a --wd=DIR before it enters the root: outside it).
in_host() {
  local pid
  pid=$(our_pid "ns-$1") || die "compute host $1 does not run (no ns-$1)"
  local into=(--net --mount --uts)
  [ -z "$(host_root "$1")" ] || into+=(--root --wd)
  shift
  nsenter --target "$pid" "${into[@]}" -- "$@"
}

# start_service NAME USER [VAR=VALUE...] CMD...: start CMD in its own
# session as USER (root or the nova user), output to log/NAME.log, and
# record its PID; with IN_HOST=N set, inside compute host N's namespaces.
# Nothing forks in between (the subshell, env, nsenter, setpriv and setsid
# exec: a background job of a script leads no process group), so the PID is
# the service's.
start_service() {
  local name=$1 user=$2
  shift 2
  local as=() into=() home=$CLOUD_DIR/home pid
  if [ -n "${IN_HOST:-}" ]; then
    pid=$(our_pid "ns-$IN_HOST") || die "compute host $IN_HOST does not run"
    into=(nsenter --target "$pid" --net --mount --uts)
    [ -z "$(host_root "$IN_HOST")" ] || into+=(--root --wd)
    into+=(--)
  fi
  if [ "$user" != root ]; then
    as=(setpriv --reuid="$user" --regid="$user" --init-groups)
    home=$(getent passwd "$user" | cut -d: -f6)
  fi
  # cd: a WSGI server puts its working directory on sys.path (from a
  # clone's top, nova-api imported the clone's prealloc_backend, not the
  # virtualenv's).
  # 9<&-: cloud-up's lock (fd 9) stays cloud-up's; no service, the nova
  # user's least of all, can hold it.
  (cd "$CLOUD_DIR" && exec env -i PATH="$SERVICE_PATH" \
     LANG=C.UTF-8 HOME="$home" "${into[@]}" "${as[@]}" setsid env "$@" \
     >>"$LOG_DIR/$name.log" 2>&1 </dev/null 9<&-) &
  sleep 0.2
  record_pid "$name" $!
}

# ns_pids N: the PIDs of every process in compute host N's network
# namespace but its holder (nothing else can be there: the namespace is
# the run's own; never the machine's own namespace).
ns_pids() {
  local holder ns p
  holder=$(our_pid "ns-$1") || return 0
  ns=$(readlink "/proc/$holder/ns/net") || return 0
  [ "$ns" != "$(readlink /proc/1/ns/net)" ] || return 0
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" != "$holder" ] || continue
    [ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" = "$ns" ] && echo "$p"
  done
  return 0
}

# wait_for WHAT SECONDS CMD...: run CMD once a second until it succeeds.
wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for i in $(seq 1 "$secs"); do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  die "$what not ready after $secs s (logs in $LOG_DIR)"
}

http_ok() {
  curl -fsS -o /dev/null --max-time 5 "$1"
}

# admin_env CMD...: CMD with the admin credentials of the cloud.
admin_env() {
  env OS_AUTH_URL="http://$CTL_IP:$KEYSTONE_PORT/v3" \
    OS_USERNAME=admin OS_PASSWORD="$(cat "$CLOUD_DIR/etc/admin-password")" \
    OS_PROJECT_NAME=admin OS_USER_DOMAIN_NAME=Default \
    OS_PROJECT_DOMAIN_NAME=Default OS_IDENTITY_API_VERSION=3 \
    OS_REGION_NAME=RegionOne "$@"
}
