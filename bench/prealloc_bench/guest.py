# Licensed under the Apache License, Version 2.0 (the "License"); you may
# not use this file except in compliance with the License. You may obtain
# a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
# WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
# License for the specific language governing permissions and limitations
# under the License.

"""A tiny guest, built on this host from Debian packages, that measures
what a disk costs the guest writing to it.

The guest is a kernel image (the installed one under /boot, or one
extracted with ``dpkg-deb -x`` from a ``linux-image-*.deb`` that was only
downloaded, never installed) and an initramfs made here: a static busybox,
the kernel's virtio modules and an ``/init`` script. Its kernel command line
tells ``/init`` what to do with the first virtio disk:

* ``write``: write N MiB of zeros from the start of the disk with O_DIRECT
  (``dd bs=1M oflag=direct conv=fsync``, the seed measurements' method),
  print the elapsed time on the serial console and power off;
* ``idle``: print the disk's size, the md5 of its first MiBs (so a test
  can prove the guest sees the image's data) and the kernel's boot_id (so
  a test can tell one boot from the next), then stay up.
* ``blockio``: print the block sizes the disk advertises, run one step
  (mkfs.ext4/mkfs.xfs, a small filesystem workload, or 512-byte O_DIRECT
  writes) and power off; QEMU's trace counts the guest's write requests by
  size (:func:`run_blockio`). Its filesystem steps need a guest built with
  :data:`FS_TOOLS` (the host's mke2fs, mkfs.xfs and GNU dd with their
  libraries).

It belongs to the benchmark (``prealloc-bench --guest``) and the
real-hypervisor tests, never to what nova-compute imports.

Two runners: plain ``qemu-system-x86_64`` (KVM where /dev/kvm is offered,
TCG only where it is not; see :func:`accelerator`) and libvirt (a transient
domain through ``virsh``). Both return a :class:`WriteResult` naming the
accelerator used. Nothing here has a
command line: ``prealloc-bench`` and the real-hypervisor tests call
these functions.

Everything runs as the caller: the guest's disks are in the Bench's
scratch directory (as root only where nobody else can change it:
engine.Bench); the kernel cache and the guest's console files are the
caller's own.
"""

import dataclasses
import fcntl
import gzip
import hashlib
import io
import lzma
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from xml.sax import saxutils

from oslo_log import log as logging

from prealloc_backend import exception
from prealloc_backend.system import process

LOG = logging.getLogger(__name__)

# Where kernels are extracted and initramfs images kept; .ci/libvirt-up
# downloads the kernel package into the same directory.
CACHE_ENV = 'PREALLOC_GUEST_CACHE'
SYSTEM_CACHE_DIR = '/var/cache/prealloc-backend/guest'
# The Debian kernel package downloaded when asked to (apt-get download):
# the cloud flavour is a quarter of the generic one's size.
KERNEL_PACKAGE = 'linux-image-cloud-amd64'
BUSYBOX_CANDIDATES = ('/bin/busybox', '/usr/bin/busybox')
# Loaded in this order by /init when they are modules (builtin otherwise);
# their dependencies are read from each module's modinfo.
GUEST_MODULES = ('virtio_pci', 'virtio_blk')

# Every line /init prints for the host starts with this.
CONSOLE_MARK = 'PREALLOC-GUEST'
ACTION_WRITE = 'write'
ACTION_IDLE = 'idle'
ACTION_PROBE = 'probe'
ACTION_TRIM = 'trim'
ACTION_BLOCKIO = 'blockio'
ACTION_CHURN = 'churn'
# What the blockio action does after reporting the disk's queue limits.
STEP_NONE = 'none'
STEP_MKFS = 'mkfs'        # mke2fs -t ext4 over the whole disk
STEP_FS = 'fs'            # mount that ext4, write files, fsync, unmount
STEP_DD512 = 'dd512'      # 512-byte O_DIRECT writes at odd sectors
BLOCKIO_STEPS = (STEP_NONE, STEP_MKFS, STEP_FS, STEP_DD512)
# The 512 bytes each dd512 write carries (the host checks them).
DD512_PATTERN = (b'prealloc-512\n' * 40)[:512]
# Host tools copied (with their shared libraries) into a guest built with
# tools: the filesystem steps of the blockio action need them.
# GNU dd: busybox's dd gives up O_DIRECT (its writes reach the disk as
# 4 KiB page-cache writeback, seen in QEMU's trace), GNU dd keeps it.
FS_TOOLS = ('/usr/sbin/mke2fs', '/etc/mke2fs.conf', '/usr/sbin/mkfs.xfs',
            '/usr/bin/dd')
# Loaded too in a guest built with tools (ext4 is builtin in Debian's
# kernels, xfs a module).
FS_MODULES = ('xfs',)
FILESYSTEMS = ('ext4', 'xfs')
ACCEL_KVM = 'kvm'
ACCEL_TCG = 'tcg'
RUNNER_QEMU = 'qemu'
RUNNER_LIBVIRT = 'libvirt'
MEMORY_MIB = 256
# KVM_GET_API_VERSION = _IO(KVMIO, 0x00); the API version has been 12
# since Linux 2.6.22.
KVM_GET_API_VERSION = 0xAE00
KVM_API_VERSION = 12
# Seconds a guest gets to reach /init in the KVM probe (about 1 s when KVM
# works, 2 s under TCG).
PROBE_TIMEOUT = 10
_kvm_boots = {}

