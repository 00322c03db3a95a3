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

"""A small FUSE filesystem that records what would survive a crash.

One flat directory held in memory, served by a forked child that talks to
/dev/fuse directly (mount(2) through ctypes: no library, no new
dependency). Every request that changes state is appended to a log: a
file's creation, write, truncation and fallocate, an fsync of a file, a
rename, an unlink, an fsync of the directory. Files are opened with
FOPEN_DIRECT_IO, so that every write(2) reaches the log when it is made.

Replaying a prefix of the log gives the states a crash at that point can
leave (Model.views), as LazyFS does for Jepsen:

* ``kill``: everything the kernel accepted (a kill -9 of the process);
* ``power``: only what was flushed: each file's data as of its last
  fsync, the directory's names as of its last fsync (the strict POSIX
  reading);
* ``power-meta``: the directory as it is (a journalling filesystem
  committed the renames and unlinks for some other reason) but each
  file's data only as flushed: a rename published before its file was
  flushed names an empty file.

cut_points() chooses where a log is cut (every request but the writes,
which may be sampled), replay() gives the states at those cuts, and a
Mount holding such a state (its files all on the device) serves the
recovery that follows, so that the recovery's own log is cut in turn.
"""

import ctypes
import ctypes.util
import errno
import hashlib
import os
import pickle
import stat
import struct

ROOT = 1
_IN_HEADER = struct.Struct('<IIQQIIIHH')
_OUT_HEADER = struct.Struct('<IiQ')
_ATTR = struct.Struct('<QQQQQQIIIIIIIIII')
_ENTRY = struct.Struct('<QQQQII')
_ATTR_OUT = struct.Struct('<QII')
_OPEN_OUT = struct.Struct('<QII')
_READ_IN = struct.Struct('<QQIIQII')
_WRITE_IN = _READ_IN
_SETATTR_IN = struct.Struct('<IIQQQQQQIIIIIIII')
_FALLOCATE_IN = struct.Struct('<QQQII')
_INIT_OUT = struct.Struct('<IIIIHHIIHHII24x')
_DIRENT = struct.Struct('<QQII')

(LOOKUP, FORGET, GETATTR, SETATTR, MKNOD, UNLINK, RENAME, OPEN, READ,
 WRITE, STATFS, RELEASE, FSYNC, FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR,
 FSYNCDIR, ACCESS, CREATE, INTERRUPT, DESTROY, BATCH_FORGET, FALLOCATE,
 RENAME2) = (1, 2, 3, 4, 8, 10, 12, 14, 15, 16, 17, 18, 20, 25, 26, 27,
             28, 29, 30, 34, 35, 36, 38, 42, 43, 45)
_NO_REPLY = (FORGET, BATCH_FORGET, INTERRUPT)
FATTR_MODE, FATTR_SIZE = 1, 8
FOPEN_DIRECT_IO = 1
FUSE_BIG_WRITES = 1 << 5
FUSE_MAX_PAGES = 1 << 22
MAX_WRITE = 1024 * 1024
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 1, 2, 16
RENAME_NOREPLACE = 1
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)


def _check(ret):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Model:
    """The directory as the kernel sees it, and as flushed."""

    def __init__(self, files=None):
        self.dir = {}
        self.data = {}
        self.mode = {}
        self.next_ino = ROOT + 1
        for name, content in (files or {}).items():
            ino = self._new(0o100644)
            self.dir[name] = ino
            self.data[ino] = bytearray(content)
        # What survives a power cut: all of the initial files.
        self.p_dir = dict(self.dir)
        self.p_data = {ino: bytes(d) for ino, d in self.data.items()}

    def _new(self, mode):
        ino = self.next_ino
        self.next_ino += 1
        self.data[ino] = bytearray()
        self.mode[ino] = mode
        return ino

    def apply(self, op):
        kind = op[0]
        if kind == 'create':
            _, name, ino, mode = op
            self.data[ino] = bytearray()
            self.mode[ino] = mode
            self.next_ino = max(self.next_ino, ino + 1)
            self.dir[name] = ino
        elif kind == 'write':
            _, ino, offset, chunk = op
            data = self.data[ino]
            if len(data) < offset:
                data.extend(bytes(offset - len(data)))
            data[offset:offset + len(chunk)] = chunk
        elif kind == 'truncate':
            _, ino, size = op
            data = self.data[ino]
            if size < len(data):
                del data[size:]
            else:
                data.extend(bytes(size - len(data)))
        elif kind == 'fallocate':
            _, ino, offset, length, mode = op
            data = self.data[ino]
            end = offset + length
            if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
                stop = min(end, len(data))
                if stop > offset:
                    data[offset:stop] = bytes(stop - offset)
            if not mode & FALLOC_FL_KEEP_SIZE and end > len(data):
                data.extend(bytes(end - len(data)))
        elif kind == 'fsync':
            self.p_data[op[1]] = bytes(self.data[op[1]])
        elif kind == 'fsyncdir':
            self.p_dir = dict(self.dir)
        elif kind == 'unlink':
            del self.dir[op[1]]
        elif kind == 'rename':
            _, old, new = op
            self.dir[new] = self.dir.pop(old)
        else:
            raise ValueError(op)

    def views(self):
        """{variant: {name: bytes}} of a crash now (see the module)."""
        return {
            'kill': {n: bytes(self.data[i]) for n, i in self.dir.items()},
            'power': {n: self.p_data.get(i, b'')
                      for n, i in self.p_dir.items()},
            'power-meta': {n: self.p_data.get(i, b'')
                           for n, i in self.dir.items()},
        }


