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

"""The I/O engines of the benchmark: QEMU's own tools, and filefrag.

Every guest-side I/O goes through QEMU's block layer (its qcow2 and raw
drivers), opened the way libvirt opens a disk with ``cache='none'``:
``cache.direct=on`` and, for qcow2 disks to which the plugin gives a
``<metadata_cache><max_size>``, the qcow2 node's ``cache-size`` option,
which is what libvirt passes to QEMU for that element.

* ``qemu-img bench``: sequential requests with a step, any queue depth,
  a flush every N requests; timed by qemu-img's own timer ("Run completed
  in N seconds": from the first request to the last completion), so the
  process start and the image open are not in the figure.
* ``qemu-io`` reading a generated command script on stdin: any offsets, in
  any order (``qemu-img bench`` has no random mode), one request at a time;
  timed by the sum of the times qemu-io reports for each request (``-C``),
  so neither the process start nor the command parsing is in the figure.

Next to each figure, the CPU time of the process that did the I/O: its
user + system time as the kernel accounts it when the process is reaped
(wait4's rusage; here the growth of RUSAGE_CHILDREN over the run, the
benchmark running one command at a time), divided by its requests. It
covers the whole process (its start, the image open and close are in it),
so it bounds QEMU's per-request work from above.

A timed run shorter than MIN_SECONDS is refused (TooShort): qemu-img
reports milliseconds, and a run that short says more about the host's
scheduler than about the disk. The floor is a parameter (``min_seconds``,
engine.Config's of the run), so tests set it rather than depend on the
speed of the machine they run on.

These functions run as the caller. The benchmark's caller is the user
``prealloc-bench`` runs as; as root only in a directory nobody else
can change (engine.Bench checks).
"""

import collections
import json
import mmap
import os
import re
import resource

from oslo_log import log as logging

from prealloc_backend import exception
from prealloc_backend.system import process
from prealloc_backend.system import stopping

LOG = logging.getLogger(__name__)

QEMU_IMG = 'qemu-img'
QEMU_IO = 'qemu-io'
FILEFRAG = 'filefrag'
# Generous: the largest default workload takes a few seconds.
TIMEOUT = 900
# Shortest timed run accepted: 50 times qemu-img's 1 ms resolution.
MIN_SECONDS = 0.05


class ToolError(Exception):
    """A tool failed or printed what we cannot read."""

    def __init__(self, cmd, reason):
        self.cmd = cmd
        self.reason = reason
        super().__init__('%s: %s' % (' '.join(cmd), reason))


def run(cmd, stdin=None):
    """Run cmd (a list) through prealloc_backend.system.process (C locale,
    killed after TIMEOUT); return its stdout. Raises ToolError, for the report,
    or stopping.Stopped when the command was asked to stop (before the
    tool starts, or after stopping.on_signals killed it).
    """
    stopping.check()
    run_cmd = cmd
    if stopping.test_point('child:%s' % cmd[0]):
        # Test hook: a child that waits (and a grandchild, sleep) before
        # it becomes the tool.
        run_cmd = ['sh', '-c', 'sleep %d; exec "$@"' % stopping.PAUSE_SECONDS,
                   'sh'] + list(cmd)
    try:
        out = process.execute(*run_cmd, stdin=stdin, timeout=TIMEOUT)
    except exception.ProcessTimeout:
        stopping.check()
        raise ToolError(cmd, 'no answer within %d s' % TIMEOUT)
    except exception.ProcessFailed as exc:
        # Killed because the command was asked to stop: not the tool's
        # failure.
        stopping.check()
        if exc.exit_code == 127:
            # env's answer when the command is not installed.
            raise ToolError(cmd, 'command not found')
        raise ToolError(cmd, 'exit code %s: %s' % (
            exc.exit_code, (exc.stderr or exc.stdout).strip()[-500:]))
    # Belt and braces: qemu-io reports a failed request on stdout.
    for line in out.splitlines():
        if ' failed: ' in line or 'not found' in line:
            raise ToolError(cmd, line.replace('qemu-io> ', '').strip())
    return out


