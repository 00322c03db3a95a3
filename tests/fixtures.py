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

"""Test fixtures and helpers shared by the unit, privileged and functional
tiers.

Everything here is real: loop-mounted filesystems, qemu-img made images,
the plugin's privsep entrypoints run in-process (client mode off) unless a
test starts the real daemon.
"""

import ast
import ctypes
import ctypes.util
import errno
import hashlib
import mmap
import os
import pwd
import random
import shutil
import stat
import subprocess
import tempfile
import time
import uuid

import fixtures
import nova.privsep
from oslo_utils import units

from prealloc_backend.disk import fsprobe
import prealloc_backend.privsep
import prealloc_backend.privsep.fs
from prealloc_backend.system import fileops

MKFS = {
    'ext4': ['mkfs.ext4', '-q', '-F'],
    # ext4 without extents: fallocate(2) answers EOPNOTSUPP, as on ext3.
    'ext4-noextents': ['mkfs.ext4', '-q', '-F', '-O', '^extent,^64bit'],
    'xfs': ['mkfs.xfs', '-q', '-f'],
}
# Smallest sizes the tools accept (xfs refuses below 300 MiB).
MIN_SIZE_MB = {'ext4': 8, 'ext4-noextents': 8, 'xfs': 300}


def skip_unless_root(test):
    if os.geteuid() != 0:
        test.skipTest('loop mounts need root (CI runs as root)')


class SystemUser(fixtures.Fixture):
    """An unprivileged system user made with useradd for the test (root
    only), removed at cleanup: ``name``, ``uid``, ``gid``.
    """

    def __init__(self, prefix):
        super().__init__()
        self.prefix = prefix

    def _setUp(self):
        self.name = self.prefix + uuid.uuid4().hex[:8]
        subprocess.run(['useradd', '--system', '--no-create-home',
                        '--shell', '/usr/sbin/nologin', self.name],
                       check=True, capture_output=True)
        self.addCleanup(subprocess.run, ['userdel', self.name],
                        capture_output=True)
        entry = pwd.getpwnam(self.name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid


class LoopFilesystem(fixtures.Fixture):
    """A real filesystem of ``size_mb`` MiB, loop-mounted on ``self.path``.

    ``kind`` is one of MKFS. Needs root: call skip_unless_root first.
    """

    def __init__(self, kind, size_mb, parent=None):
        super().__init__()
        self.kind = kind
        self.size_mb = max(size_mb, MIN_SIZE_MB[kind])
        self.parent = parent

    def _setUp(self):
        workdir = tempfile.mkdtemp(prefix='prealloc-loop-', dir=self.parent)
        self.addCleanup(shutil.rmtree, workdir, ignore_errors=True)
        image = os.path.join(workdir, 'fs.img')
        with open(image, 'wb') as f:
            f.truncate(self.size_mb * 1024 * 1024)
        subprocess.run(MKFS[self.kind] + [image], check=True,
                       capture_output=True)
        self.path = os.path.join(workdir, 'mnt')
        os.mkdir(self.path)
        subprocess.run(['mount', '-o', 'loop', image, self.path], check=True,
                       capture_output=True)
        self.addCleanup(self._umount)
        # A fresh filesystem may reuse a device number: never trust an
        # earlier probe result for it.
        fsprobe.forget()
        self.addCleanup(fsprobe.forget)

    def _umount(self):
        subprocess.run(['umount', '-l', self.path], check=False,
                       capture_output=True)


class PrivsepInProcess(fixtures.Fixture):
    """Run the plugin's (and nova's) privsep entrypoints in this process.

    The entrypoints' own argument checks still run; only the daemon and its
    socket are left out. One test tier starts the real daemon instead.
    """

    def _setUp(self):
        for ctx in (prealloc_backend.privsep.ctx,
                    nova.privsep.sys_admin_pctxt):
            ctx.set_client_mode(False)
            self.addCleanup(ctx.set_client_mode, True)


def write_pattern(path, size, seed, data_every=4, block=64 * 1024):
    """Write a raw file of ``size`` bytes: data blocks of random bytes (from
    ``seed``) every ``data_every`` blocks, holes in between. Returns the
    list of (offset, bytes) written.
    """
    import random
    rng = random.Random(seed)
    written = []
    with open(path, 'wb') as f:
        f.truncate(size)
        for index, offset in enumerate(range(0, size, block)):
            if index % data_every:
                continue
            data = rng.randbytes(min(block, size - offset))
            f.seek(offset)
            f.write(data)
            written.append((offset, data))
        # NOTE(nova): flushed like a downloaded image would be. On ext4 without
        # extents (kernel 6.18 seen here) SEEK_DATA misses unflushed
        # delayed-allocation data, and cp (which nova uses to copy raw
        # bases) then copies those ranges as holes.
        f.flush()
        os.fsync(f.fileno())
    return written


def make_base(path, fmt, size, seed=1):
    """A base image with non-zero content, as Glance would have given it."""
    raw = path + '.src' if fmt != 'raw' else path
    write_pattern(raw, size, seed)
    if fmt != 'raw':
        subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O', fmt, raw,
                        path], check=True, capture_output=True)
        os.unlink(raw)
    return path