# /init: busybox sh. Timestamps come from /proc/timer_list ("now at N
# nsecs") because Debian's busybox date has no %N and its dd prints no
# timing line; /proc/uptime (10 ms) is the fallback.
INIT_SCRIPT = r'''#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /bin
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
M=@MARK@
echo "$M start boot_id=$(cat /proc/sys/kernel/random/boot_id)"
arg() {
  for w in $(cat /proc/cmdline); do
    case "$w" in "$1"=*) echo "${w#*=}"; return;; esac
  done
  echo "$2"
}
now_ns() {
  n=$(sed -n 's/^now at \([0-9]*\) nsecs.*/\1/p;/^now at/q' \
      /proc/timer_list 2>/dev/null)
  if [ -z "$n" ]; then
    n=$(cut -d' ' -f1 /proc/uptime | tr -d .)0000000
  fi
  echo "$n"
}
halt_guest() {
  sync
  poweroff -f
  sleep 5
  reboot -f
}
for m in $(cat /etc/prealloc-modules); do
  insmod "/lib/modules/$m" || echo "$M insmod-failed module=$m"
done
action=$(arg prealloc_action idle)
if [ "$action" = @ACTION_PROBE@ ]; then
  echo "$M probe ok"
  halt_guest
fi
dev=$(arg prealloc_dev vda)
i=0
while [ ! -b "/dev/$dev" ] && [ $i -lt 200 ]; do
  sleep 0.1
  i=$((i + 1))
done
if [ ! -b "/dev/$dev" ]; then
  echo "$M error no-disk dev=$dev"
  halt_guest
fi
size=$(blockdev --getsize64 "/dev/$dev")
echo "$M ready action=$action dev=$dev size=$size"
case "$action" in
@ACTION_WRITE@)
  mib=$(arg prealloc_mib 64)
  t0=$(now_ns)
  dd if=/dev/zero of="/dev/$dev" bs=1M count="$mib" oflag=direct \
     conv=fsync 2>/tmp/dd.err
  rc=$?
  t1=$(now_ns)
  echo "$M write mib=$mib rc=$rc start_ns=$t0 end_ns=$t1"
  sed "s/^/$M dd: /" /tmp/dd.err
  echo "$M done"
  halt_guest
  ;;
@ACTION_TRIM@)
  off=$(arg prealloc_trim_off_mib 128)
  len=$(arg prealloc_trim_mib 512)
  mib=$(arg prealloc_mib 4)
  md5_mib=$(arg prealloc_md5_mib 1)
  fill=$(arg prealloc_trim_fill_mib 0)
  # The disk's last sector says this disk was trimmed by an earlier boot:
  # a later boot (hard reboot, start) only reports what it reads.
  mark=$((size / 512 - 1))
  seen=$(dd if="/dev/$dev" bs=512 skip="$mark" count=1 2>/dev/null |
         head -c 16)
  frc=0
  trc=0
  wrc=0
  if [ "$seen" = prealloc-trimmed ]; then
    again=1
  else
    again=0
    if [ "$fill" -gt 0 ]; then
      # Data in the range before the TRIM (0xaa): what a TRIM that is
      # ignored leaves readable and one that is honoured drops.
      tr '\0' '\252' </dev/zero |
        dd of="/dev/$dev" bs=1M seek="$off" count="$fill" iflag=fullblock \
           oflag=direct conv=fsync 2>/tmp/fill.err
      frc=$?
    fi
    blkdiscard -o $((off * 1048576)) -l $((len * 1048576)) "/dev/$dev" \
       2>/tmp/trim.err
    trc=$?
    dd if=/dev/zero of="/dev/$dev" bs=1M seek="$off" count="$mib" \
       oflag=direct conv=fsync 2>/tmp/dd.err
    wrc=$?
    printf prealloc-trimmed |
      dd of="/dev/$dev" bs=512 seek="$mark" conv=sync,fsync 2>/dev/null
  fi
  md5=$(head -c $((md5_mib * 1048576)) "/dev/$dev" | md5sum | cut -d' ' -f1)
  zeroed=none
  if [ "$fill" -gt 0 ]; then
    # What the guest reads in the filled part of the range after its TRIM
    # (the page cache of the range was dropped by BLKDISCARD).
    got=$(dd if="/dev/$dev" bs=1M skip="$off" count="$fill" 2>/dev/null |
          md5sum | cut -d' ' -f1)
    zero=$(head -c $((fill * 1048576)) /dev/zero | md5sum | cut -d' ' -f1)
    if [ "$got" = "$zero" ]; then zeroed=yes; else zeroed=no; fi
  fi
  echo "$M trim off_mib=$off mib=$len rc=$trc write_mib=$mib" \
       "write_rc=$wrc md5_mib=$md5_mib md5=$md5 fill_mib=$fill" \
       "fill_rc=$frc zeroed=$zeroed again=$again"
  sed "s/^/$M blkdiscard: /" /tmp/trim.err 2>/dev/null
  sed "s/^/$M fill: /" /tmp/fill.err 2>/dev/null
  echo "$M done"
  halt_guest
  ;;
@ACTION_CHURN@)
  # Fill, then write 4 KiB blocks (each naming its number), each flushed,
  # for a while; then read them back and report.
  fill=$(arg prealloc_churn_fill_mib 0)
  off=$(arg prealloc_churn_off_mib 256)
  secs=$(arg prealloc_churn_seconds 30)
  if [ "$fill" -gt 0 ]; then
    tr '\0' '\252' </dev/zero |
      dd of="/dev/$dev" bs=1M seek=64 count="$fill" iflag=fullblock \
         conv=fsync 2>/dev/null
  fi
  read up _ </proc/uptime
  start=${up%.*}${up#*.}
  echo "$M churn-filled fill_mib=$fill"
  base=$((off * 256))
  i=0
  prev=$start
  maxgap=0
  : >/tmp/exp
  while :; do
    read up _ </proc/uptime
    now=${up%.*}${up#*.}
    gap=$((now - prev))
    [ $gap -gt $maxgap ] && maxgap=$gap
    prev=$now
    [ $((now - start)) -ge $((secs * 100)) ] && break
    printf '%-4095s\n' "prealloc-churn block $i" >/tmp/b
    dd if=/tmp/b of="/dev/$dev" bs=4096 seek=$((base + i)) count=1 \
       conv=notrunc,fsync 2>/dev/null || echo "$M churn-error block=$i"
    cat /tmp/b >>/tmp/exp
    i=$((i + 1))
    [ $((i % 20)) = 0 ] && echo "$M churn-at n=$i cs=$now"
  done
  sync
  echo 3 >/proc/sys/vm/drop_caches
  got=$(dd if="/dev/$dev" bs=4096 skip=$base count=$i 2>/dev/null |
        md5sum | cut -d' ' -f1)
  exp=$(md5sum </tmp/exp | cut -d' ' -f1)
  ok=no
  [ "$got" = "$exp" ] && ok=yes
  echo "$M churn writes=$i off_mib=$off md5=$got ok=$ok maxgap_cs=$maxgap"
  echo "$M done"
  halt_guest
  ;;
@ACTION_BLOCKIO@)
  q=/sys/block/$dev/queue
  echo "$M blockio logical=$(cat $q/logical_block_size)" \
       "physical=$(cat $q/physical_block_size)" \
       "min_io=$(cat $q/minimum_io_size) opt_io=$(cat $q/optimal_io_size)"
  step=$(arg prealloc_step none)
  count=$(arg prealloc_count 64)
  first=$(arg prealloc_sector 1)
  fs=$(arg prealloc_fs ext4)
  rc=0
  case "$step" in
  mkfs)
    if [ "$fs" = xfs ]; then
      /usr/sbin/mkfs.xfs -q -f "/dev/$dev" >/tmp/step.err 2>&1
    else
      /usr/sbin/mke2fs -q -F -t ext4 "/dev/$dev" >/tmp/step.err 2>&1
    fi
    rc=$?
    ;;
  fs)
    mkdir -p /mnt
    mount -t "$fs" "/dev/$dev" /mnt >/tmp/step.err 2>&1
    rc=$?
    if [ $rc = 0 ]; then
      i=0
      while [ $i -lt "$count" ]; do
        echo "file $i" | dd of="/mnt/f$i" conv=fsync 2>/dev/null || rc=1
        i=$((i + 1))
      done
      dd if=/dev/zero of=/mnt/big bs=1M count=8 conv=fsync \
         2>>/tmp/step.err || rc=1
      sync
      umount /mnt 2>>/tmp/step.err || rc=1
    fi
    ;;
  dd512)
    yes prealloc-512 | head -c 512 >/tmp/pat
    i=0
    while [ $i -lt "$count" ]; do
      /usr/bin/dd if=/tmp/pat of="/dev/$dev" bs=512 \
         seek=$((first + 2 * i)) count=1 oflag=direct conv=notrunc \
         status=none 2>>/tmp/step.err || rc=1
      i=$((i + 1))
    done
    ;;
  esac
  md5=$(dd if="/dev/$dev" bs=512 skip="$first" count=$((2 * count)) \
        iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
  set -- $(cat /sys/block/$dev/stat)
  echo "$M step name=$step rc=$rc writes=$5 write_sectors=$7" \
       "first=$first count=$count md5=$md5"
  sed "s/^/$M step-err: /" /tmp/step.err 2>/dev/null
  echo "$M done"
  halt_guest
  ;;
*)
  md5_mib=$(arg prealloc_md5_mib 1)
  md5=$(head -c $((md5_mib * 1048576)) "/dev/$dev" | md5sum | cut -d' ' -f1)
  boot=$(cat /proc/sys/kernel/random/boot_id)
  echo "$M idle md5_mib=$md5_mib md5=$md5 boot_id=$boot"
  while true; do sleep 3600; done
  ;;
esac
'''