def cut_points(log, write_cuts=None):
    """The points at which ``log`` is cut: before the first request, after
    every request that is not a write, after the last; after every write,
    or, where ``write_cuts`` is given and there are more writes, after
    ``write_cuts`` of them evenly spaced (deterministic: the same log is
    always cut at the same points).
    """
    cuts = {0, len(log)}
    cuts.update(i for i in range(1, len(log) + 1)
                if log[i - 1][0] != 'write')
    writes = [i for i in range(1, len(log) + 1) if log[i - 1][0] == 'write']
    if write_cuts is not None and len(writes) > write_cuts:
        if write_cuts <= 1:
            writes = writes[-write_cuts:] if write_cuts else []
        else:
            step = (len(writes) - 1) / (write_cuts - 1)
            writes = [writes[round(k * step)] for k in range(write_cuts)]
    cuts.update(writes)
    return sorted(cuts)


def replay(initial, log, cuts):
    """(cut, variant, files) of each crash state at each of ``cuts``
    (ascending) of ``log`` run on a Model holding ``initial``.
    """
    model = Model(initial)
    done = 0
    for cut in cuts:
        while done < cut:
            model.apply(log[done])
            done += 1
        for variant, files in sorted(model.views().items()):
            yield cut, variant, files


def state_key(files):
    """A digest of a state's names and bytes ({name: bytes})."""
    return hashlib.sha256(repr(sorted(
        (n, hashlib.sha256(d).digest()) for n, d in files.items())).encode()
    ).digest()