def qemu_img_info(path):
    import json
    out = subprocess.run(['qemu-img', 'info', '--output=json',
                          '--force-share', path], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def qemu_img_compare(a, b, strict=False):
    """(returncode, output) of qemu-img compare: 0 means same content."""
    cmd = ['qemu-img', 'compare', '--force-share']
    if strict:
        cmd.append('-s')
    proc = subprocess.run(cmd + [a, b], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def hole_bytes(path):
    """Bytes SEEK_HOLE/SEEK_DATA report as holes, read by the test itself
    (unwritten extents of ext4 and xfs may count as holes: no data yet).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        return fileops.hole_bytes(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)


_libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                          ctypes.POINTER(ctypes.c_ubyte)]


def cached_bytes(path):
    """Bytes of the file at ``path`` in the host's page cache: mincore(2)
    over a private mapping of it, which reads nothing in.
    """
    size = os.path.getsize(path)
    if not size:
        return 0
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    vec = (ctypes.c_ubyte * pages)()
    with open(path, 'rb') as f:
        mapped = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        start = ctypes.c_char.from_buffer(mapped)
        try:
            failed = _libc.mincore(ctypes.addressof(start), size, vec)
        finally:
            del start
        if failed:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        mapped.close()
    return page * sum(resident & 1 for resident in vec)


def skip_unless_pages_drop(test, directory):
    """Skip ``test`` where the filesystem of ``directory`` keeps a file's
    pages cached after POSIX_FADV_DONTNEED (tmpfs: its pages are the
    file), so that a page-cache assertion cannot fail for that reason.
    """
    # Not fileops.drop_page_cache, the code under test: broken, it
    # would make this probe skip the tests that should catch it.
    path = os.path.join(directory, '.pages-probe')
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b'\xa5' * 65536)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        left = cached_bytes(path)
    finally:
        os.close(fd)
        os.unlink(path)
    if left:
        test.skipTest('%s keeps pages cached after POSIX_FADV_DONTNEED '
                      '(tmpfs?): set TMPDIR to a disk filesystem' % directory)


def allocated(path):
    return os.stat(path).st_blocks * 512


def write_conf(path, sections):
    """Write an ini file from {section: {option: value}}; return path."""
    with open(path, 'w') as f:
        for section, options in sections.items():
            f.write('[%s]\n' % section)
            for name, value in options.items():
                f.write('%s = %s\n' % (name, value))
            f.write('\n')
    return path


class StatvfsSeen(fixtures.Fixture):
    """Records what ``os.fstatvfs`` answers (without changing it):
    ``self.seen``, one ``os.statvfs_result`` per call.

    A free-space figure is checked against the answer the code got, never
    against a second statvfs: the unit tier runs tests in two processes,
    and the other one makes and removes GiBs of files on the same
    filesystem meanwhile (such a comparison failed by 4 GiB).
    """

    def _setUp(self):
        self.seen = []
        real_fstatvfs = os.fstatvfs

        def fstatvfs(fd):
            self.seen.append(real_fstatvfs(fd))
            return self.seen[-1]
        self.useFixture(fixtures.MonkeyPatch('os.fstatvfs', fstatvfs))

    def free_bytes(self):
        """f_bavail * f_frsize of the one answer seen."""
        (vfs,) = self.seen
        return vfs.f_bavail * vfs.f_frsize


class CheckHost(fixtures.Fixture):
    """``prealloc-backend check``'s Host of a real nova.conf.

    Writes ``sections`` to ``path``, parses it into nova's global CONF as
    the command does (reset after the test) and builds the Host the checks
    read: ``self.host``. ``qemu_conf``: libvirt's qemu.conf to read.
    """

    def __init__(self, path, sections, disk_size=64 * 1024 * 1024,
                 qemu_conf='/nonexistent/qemu.conf'):
        super().__init__()
        self.path = path
        self.sections = sections
        self.disk_size = disk_size
        self.qemu_conf = qemu_conf

    def _setUp(self):
        from oslo_config import fixture as config_fixture

        from prealloc_backend.checks import host as check_host
        from prealloc_backend.cmd import check
        from prealloc_backend import conf

        self.useFixture(config_fixture.Config(conf.CONF))
        fsprobe.forget()
        self.addCleanup(fsprobe.forget)
        write_conf(self.path, self.sections)
        check.load_config(conf.CONF, [self.path], [])
        self.host = check_host.Host(conf.CONF, ['--config-file', self.path],
                                    self.disk_size, qemu_conf=self.qemu_conf)


def check_sections(conf_path, instances_path, **prealloc):
    """nova.conf sections of a healthy host for ``prealloc-backend check``:
    the plugin's driver, mode space, the daemon started by this venv's
    privsep-helper reading ``conf_path``; ``prealloc`` are
    [prealloc_backend] options.
    """
    import sys

    helper = os.path.join(os.path.dirname(sys.executable), 'privsep-helper')
    return {
        'DEFAULT': {
            'compute_driver': 'prealloc_backend.LibvirtDriver',
            'preallocate_images': 'space',
            'instances_path': instances_path,
        },
        'prealloc_backend': prealloc,
        'prealloc_backend_privsep': {
            'helper_command': '%s --config-file %s' % (helper, conf_path),
        },
    }


# Bounded waits: a wait that runs out fails with the state it saw.
WAIT = 60
# Files nova itself writes beside a disk (not the plugin's to remove).
NOVA_FILES = ('disk.info',)


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(units.Mi), b''):
            digest.update(block)
    return digest.hexdigest()


def guest_sha(path):
    """sha256 of what a guest reads from the disk (through qemu-img)."""
    out = path + '.view'
    subprocess.run(['qemu-img', 'convert', '-U', '-O', 'raw', path, out],
                   check=True, capture_output=True)
    try:
        return sha256_of(out), os.path.getsize(out)
    finally:
        os.unlink(out)


def write_source(path, size, seed):
    """A raw image of random, incompressible content (no holes)."""
    rng = random.Random(seed)
    block = rng.randbytes(units.Mi)
    with open(path, 'wb') as f:
        for index in range(0, size, units.Mi):
            f.write(index.to_bytes(8, 'little') +
                    block[8:min(units.Mi, size - index)])
    return path


def expected_sha(source_raw, size):
    """sha256 of source_raw's content zero-extended to size."""
    digest = hashlib.sha256()
    done = 0
    with open(source_raw, 'rb') as f:
        for block in iter(lambda: f.read(units.Mi), b''):
            block = block[:size - done]
            digest.update(block)
            done += len(block)
    while done < size:
        block = bytes(min(units.Mi, size - done))
        digest.update(block)
        done += len(block)
    return digest.hexdigest()


def processes_with_env(variable, value):
    """pids of live (not zombie) processes whose environment holds
    ``variable=value``: what a test's run started, wherever it was
    reparented.
    """
    needle = ('%s=%s' % (variable, value)).encode()
    found = []
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        try:
            with open('/proc/%s/environ' % name, 'rb') as f:
                environ = f.read().split(b'\0')
            with open('/proc/%s/stat' % name) as f:
                state = f.read().rsplit(')', 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ and state != 'Z':
            found.append(int(name))
    return found


def find_processes(program, marker, session=None):
    """pids of live processes running ``program`` with ``marker`` among
    their arguments (and in ``session``, when given).
    """
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/cmdline' % entry, 'rb') as f:
                argv = f.read().split(b'\0')
            with open('/proc/%s/stat' % entry) as f:
                stat = f.read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if stat[0] == 'Z' or not argv or not argv[0]:
            continue
        if session is not None and int(stat[3]) != session:
            continue
        if (os.path.basename(argv[0].decode()) == program and
                any(marker.encode() in arg for arg in argv)):
            found.append(int(entry))
    return found


def wait_until(predicate, what, proc=None):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError('process ended (%s) before %s'
                                 % (proc.returncode, what))
        time.sleep(0.001)
    raise AssertionError('gave up waiting for %s' % what)


# The privileged daemon's entrypoints and the disk the boundary tests call
# them on.
PRIVSEP_DISK_SIZE = 4 * units.Mi
ENTRYPOINTS = ('fallocate_range', 'zero_fill_range')


def file_state(path):
    """Everything a privileged call could change about ``path``."""
    st = os.lstat(path)
    state = {'mode': st.st_mode, 'size': st.st_size, 'blocks': st.st_blocks,
             'mtime': st.st_mtime_ns, 'ctime': st.st_ctime_ns,
             'ino': st.st_ino, 'nlink': st.st_nlink}
    if stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        with open(path, 'rb') as f:
            for block in iter(lambda: f.read(units.Mi), b''):
                digest.update(block)
        state['sha256'] = digest.hexdigest()
        state['extents'] = extents(path)
    elif stat.S_ISLNK(st.st_mode):
        state['target'] = os.readlink(path)
    return state


def extents(path):
    """[(first block, blocks, flags)] of a file, as filefrag reports them
    (including unwritten extents, which SEEK_DATA does not show).
    """
    out = subprocess.run(['filefrag', '-v', '-b4096', path], check=True,
                         capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.replace(':', ' ').replace('..', ' ').split()
        if len(fields) >= 6 and fields[0].isdigit():
            start, length = int(fields[1]), int(fields[5])
            flags = fields[-1] if not fields[-1].isdigit() else ''
            found.append((start, length, 'unwritten' in flags))
    return found


def make_disk(path, size=PRIVSEP_DISK_SIZE):
    """A sparse disk with data at its start and at 2 MiB."""
    with open(path, 'wb') as f:
        f.truncate(size)
        f.write(b'\xa5' * 65536)
        f.seek(2 * units.Mi)
        f.write(b'\x5a' * 4096)
        # Flushed, so that its extents (part of the state compared
        # before and after each call) are final, not delayed allocations.
        f.flush()
        os.fsync(f.fileno())
    return path


def privsep_call(name, path, offset=0, length=4096, unprivileged=False):
    """Call entrypoint ``name`` with the arguments it takes."""
    module = prealloc_backend.privsep.fs
    func = getattr(module, ('unprivileged_' if unprivileged else '') + name)
    return func(path, offset, length)


def write_guest_qcow2_header(disk, scratch, size, backing=None,
                             data_file=None, backing_fmt='raw'):
    """What a guest can do to its raw disk: write a real qcow2 header
    (made by ``qemu-img create -f qcow2``, naming ``backing`` and/or
    ``data_file``) into the disk's first bytes, in place. Returns the
    header's bytes.

    ``data_file`` must not exist yet (``qemu-img create`` makes it, empty):
    the caller writes the host file's content into it afterwards.
    """
    header = os.path.join(scratch, 'guest-header-%d.qcow2' % os.getpid())
    cmd = ['qemu-img', 'create', '-f', 'qcow2']
    opts = []
    if backing:
        cmd += ['-u', '-b', backing, '-F', backing_fmt]
    if data_file:
        opts.append('data_file=%s' % data_file)
    if opts:
        cmd += ['-o', ','.join(opts)]
    subprocess.run(cmd + [header, str(size)], check=True,
                   capture_output=True)
    with open(header, 'rb') as f:
        data = f.read()
    os.unlink(header)
    fd = os.open(disk, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return data


def contains(path, needle, chunk=4 * 1024 * 1024):
    """``needle`` (bytes, not all zeros) occurs somewhere in the file at
    ``path``. Only the file's data is read (SEEK_DATA, SEEK_HOLE; a
    filesystem without them reports the whole file as data): a hole reads
    as zeros, so a needle holding a byte that is not zero overlaps data
    wherever it occurs, and each data range is read with ``len(needle) -
    1`` bytes either side.
    """
    if not needle.strip(b'\0'):
        raise ValueError('needle %r is all zeros: every hole holds it'
                         % needle[:16])
    margin = len(needle) - 1
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            # A device's st_size is 0: nothing would be read.
            raise ValueError('%s is not a regular file' % path)
        size = st.st_size
        offset = 0
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    return False
                raise
            end = os.lseek(fd, start, os.SEEK_HOLE)
            pos, stop = max(0, start - margin), min(size, end + margin)
            tail = b''
            while pos < stop:
                block = os.pread(fd, min(chunk, stop - pos), pos)
                if not block:
                    break
                seen = tail + block
                if needle in seen:
                    return True
                tail = seen[max(0, len(seen) - margin):]
                pos += len(block)
            offset = end
        return False
    finally:
        os.close(fd)


def package_trees():
    """(path relative to the package, parsed AST) of every module of
    prealloc_backend: for tests that read the code itself.
    """
    top = os.path.dirname(os.path.abspath(prealloc_backend.__file__))
    for directory, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__')
        for name in sorted(files):
            if name.endswith('.py'):
                path = os.path.join(directory, name)
                with open(path) as f:
                    yield (os.path.relpath(path, top),
                           ast.parse(f.read(), path))


def count_past_end(path, clusters=1):
    """Set to 1 the refcounts of the ``clusters`` clusters that follow the
    end of the qcow2 file at ``path``, in the refcount block already
    covering them: what ``qemu-img resize --preallocation=falloc|full``
    leaves when it is cut after its first refcount-block write (byte for
    byte the file QEMU 7.2.22 left, killed there: disk/refcount.py).
    Returns the index of the first such cluster.
    """
    import struct
    with open(path, 'r+b') as f:
        head = f.read(104)
        version, = struct.unpack_from('>I', head, 4)
        cluster_bits, = struct.unpack_from('>I', head, 20)
        table_offset, = struct.unpack_from('>Q', head, 48)
        order = struct.unpack_from('>I', head, 96)[0] if version == 3 else 4
        cluster = 1 << cluster_bits
        per_block = cluster * 8 >> order
        first = -(-os.fstat(f.fileno()).st_size // cluster)
        for index in range(first, first + clusters):
            f.seek(table_offset + 8 * (index // per_block))
            block = struct.unpack('>Q', f.read(8))[0] & ~0x1ff
            assert block, 'no refcount block covers cluster %d' % index
            entry = index % per_block
            if order >= 3:
                width = 1 << (order - 3)
                f.seek(block + entry * width)
                f.write((1).to_bytes(width, 'big'))
            else:
                per_byte = 8 >> order
                f.seek(block + entry // per_byte)
                byte = f.read(1)[0] | (1 << ((entry % per_byte) << order))
                f.seek(block + entry // per_byte)
                f.write(bytes([byte]))
    return first