def children_cpu():
    """User + system seconds of every child this process has reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_counted(cmd, stdin=None):
    """run(cmd, stdin), and the CPU seconds (user + system) the command's
    process used: what the kernel added to this process's children's
    rusage when it was reaped. The benchmark runs one command at a time,
    so nothing else is reaped meanwhile. (``env`` execs the command: one
    process.)
    """
    before = children_cpu()
    out = run(cmd, stdin)
    return out, max(0.0, children_cpu() - before)


# A timed run: the seconds its timer gives, and the CPU seconds of the
# process that ran it (user + system, its whole life).
Timed = collections.namedtuple('Timed', 'seconds cpu_seconds')


class TooShort(ToolError):
    """A run too short for its timer to say anything."""


def _long_enough(cmd, seconds, min_seconds=MIN_SECONDS):
    if seconds < min_seconds:
        raise TooShort(cmd, 'the timed run took %.4f s, under %.2f s: too '
                            'short to time honestly (use larger sizes)'
                       % (seconds, min_seconds))
    return seconds


def version(tool=QEMU_IMG):
    """'7.2.22' or the like; 'unknown' when the tool cannot say."""
    try:
        out = run([tool, '--version'])
    except ToolError:
        return 'unknown'
    match = re.search(r'version (\S+)', out)
    return match.group(1) if match else 'unknown'


def _escape(value):
    # QemuOpts syntax: a comma inside a value is written twice.
    return str(value).replace(',', ',,')


def image_opts(path, fmt, aio='threads', cache_size=None, direct=True,
               flush=True):
    """The ``--image-opts`` string of a disk as libvirt would open it
    (cache=none); ``direct=False, flush=False`` is cache=unsafe, for
    preparing a disk, never for measuring one.
    """
    if not direct:
        # QEMU refuses aio=native without O_DIRECT.
        aio = 'threads'
    opts = ['driver=%s' % fmt, 'file.driver=file',
            'file.filename=%s' % _escape(path), 'file.aio=%s' % aio,
            'cache.direct=%s' % ('on' if direct else 'off'),
            'cache.no-flush=%s' % ('off' if flush else 'on')]
    if cache_size and fmt == 'qcow2':
        opts.append('cache-size=%d' % cache_size)
    return ','.join(opts)


def bench_cmd(opts, count, size, depth=16, offset=0, step=None, write=True,
              flush_interval=None):
    """A ``qemu-img bench`` command line over the disk of ``opts``."""
    cmd = [QEMU_IMG, 'bench', '--image-opts', '-c', str(count), '-d',
           str(depth), '-s', str(size), '-o', str(offset)]
    if step:
        cmd += ['-S', str(step)]
    if flush_interval:
        cmd += ['--flush-interval=%d' % flush_interval]
    if write:
        # A fixed non-zero pattern: zero writes could be optimised away.
        cmd += ['-w', '--pattern=90']
    return cmd + [opts]


def parse_bench(cmd, out):
    """Seconds of "Run completed in N seconds." in qemu-img bench output."""
    match = re.search(r'Run completed in ([0-9.]+) seconds', out)
    if not match:
        raise ToolError(cmd, 'no "Run completed" line in %r' % out[-300:])
    return float(match.group(1))


def bench_timed(opts, count, size, depth=16, offset=0, step=None,
                write=True, flush_interval=None, timed=True,
                min_seconds=MIN_SECONDS):
    """Timed(seconds by qemu-img bench's own timer, CPU seconds of the
    qemu-img process); TooShort under ``min_seconds`` when ``timed``.
    """
    cmd = bench_cmd(opts, count, size, depth, offset, step, write,
                    flush_interval)
    out, cpu = run_counted(cmd)
    seconds = parse_bench(cmd, out)
    if timed:
        _long_enough(cmd, seconds, min_seconds)
    return Timed(seconds, cpu)


def io_script(requests, op='read', pattern=0x5a, report=False,
              last=True):
    """A qemu-io command script: one ``op`` per (offset, length); quiet, or
    with ``report`` each request's machine-readable line (``-C``); ends
    with ``quit`` when it is the ``last`` part of the script.
    """
    flag = '-C' if report else '-q'
    lines = []
    for offset, length in requests:
        if op == 'write':
            lines.append('write %s -P %d %d %d' % (flag, pattern, offset,
                                                   length))
        else:
            lines.append('read %s %d %d' % (flag, offset, length))
    if last:
        lines.append('quit')
    return ''.join(line + '\n' for line in lines)


# qemu-io -C: "bytes,ops,h:mm:ss.ss,bytes/s,ops/s".
_REPORT = re.compile(r'^(?:qemu-io> )*(\d+),(\d+),[0-9:.]+,([0-9.]+),'
                     r'([0-9.]+)$')


def request_seconds(cmd, out, expected):
    """Seconds of each request qemu-io reported (``-C``), in order."""
    seconds = []
    for line in out.splitlines():
        match = _REPORT.match(line.strip())
        if match:
            ops, ops_per_s = int(match.group(2)), float(match.group(4))
            if ops_per_s <= 0:
                raise ToolError(cmd, 'unreadable timing %r' % line)
            seconds.append(ops / ops_per_s)
    if len(seconds) != expected:
        raise ToolError(cmd, '%d request reports, %d expected' % (
            len(seconds), expected))
    return seconds


def qemu_io_timed(opts, requests, op='read', min_seconds=MIN_SECONDS):
    """Timed(seconds of the ``requests`` by qemu-io's per-request timer,
    CPU seconds of the qemu-io process); TooShort under ``min_seconds``.
    """
    (seconds,), cpu = qemu_io_passes(opts, [requests], op, min_seconds)
    return Timed(seconds, cpu)


def qemu_io_passes(opts, passes, op='read', min_seconds=MIN_SECONDS):
    """Run the lists of ``passes`` [[(offset, length)], ...] one after the
    other in one qemu-io process (one open of the disk, so what a pass
    loads into QEMU's caches is there for the next); return ([seconds of
    each pass by qemu-io's per-request timer], CPU seconds of the process).
    TooShort when a pass takes under ``min_seconds``.
    """
    passes = [list(requests) for requests in passes]
    cmd = [QEMU_IO, '--image-opts', opts]
    script = ''.join(io_script(requests, op=op, report=True, last=False)
                     for requests in passes) + 'quit\n'
    out, cpu = run_counted(cmd, script)
    times = request_seconds(cmd, out, sum(len(r) for r in passes))
    return [_long_enough(cmd, seconds, min_seconds) for seconds in
            pass_seconds(times, [len(r) for r in passes])], cpu


def pass_seconds(times, lengths):
    """Sums of the consecutive runs of ``lengths`` items of ``times``."""
    out, start = [], 0
    for length in lengths:
        out.append(sum(times[start:start + length]))
        start += length
    return out


def qemu_io_prepare(opts, requests, op='write'):
    """Run ``requests`` untimed (preparing a disk)."""
    run([QEMU_IO, '--image-opts', opts], io_script(requests, op=op))


def info(path, fmt):
    """``qemu-img info -f fmt`` of a disk the benchmark made (trusted, so
    without the prlimit wrapper nova and the plugin use on image files; the
    format is still the one the benchmark made, never probed).
    """
    out = run([QEMU_IMG, 'info', '-f', fmt, '--output=json', '--force-share',
               path])
    try:
        return json.loads(out)
    except ValueError:
        raise ToolError([QEMU_IMG, 'info', path],
                        'not JSON: %r' % out[-200:])


def filefrag(path):
    """Number of extents of path (FIEMAP, through filefrag)."""
    out = run([FILEFRAG, path])
    match = re.search(r':\s+(\d+) extents? found', out)
    if not match:
        raise ToolError([FILEFRAG, path], 'unexpected output %r' % out[-200:])
    return int(match.group(1))


DIRECT_PROBE_PREFIX = '.bench-direct-probe-'


def check_direct_io(directory, size=None):
    """None when O_DIRECT (cache=none) works in directory, else why not.

    With ``size``, also write ``size`` bytes at offset ``size`` through
    O_DIRECT: a filesystem on a 4K-sector device refuses 512-byte direct
    writes (EINVAL).

    The probe file gets a random name and is created with O_CREAT |
    O_EXCL | O_NOFOLLOW relative to the directory held open, and removed
    through that same descriptor: a name planted or swapped in the
    directory is never opened.
    """
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY |
                         os.O_CLOEXEC)
    except OSError as exc:
        return 'cannot open the directory: %s' % exc
    try:
        name = DIRECT_PROBE_PREFIX + os.urandom(8).hex()
        try:
            fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
        except OSError as exc:
            return 'O_DIRECT open failed: %s' % exc
        try:
            if size:
                # mmap memory is page-aligned, as O_DIRECT wants.
                with mmap.mmap(-1, max(size, mmap.PAGESIZE)) as buf:
                    try:
                        os.pwrite(fd, memoryview(buf)[:size], size)
                    except OSError as exc:
                        return ('%d-byte O_DIRECT writes are refused here: '
                                '%s' % (size, exc))
        finally:
            os.close(fd)
            os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return None