class Server:
    """Serve a Model on /dev/fuse, logging each state change."""

    def __init__(self, fd, model):
        self.fd = fd
        self.model = model
        self.log = []

    def _do(self, op):
        self.model.apply(op)
        self.log.append(op)

    def _attr(self, ino, uid=0, gid=0):
        if ino == ROOT:
            mode, size, nlink = stat.S_IFDIR | 0o755, 0, 2
        else:
            mode, size, nlink = self.model.mode[ino], len(
                self.model.data[ino]), 1
        # st_blocks 0: every block counts as still to allocate.
        return _ATTR.pack(ino, size, 0, 0, 0, 0, 0, 0, 0,
                          mode, nlink, uid, gid, 0, 4096, 0)

    def _entry(self, ino):
        return _ENTRY.pack(ino, 0, 0, 0, 0, 0) + self._attr(ino)

    def serve(self):
        while True:
            try:
                buf = os.read(self.fd, MAX_WRITE + 65536)
            except OSError as exc:
                if exc.errno == errno.ENODEV:  # unmounted
                    return
                if exc.errno in (errno.EINTR, errno.ENOENT, errno.EAGAIN):
                    continue
                raise
            (length, opcode, unique, nodeid, uid, gid, _pid, _ext,
             _pad) = _IN_HEADER.unpack_from(buf)
            body = buf[_IN_HEADER.size:length]
            try:
                payload = self.handle(opcode, nodeid, body)
                error = 0
            except OSError as exc:
                payload, error = b'', exc.errno
            if opcode in _NO_REPLY:
                continue
            try:
                os.write(self.fd, _OUT_HEADER.pack(
                    _OUT_HEADER.size + len(payload), -error, unique) +
                    payload)
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # interrupted request
                    raise
            if opcode == DESTROY:
                return

    @staticmethod
    def _name(body):
        return body.split(b'\0', 1)[0].decode()

    def _lookup(self, name):
        try:
            return self.model.dir[name]
        except KeyError:
            raise OSError(errno.ENOENT, name)

    def handle(self, op, nodeid, body):
        m = self.model
        if op == INIT:
            major, minor, readahead, _flags = struct.unpack_from('<IIII',
                                                                 body)
            return _INIT_OUT.pack(7, min(minor, 31), readahead,
                                  FUSE_BIG_WRITES | FUSE_MAX_PAGES, 16, 12,
                                  MAX_WRITE, 1, MAX_WRITE // 4096, 0, 0, 0)
        if op in (FORGET, BATCH_FORGET, INTERRUPT, DESTROY):
            return b''
        if op == LOOKUP:
            return self._entry(self._lookup(self._name(body)))
        if op == GETATTR:
            return _ATTR_OUT.pack(0, 0, 0) + self._attr(nodeid)
        if op == SETATTR:
            fields = _SETATTR_IN.unpack_from(body)
            valid, size, mode = fields[0], fields[3], fields[11]
            if valid & FATTR_SIZE:
                self._do(('truncate', nodeid, size))
            if valid & FATTR_MODE and nodeid != ROOT:
                m.mode[nodeid] = stat.S_IFREG | (mode & 0o7777)
            return _ATTR_OUT.pack(0, 0, 0) + self._attr(nodeid)
        if op in (CREATE, MKNOD):
            mode, _rdev_or_umask = struct.unpack_from('<II', body)
            name = self._name(body[16:])
            ino = m.next_ino
            self._do(('create', name, ino, stat.S_IFREG | (mode & 0o7777)))
            entry = self._entry(ino)
            if op == MKNOD:
                return entry
            return entry + _OPEN_OUT.pack(0, FOPEN_DIRECT_IO, 0)
        if op == OPEN:
            return _OPEN_OUT.pack(0, FOPEN_DIRECT_IO, 0)
        if op == OPENDIR:
            return _OPEN_OUT.pack(0, 0, 0)
        if op == READ:
            _fh, offset, size = _READ_IN.unpack_from(body)[:3]
            return bytes(m.data[nodeid][offset:offset + size])
        if op == WRITE:
            _fh, offset, size = _WRITE_IN.unpack_from(body)[:3]
            chunk = bytes(body[_WRITE_IN.size:_WRITE_IN.size + size])
            self._do(('write', nodeid, offset, chunk))
            return struct.pack('<II', len(chunk), 0)
        if op == FALLOCATE:
            _fh, offset, length, mode, _p = _FALLOCATE_IN.unpack_from(body)
            self._do(('fallocate', nodeid, offset, length, mode))
            return b''
        if op == FSYNC:
            self._do(('fsync', nodeid))
            return b''
        if op == FSYNCDIR:
            self._do(('fsyncdir',))
            return b''
        if op == UNLINK:
            name = self._name(body)
            self._lookup(name)
            self._do(('unlink', name))
            return b''
        if op in (RENAME, RENAME2):
            flags = 0
            if op == RENAME2:
                flags = struct.unpack_from('<I', body, 8)[0]
                names = body[16:]
            else:
                names = body[8:]
            old, new = [n.decode() for n in names.split(b'\0')[:2]]
            self._lookup(old)
            if flags & RENAME_NOREPLACE and new in m.dir:
                raise OSError(errno.EEXIST, new)
            if flags & ~RENAME_NOREPLACE:
                raise OSError(errno.EINVAL, 'rename flags')
            self._do(('rename', old, new))
            return b''
        if op == READDIR:
            _fh, offset, size = _READ_IN.unpack_from(body)[:3]
            entries = [('.', ROOT, 4), ('..', ROOT, 4)] + [
                (n, i, 8) for n, i in sorted(m.dir.items())]
            out = b''
            for index in range(offset, len(entries)):
                name, ino, kind = entries[index]
                raw = name.encode()
                rec = _DIRENT.pack(ino, index + 1, len(raw), kind) + raw
                rec += bytes(-len(rec) % 8)
                if len(out) + len(rec) > size:
                    break
                out += rec
            return out
        if op == STATFS:
            return struct.pack('<QQQQQIII4x24x', 1 << 24, 1 << 23, 1 << 23,
                               1 << 20, 1 << 19, 4096, 255, 4096)
        if op in (RELEASE, RELEASEDIR, FLUSH, ACCESS):
            return b''
        raise OSError(errno.ENOSYS, 'not implemented')


class Mount:
    """Mount a Model at ``mountpoint`` served by a forked child; umount()
    returns the log of what changed.
    """

    def __init__(self, mountpoint, files, log_path):
        self.mountpoint = mountpoint
        self.log_path = log_path
        fd = os.open('/dev/fuse', os.O_RDWR | os.O_CLOEXEC)
        opts = ('fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other,'
                'default_permissions' % fd).encode()
        _check(_libc.mount(b'crashfs', mountpoint.encode(), b'fuse.crashfs',
                           ctypes.c_ulong(0), ctypes.c_char_p(opts)))
        pid = os.fork()
        if pid == 0:  # the server
            code = 1
            try:
                server = Server(fd, Model(files))
                server.serve()
                with open(log_path, 'wb') as f:
                    pickle.dump(server.log, f)
                code = 0
            finally:
                os._exit(code)
        os.close(fd)
        self.pid = pid

    def umount(self):
        _check(_libc.umount2(self.mountpoint.encode(), MNT_DETACH))
        _pid, status = os.waitpid(self.pid, 0)
        if status != 0:
            raise RuntimeError('crashfs server ended with status %d'
                               % status)
        with open(self.log_path, 'rb') as f:
            return pickle.load(f)