class GuestError(Exception):
    """The guest could not be built, started, or did not report."""


@dataclasses.dataclass(frozen=True)
class Guest:
    """A bootable kernel and initramfs pair."""

    kernel: str
    initramfs: str
    release: str


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What the guest reported after writing ``mib`` MiB."""

    mib: int
    seconds: float
    accel: str
    runner: str
    console: str = dataclasses.field(repr=False, default='')

    @property
    def mib_per_s(self):
        return self.mib / self.seconds if self.seconds > 0 else float('inf')


def cache_dir():
    """The guest cache: $PREALLOC_GUEST_CACHE, the system cache when it is
    writable (root), else the user's cache directory.
    """
    path = os.environ.get(CACHE_ENV)
    if path:
        return path
    if os.access(SYSTEM_CACHE_DIR, os.W_OK) or (
            os.geteuid() == 0 and
            os.access(os.path.dirname(os.path.dirname(SYSTEM_CACHE_DIR)),
                      os.W_OK)):
        return SYSTEM_CACHE_DIR
    base = os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')
    return os.path.join(base, 'prealloc-backend', 'guest')


def kvm_usable():
    """True when /dev/kvm opens and answers KVM_GET_API_VERSION."""
    try:
        fd = os.open('/dev/kvm', os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fcntl.ioctl(fd, KVM_GET_API_VERSION) == KVM_API_VERSION
    except OSError:
        return False
    finally:
        os.close(fd)


def accelerator(prefer_kvm=True, guest=None):
    """``kvm`` where /dev/kvm is offered (it opens and answers
    KVM_GET_API_VERSION), ``tcg`` only where it is not (or when
    ``prefer_kvm`` is False).

    Where KVM is offered but the guest does not boot under it (seen: an AMD
    EPYC nested virtual machine whose KVM guests stop after "Probing EDD"),
    this raises GuestError instead of falling back to TCG: TCG on a host
    that offers KVM would time QEMU's CPU emulation, not the disk, and the
    figures would pass for KVM ones. The probe boots the guest once (short
    timeout); the verdict is kept for the process.
    """
    if not prefer_kvm or not kvm_usable():
        return ACCEL_TCG
    guest = guest or build_guest()
    key = (guest.kernel, guest.initramfs)
    if key not in _kvm_boots:
        _kvm_boots[key] = _probe_boot(guest, ACCEL_KVM)
    if not _kvm_boots[key]:
        raise GuestError(
            '/dev/kvm is offered but the guest does not boot under KVM '
            'within %d s; in-guest figures are not measured (TCG on a host '
            'that offers KVM would time CPU emulation, not the disk)'
            % PROBE_TIMEOUT)
    return ACCEL_KVM


def _probe_boot(guest, accel):
    with tempfile.TemporaryDirectory(prefix='prealloc-guest-') as tmpdir:
        console_path = os.path.join(tmpdir, 'console.log')
        cmd = qemu_command(guest, None, None,
                           kernel_cmdline(ACTION_PROBE), accel,
                           console_path)
        try:
            process.execute(*cmd, timeout=PROBE_TIMEOUT)
        except exception.ProcessTimeout:
            return False
        except exception.ProcessFailed:
            pass  # the console says whether it booted
        return 'probe' in parse_console(_read(console_path))


# -- kernel ---------------------------------------------------------------

def _module_index(modules_dir):
    """{module name: path} of every module file under ``modules_dir``."""
    index = {}
    for root, _dirs, files in os.walk(os.path.join(modules_dir, 'kernel')):
        for name in files:
            match = re.match(r'(.+)\.ko(\.(xz|gz|zst))?$', name)
            if match:
                index[match.group(1).replace('-', '_')] = os.path.join(
                    root, name)
    return index


def _builtin_modules(modules_dir):
    names = set()
    try:
        with open(os.path.join(modules_dir, 'modules.builtin')) as f:
            for line in f:
                name = os.path.basename(line.strip())
                names.add(name.split('.ko')[0].replace('-', '_'))
    except OSError:
        pass
    return names


def _read_module(path):
    """The uncompressed bytes of a module file."""
    with open(path, 'rb') as f:
        data = f.read()
    if path.endswith('.xz'):
        return lzma.decompress(data)
    if path.endswith('.gz'):
        return gzip.decompress(data)
    if path.endswith('.zst'):
        if not shutil.which('zstd'):
            raise GuestError('%s is zstd-compressed and zstd is not '
                             'installed' % path)
        return process.execute('zstd', '-dc', path, binary=True)
    return data


def _module_depends(data):
    match = re.search(rb'(?:^|\x00)depends=([^\x00]*)\x00', data)
    if not match or not match.group(1):
        return []
    return [d.decode().replace('-', '_') for d in match.group(1).split(b',')]


def _resolve_modules(modules_dir, wanted=GUEST_MODULES):
    """[(name, bytes)] in load order (dependencies first); builtins and
    modules that do not exist in this kernel are left out.
    """
    index = _module_index(modules_dir)
    builtin = _builtin_modules(modules_dir)
    ordered, seen = [], set()

    def visit(name):
        if name in seen or name in builtin:
            return
        seen.add(name)
        path = index.get(name)
        if path is None:
            return
        data = _read_module(path)
        for dep in _module_depends(data):
            visit(dep)
        ordered.append((name, data))

    for name in wanted:
        visit(name)
    missing = [n for n in ('virtio_blk',)
               if n not in builtin and n not in dict(ordered)]
    if missing:
        raise GuestError('kernel modules %s not found under %s' %
                         (', '.join(missing), modules_dir))
    return ordered


def _release_of(vmlinuz):
    return os.path.basename(vmlinuz)[len('vmlinuz-'):]


def _installed_kernels():
    """(vmlinuz, modules dir, release) of kernels installed under /boot
    whose modules are present, newest name first.
    """
    found = []
    try:
        names = sorted(os.listdir('/boot'), reverse=True)
    except OSError:
        return found
    for name in names:
        if not name.startswith('vmlinuz-'):
            continue
        vmlinuz = os.path.join('/boot', name)
        release = _release_of(vmlinuz)
        modules = _modules_dir('/', release)
        if os.access(vmlinuz, os.R_OK) and modules:
            found.append((vmlinuz, modules, release))
    return found


def _modules_dir(root, release):
    """The modules directory of kernel ``release`` under ``root``, or None:
    ``lib/modules`` (Debian 12), or ``usr/lib/modules`` (Debian 13's
    kernel packages, merged /usr).
    """
    for base in ('lib', 'usr/lib'):
        path = os.path.join(root, base, 'modules', release)
        if os.path.isdir(path):
            return path
    return None


def _extracted_kernel(root):
    boot = os.path.join(root, 'boot')
    try:
        names = sorted(n for n in os.listdir(boot)
                       if n.startswith('vmlinuz-'))
    except OSError:
        return None
    if not names:
        return None
    vmlinuz = os.path.join(boot, names[-1])
    release = _release_of(vmlinuz)
    modules = _modules_dir(root, release)
    if modules is None:
        return None
    return vmlinuz, modules, release


def _extract_deb(deb, cache):
    """Extract a kernel .deb into ``cache``/linux/<name> (once)."""
    name = os.path.basename(deb)[:-len('.deb')]
    root = os.path.join(cache, 'linux', name)
    found = _extracted_kernel(root)
    if found:
        return found
    os.makedirs(os.path.dirname(root), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=name + '.', dir=os.path.dirname(root))
    try:
        process.execute('dpkg-deb', '-x', deb, tmp)
        os.rename(tmp, root)
    except (OSError, exception.ProcessFailed) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        # Another process (a parallel test worker) may have won the race.
        found = _extracted_kernel(root)
        if found:
            return found
        raise GuestError('cannot extract %s: %s' % (deb, exc))
    found = _extracted_kernel(root)
    if not found:
        raise GuestError('%s holds no /boot/vmlinuz-*' % deb)
    LOG.info('Extracted guest kernel %(release)s from %(deb)s',
             {'release': found[2], 'deb': deb})
    return found


def download_kernel(cache=None, package=KERNEL_PACKAGE):
    """Download (never install) the kernel package ``package`` depends on
    into ``cache`` with apt-get; returns the .deb path.
    """
    cache = cache or cache_dir()
    os.makedirs(cache, exist_ok=True)
    try:
        out = process.execute('apt-cache', 'depends', package)
    except exception.ProcessFailed as exc:
        out = exc.stdout
    match = re.search(r'Depends: (linux-image-\S+)', out)
    if not match:
        raise GuestError('apt-cache cannot resolve %s to a kernel package '
                         '(run apt-get update?)' % package)
    # NOTE(apt): as root, apt's _apt sandbox user cannot write into the cache;
    # the download itself is verified by apt either way.
    process.execute('apt-get', 'download', '-q', '-o',
                    'APT::Sandbox::User=root', match.group(1), cwd=cache)
    debs = _debs(cache)
    if not debs:
        raise GuestError('apt-get download of %s left no .deb in %s' %
                         (match.group(1), cache))
    return debs[-1]


def _debs(cache):
    try:
        return sorted(os.path.join(cache, n) for n in os.listdir(cache)
                      if n.startswith('linux-image-') and n.endswith('.deb'))
    except OSError:
        return []


def find_kernel(cache=None, download=False):
    """(vmlinuz, modules dir, release) of a kernel the guest can boot.

    In order: a kernel installed under /boot with its modules; a
    ``linux-image-*.deb`` in the cache (extracted once); with
    ``download``, one fetched by :func:`download_kernel`.
    """
    cache = cache or cache_dir()
    for vmlinuz, modules, release in _installed_kernels():
        try:
            _resolve_modules(modules)
        except GuestError:
            continue
        return vmlinuz, modules, release
    debs = _debs(cache)
    if not debs and download:
        debs = [download_kernel(cache)]
    if not debs:
        raise GuestError(
            'no guest kernel: none under /boot and no linux-image-*.deb in '
            '%s (run .ci/libvirt-up, or apt-get download %s there)' %
            (cache, KERNEL_PACKAGE))
    return _extract_deb(debs[-1], cache)


# -- initramfs ------------------------------------------------------------

class _Cpio:
    """An archive in the 'newc' cpio format, the one the kernel unpacks."""

    def __init__(self):
        self._out = io.BytesIO()
        self._ino = 0

    def add(self, name, mode, data=b'', rdev=(0, 0)):
        self._ino += 1
        name_bytes = name.encode() + b'\x00'
        fields = (self._ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0],
                  rdev[1], len(name_bytes), 0)
        out = self._out
        out.write(b'070701' + b''.join(b'%08X' % f for f in fields))
        out.write(name_bytes)
        out.write(b'\x00' * (-(110 + len(name_bytes)) % 4))
        out.write(data)
        out.write(b'\x00' * (-len(data) % 4))

    def finish(self):
        self.add('TRAILER!!!', 0)
        return self._out.getvalue()


def _tool_files(tools):
    """[(path, bytes)] of each host file in ``tools`` and, for an ELF
    program, of the shared libraries ``ldd`` names (the guest has no
    others), each at its host path.
    """
    files = {}
    for tool in tools:
        paths = [tool]
        with open(tool, 'rb') as f:
            elf = f.read(4) == b'\x7fELF'
        if elf:
            out = process.execute('ldd', tool)
            paths += re.findall(r'(/\S+) \(0x', out)
        for path in paths:
            if path not in files:
                with open(path, 'rb') as f:
                    files[path] = f.read()
    return sorted(files.items())


def _initramfs_bytes(modules, busybox, tools=()):
    with open(busybox, 'rb') as f:
        busybox_data = f.read()
    init = INIT_SCRIPT
    for key, value in (('@MARK@', CONSOLE_MARK),
                       ('@ACTION_WRITE@', ACTION_WRITE),
                       ('@ACTION_PROBE@', ACTION_PROBE),
                       ('@ACTION_TRIM@', ACTION_TRIM),
                       ('@ACTION_BLOCKIO@', ACTION_BLOCKIO),
                       ('@ACTION_CHURN@', ACTION_CHURN)):
        init = init.replace(key, value)
    cpio = _Cpio()
    for directory in ('bin', 'dev', 'etc', 'lib', 'lib/modules', 'proc',
                      'sys', 'tmp'):
        cpio.add(directory, stat.S_IFDIR | 0o755)
    # The kernel opens /dev/console for /init before anything is mounted.
    cpio.add('dev/console', stat.S_IFCHR | 0o600, rdev=(5, 1))
    cpio.add('init', stat.S_IFREG | 0o755, init.encode())
    cpio.add('bin/busybox', stat.S_IFREG | 0o755, busybox_data)
    names = []
    for position, (name, data) in enumerate(modules):
        filename = '%02d-%s.ko' % (position, name)
        names.append(filename)
        cpio.add('lib/modules/' + filename, stat.S_IFREG | 0o644, data)
    cpio.add('etc/prealloc-modules', stat.S_IFREG | 0o644,
             ('\n'.join(names) + '\n').encode())
    made = set()
    for path, data in tools:
        parts = path.strip('/').split('/')
        for depth in range(1, len(parts)):
            directory = '/'.join(parts[:depth])
            if directory not in made:
                made.add(directory)
                cpio.add(directory, stat.S_IFDIR | 0o755)
        cpio.add('/'.join(parts), stat.S_IFREG | 0o755, data)
    return gzip.compress(cpio.finish(), mtime=0)


def _static_busybox():
    for path in BUSYBOX_CANDIDATES:
        if not os.path.exists(path):
            continue
        with open(path, 'rb') as f:
            head = f.read(1 << 20)
        # A dynamically linked ELF names its interpreter (ld-linux).
        if b'ld-linux' not in head:
            return path
    raise GuestError('no static busybox found (%s): install Debian\'s '
                     'busybox-static' % ', '.join(BUSYBOX_CANDIDATES))


def build_guest(cache=None, download=False, tools=()):
    """Return a :class:`Guest`, building its initramfs when needed.

    ``tools``: host files (programs with their shared libraries, and
    plain files) to put in the initramfs at the same paths, e.g.
    :data:`FS_TOOLS` for the blockio action's filesystem steps.

    The initramfs is kept in the cache under a name that hashes its
    content sources, so it is rebuilt when the kernel, busybox or /init
    change.
    """
    cache = cache or cache_dir()
    vmlinuz, modules_dir, release = find_kernel(cache, download=download)
    busybox = _static_busybox()
    modules = _resolve_modules(
        modules_dir, GUEST_MODULES + (FS_MODULES if tools else ()))
    tool_files = _tool_files(tools)
    digest = hashlib.sha256(INIT_SCRIPT.encode())
    for path, data in tool_files:
        digest.update(path.encode() + hashlib.sha256(data).digest())
    digest.update(release.encode())
    for name, data in modules:
        digest.update(name.encode() + hashlib.sha256(data).digest())
    with open(busybox, 'rb') as f:
        digest.update(hashlib.sha256(f.read()).digest())
    initramfs = os.path.join(cache, 'initramfs-%s-%s.gz' %
                             (release, digest.hexdigest()[:12]))
    if not os.path.exists(initramfs):
        os.makedirs(cache, exist_ok=True)
        data = _initramfs_bytes(modules, busybox, tool_files)
        fd, tmp = tempfile.mkstemp(dir=cache, prefix='.initramfs-')
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.rename(tmp, initramfs)
        LOG.info('Built guest initramfs %(path)s (%(size)d bytes, modules '
                 '%(mods)s)', {'path': initramfs, 'size': len(data),
                               'mods': ' '.join(n for n, _d in modules)})
    return Guest(kernel=vmlinuz, initramfs=initramfs, release=release)


# -- console --------------------------------------------------------------

def kernel_cmdline(action=ACTION_WRITE, mib=64, device='vda', md5_mib=1,
                   console='ttyS0', trim_off_mib=128, trim_mib=512,
                   trim_fill_mib=0, step=STEP_NONE, count=64, sector=1,
                   fs='ext4', churn_seconds=30, churn_fill_mib=0,
                   churn_off_mib=256):
    """The guest kernel command line for ``action``.

    ``blockio``: report the disk's queue limits (logical and physical
    block size, minimum and optimal I/O size), run ``step`` (see
    BLOCKIO_STEPS; ``count`` files or 512-byte writes, the writes at every
    other sector from ``sector``), report the disk's write count and the
    md5 of the ``2 * count`` sectors from ``sector`` and power off.

    ``trim``: write ``trim_fill_mib`` MiB of 0xaa at ``trim_off_mib``,
    discard ``trim_mib`` MiB from ``trim_off_mib`` (blkdiscard), then write
    ``mib`` MiB of zeros at ``trim_off_mib`` (O_DIRECT, both writes), mark
    the disk's last sector, report the md5 of the first ``md5_mib`` MiB and
    whether the filled range reads zeros (``zeroed``), and power off. A
    boot that finds the mark (a later start of the same disk) only reports
    (``again=1``).

    ``churn``: write ``churn_fill_mib`` MiB of 0xaa at 64 MiB (flushed),
    report ``churn-filled``, then for ``churn_seconds`` write 4 KiB blocks
    from ``churn_off_mib`` on, each naming its number and flushed (a
    ``churn-at n=N cs=T`` line every 20, T in the guest's centiseconds);
    then read them back (page cache dropped) and report their count, md5,
    whether they read as written (``ok``) and the longest gap between two
    writes (``maxgap_cs``), and power off.
    """
    # no_timer_check: under TCG on a busy host the kernel's check that
    # the 8254 timer reaches the IO-APIC can time out ("MP-BIOS bug: 8254
    # timer not connected to IO-APIC") and the boot then hangs in the
    # fallbacks; the timer works, only the check is too quick for an
    # emulated CPU (cloud images boot with it for the same reason).
    words = ['console=%s' % console, 'panic=1', 'quiet', 'no_timer_check',
             'prealloc_action=%s' % action, 'prealloc_dev=%s' % device]
    if action == ACTION_WRITE:
        words.append('prealloc_mib=%d' % int(mib))
    elif action == ACTION_IDLE:
        words.append('prealloc_md5_mib=%d' % int(md5_mib))
    elif action == ACTION_TRIM:
        words.extend(['prealloc_mib=%d' % int(mib),
                      'prealloc_md5_mib=%d' % int(md5_mib),
                      'prealloc_trim_off_mib=%d' % int(trim_off_mib),
                      'prealloc_trim_mib=%d' % int(trim_mib),
                      'prealloc_trim_fill_mib=%d' % int(trim_fill_mib)])
    elif action == ACTION_CHURN:
        words.extend(['prealloc_churn_seconds=%d' % int(churn_seconds),
                      'prealloc_churn_fill_mib=%d' % int(churn_fill_mib),
                      'prealloc_churn_off_mib=%d' % int(churn_off_mib)])
    elif action == ACTION_BLOCKIO:
        if step not in BLOCKIO_STEPS:
            raise ValueError('blockio step %r: allowed steps are %s' %
                             (step, ', '.join(BLOCKIO_STEPS)))
        if fs not in FILESYSTEMS:
            raise ValueError('blockio filesystem %r: allowed are %s' %
                             (fs, ', '.join(FILESYSTEMS)))
        words.extend(['prealloc_step=%s' % step, 'prealloc_fs=%s' % fs,
                      'prealloc_count=%d' % int(count),
                      'prealloc_sector=%d' % int(sector)])
    return ' '.join(words)


def _report_lines(text):
    """(kind, {key: value}) of each of the guest's report lines, in console
    order, kind being the word after the mark: start, ready, write, idle,
    error, ...
    """
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(CONSOLE_MARK + ' '):
            continue
        words = line[len(CONSOLE_MARK) + 1:].split()
        if not words:
            continue
        yield (words[0].rstrip(':'),
               dict(w.split('=', 1) for w in words[1:] if '=' in w))


def parse_console_starts(text):
    """The boot_id of every boot whose /init started, in console order
    (parse_console keeps only the last line of each kind).
    """
    return [fields.get('boot_id') for kind, fields in _report_lines(text)
            if kind == 'start']


def parse_console(text):
    """{kind: {key: value}} of the guest's report lines (last one wins)."""
    return dict(_report_lines(text))


def write_result(text, accel, runner):
    """The :class:`WriteResult` a write guest's console reports."""
    report = parse_console(text)
    write = report.get(ACTION_WRITE)
    if write is None:
        if 'error' in report:
            raise GuestError('guest reported an error: %s' %
                             report['error'])
        raise GuestError('the guest printed no write report; console '
                         'ends with:\n%s' % '\n'.join(
                             text.splitlines()[-20:]))
    if write.get('rc') != '0':
        raise GuestError('dd in the guest failed (exit %s): %s' %
                         (write.get('rc'), text[-2000:]))
    seconds = (int(write['end_ns']) - int(write['start_ns'])) / 1e9
    return WriteResult(mib=int(write['mib']), seconds=seconds, accel=accel,
                       runner=runner, console=text)


def _read(path):
    try:
        with open(path, errors='replace') as f:
            return f.read()
    except OSError:
        return ''


def _default_timeout(accel, mib):
    # TCG boots in seconds and writes at tens of MiB/s on this kind of
    # machine; the bound is generous so that a slow host still reports.
    return 60 + mib * (1 if accel == ACCEL_TCG else 0.2)


# -- runners --------------------------------------------------------------

def qemu_command(guest, disk, disk_format, cmdline, accel, console_path,
                 cache='none', aio='threads', cache_size=None,
                 memory_mib=MEMORY_MIB, block_sizes=None, trace_path=None):
    """The qemu-system-x86_64 command line of a guest (``disk`` None: no
    disk).

    ``block_sizes``: (logical, physical) block sizes the virtio disk
    advertises (libvirt's ``<blockio>``), None for QEMU's (512, 512).
    ``trace_path``: a file QEMU logs each guest write request to
    (trace event virtio_blk_handle_write; see :func:`parse_write_trace`).
    """
    cmd = ['qemu-system-x86_64', '-nodefaults', '-no-user-config',
           '-display', 'none', '-no-reboot',
           '-machine', 'pc,accel=%s' % accel,
           '-m', str(memory_mib), '-smp', '1',
           '-kernel', guest.kernel, '-initrd', guest.initramfs,
           '-append', cmdline, '-serial', 'file:%s' % console_path]
    if disk:
        drive = ['file=%s' % disk.replace(',', ',,'),
                 'format=%s' % disk_format, 'if=virtio', 'cache=%s' % cache,
                 'aio=%s' % aio]
        if cache_size and disk_format == 'qcow2':
            drive.append('cache-size=%d' % int(cache_size))
        if block_sizes:
            drive[2] = 'if=none'
            drive.append('id=disk0')
            cmd += ['-drive', ','.join(drive), '-device',
                    'virtio-blk-pci,drive=disk0,logical_block_size=%d,'
                    'physical_block_size=%d' % tuple(block_sizes)]
        else:
            cmd += ['-drive', ','.join(drive)]
    if trace_path:
        cmd += ['-trace', 'enable=virtio_blk_handle_write', '-D',
                trace_path]
    return cmd


def parse_write_trace(text):
    """{request bytes: count} of the guest's write requests in a QEMU
    log of virtio_blk_handle_write (``... sector S nsectors N``; virtio
    sectors are 512 bytes whatever the advertised block size).
    """
    sizes = {}
    for match in re.finditer(r'virtio_blk_handle_write\b.*?nsectors (\d+)',
                             text):
        size = int(match.group(1)) * 512
        sizes[size] = sizes.get(size, 0) + 1
    return sizes


@dataclasses.dataclass(frozen=True)
class BlockioResult:
    """What a blockio guest reported, and its write requests as QEMU saw
    them ({bytes: count}).
    """

    queue: dict
    step: dict
    write_sizes: dict
    console: str = dataclasses.field(repr=False, default='')


def run_blockio(disk, disk_format, step=STEP_NONE, block_sizes=None,
                count=64, sector=1, fs='ext4', guest=None, accel=None,
                aio='threads', timeout=None, workdir=None):
    """Boot the guest on ``disk`` with plain QEMU, advertising
    ``block_sizes`` (see :func:`qemu_command`), run the blockio ``step``
    and return a :class:`BlockioResult`; raises :class:`GuestError`.
    """
    guest = guest or build_guest(tools=FS_TOOLS)
    accel = accel or accelerator(guest=guest)
    timeout = timeout or _default_timeout(accel, 64)
    tmpdir = tempfile.mkdtemp(prefix='prealloc-guest-', dir=workdir)
    console_path = os.path.join(tmpdir, 'console.log')
    trace_path = os.path.join(tmpdir, 'trace.log')
    cmd = qemu_command(guest, disk, disk_format,
                       kernel_cmdline(ACTION_BLOCKIO, step=step, count=count,
                                      sector=sector, fs=fs),
                       accel, console_path, aio=aio,
                       block_sizes=block_sizes, trace_path=trace_path)
    try:
        _run_guest(cmd, timeout, console_path)
        console = _read(console_path)
        report = parse_console(console)
        if 'blockio' not in report or 'step' not in report:
            raise GuestError('the guest printed no blockio report; console '
                             'ends with:\n%s' % console[-2000:])
        return BlockioResult(queue=report['blockio'], step=report['step'],
                             write_sizes=parse_write_trace(
                                 _read(trace_path)),
                             console=console)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _run_guest(cmd, timeout, console_path):
    """Run a plain-QEMU guest until it powers off; GuestError otherwise."""
    try:
        process.execute(*cmd, timeout=timeout)
    except exception.ProcessTimeout:
        raise GuestError('the guest did not power off within %d s; '
                         'console:\n%s' % (timeout,
                                           _read(console_path)[-2000:]))
    except exception.ProcessFailed as exc:
        raise GuestError('qemu-system-x86_64 exited %s: %s' %
                         (exc.exit_code, exc.stderr))


def run_write_test(disk, disk_format, mib=64, guest=None, accel=None,
                   cache='none', aio='threads', cache_size=None,
                   timeout=None, workdir=None, block_sizes=None):
    """Boot the guest on ``disk`` with plain QEMU and have it write ``mib``
    MiB from the start of the disk with O_DIRECT.

    ``accel`` defaults to :func:`accelerator` (KVM when usable). ``aio``
    mirrors nova's ``driver_io`` (``native`` when nova preallocates,
    ``threads`` otherwise); ``cache_size`` mirrors ``<metadata_cache>``,
    ``block_sizes`` (logical, physical) ``<blockio>``.
    Returns a :class:`WriteResult`; raises :class:`GuestError`.
    """
    guest = guest or build_guest()
    accel = accel or accelerator(guest=guest)
    timeout = timeout or _default_timeout(accel, mib)
    tmpdir = tempfile.mkdtemp(prefix='prealloc-guest-', dir=workdir)
    console_path = os.path.join(tmpdir, 'console.log')
    cmd = qemu_command(guest, disk, disk_format,
                       kernel_cmdline(ACTION_WRITE, mib), accel,
                       console_path, cache=cache, aio=aio,
                       cache_size=cache_size, block_sizes=block_sizes)
    LOG.debug('Running %s', ' '.join(cmd))
    try:
        _run_guest(cmd, timeout, console_path)
        return write_result(_read(console_path), accel, RUNNER_QEMU)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def domain_xml(name, guest, disk, disk_format, cmdline, accel,
               console_path, cache='none', io='native', cache_size=None,
               memory_mib=MEMORY_MIB):
    """A transient libvirt domain for the guest (no network, no display)."""
    def q(value):
        return saxutils.quoteattr(str(value))

    def t(value):
        return saxutils.escape(str(value))

    metadata_cache = ''
    if cache_size and disk_format == 'qcow2':
        metadata_cache = ("<metadata_cache><max_size unit='bytes'>%d"
                          "</max_size></metadata_cache>" % int(cache_size))
    return '''<domain type=%(type)s>
  <name>%(name)s</name>
  <memory unit='MiB'>%(mem)d</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>%(kernel)s</kernel>
    <initrd>%(initrd)s</initrd>
    <cmdline>%(cmdline)s</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type=%(fmt)s cache=%(cache)s
              io=%(io)s>%(mc)s</driver>
      <source file=%(disk)s/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='file'><source path=%(console)s/></serial>
    <memballoon model='none'/>
  </devices>
</domain>
''' % {'type': q('kvm' if accel == ACCEL_KVM else 'qemu'), 'name': t(name),
       'mem': memory_mib, 'kernel': t(guest.kernel),
       'initrd': t(guest.initramfs), 'cmdline': t(cmdline),
       'fmt': q(disk_format), 'cache': q(cache), 'io': q(io),
       'mc': metadata_cache, 'disk': q(disk), 'console': q(console_path)}


def _virsh(uri, *args):
    """stdout of ``virsh -c uri args``; raises ProcessFailed (it failed)
    or ProcessTimeout (no answer within 60 s).
    """
    return process.execute('virsh', '-q', '-c', uri, *args, timeout=60)


def _domain_exists(uri, name):
    try:
        _virsh(uri, 'domid', name)
    except exception.ProcessFailed:
        return False
    return True


def run_write_test_libvirt(disk, disk_format, mib=64, guest=None,
                           accel=None, uri='qemu:///system', cache='none',
                           io='native', cache_size=None, timeout=None,
                           workdir=None):
    """As :func:`run_write_test`, as a transient libvirt domain (virsh).

    The domain is destroyed if it outlives ``timeout``.
    """
    guest = guest or build_guest()
    accel = accel or accelerator(guest=guest)
    timeout = timeout or _default_timeout(accel, mib)
    tmpdir = tempfile.mkdtemp(prefix='prealloc-guest-', dir=workdir)
    console_path = os.path.join(tmpdir, 'console.log')
    name = 'prealloc-guest-%s' % uuid.uuid4().hex[:12]
    xml_path = os.path.join(tmpdir, 'domain.xml')
    with open(xml_path, 'w') as f:
        f.write(domain_xml(name, guest, disk, disk_format,
                           kernel_cmdline(ACTION_WRITE, mib), accel,
                           console_path, cache=cache, io=io,
                           cache_size=cache_size))
    try:
        try:
            _virsh(uri, 'create', xml_path)
        except exception.ProcessFailed as exc:
            raise GuestError('virsh create failed: %s' % exc.stderr)
        deadline = time.monotonic() + timeout
        while _domain_exists(uri, name):
            if time.monotonic() > deadline:
                try:
                    _virsh(uri, 'destroy', name)
                except exception.ProcessFailed:
                    pass  # it stopped in the meantime
                raise GuestError('the guest did not power off within %d s; '
                                 'console:\n%s' %
                                 (timeout, _read(console_path)[-2000:]))
            time.sleep(0.2)
        return write_result(_read(console_path), accel, RUNNER_LIBVIRT)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
