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

* ``qemu-img bench``: sequential requests with a step, any queue depth;
  timed here by wall clock, image open and final flush included.
* ``qemu-io`` reading a generated command script on stdin: any offsets, in
  any order (``qemu-img bench`` has no random mode), one request at a time.
"""

import json
import os
import re
import subprocess
import time

from oslo_log import log as logging

LOG = logging.getLogger(__name__)

QEMU_IMG = 'qemu-img'
QEMU_IO = 'qemu-io'
FILEFRAG = 'filefrag'
# Generous: the largest default workload takes a few seconds.
TIMEOUT = 900


class ToolError(Exception):
    """A tool failed or printed what we cannot read."""

    def __init__(self, cmd, reason):
        self.cmd = cmd
        self.reason = reason
        super().__init__('%s: %s' % (' '.join(cmd), reason))


def run(cmd, stdin=None):
    """Run cmd (a list) in the C locale; return its stdout."""
    env = dict(os.environ, LC_ALL='C', LANG='C')
    try:
        proc = subprocess.run(cmd, input=stdin, capture_output=True,
                              text=True, env=env, timeout=TIMEOUT)
    except FileNotFoundError:
        raise ToolError(cmd, 'command not found')
    except subprocess.TimeoutExpired:
        raise ToolError(cmd, 'no answer within %d s' % TIMEOUT)
    if proc.returncode != 0:
        raise ToolError(cmd, 'exit code %d: %s' % (
            proc.returncode, (proc.stderr or proc.stdout).strip()[-500:]))
    # Belt and braces: qemu-io reports a failed request on stdout.
    for line in proc.stdout.splitlines():
        if ' failed: ' in line or 'not found' in line:
            raise ToolError(cmd, line.replace('qemu-io> ', '').strip())
    return proc.stdout


def timed(cmd, stdin=None):
    """Run cmd; return its wall-clock seconds."""
    started = time.monotonic()
    run(cmd, stdin)
    return time.monotonic() - started


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
    opts = ['driver=%s' % fmt, 'file.driver=file',
            'file.filename=%s' % _escape(path), 'file.aio=%s' % aio,
            'cache.direct=%s' % ('on' if direct else 'off'),
            'cache.no-flush=%s' % ('off' if flush else 'on')]
    if cache_size and fmt == 'qcow2':
        opts.append('cache-size=%d' % cache_size)
    return ','.join(opts)


def bench_cmd(opts, count, size, depth=16, offset=0, step=None, write=True):
    """A ``qemu-img bench`` command line over the disk of ``opts``."""
    cmd = [QEMU_IMG, 'bench', '--image-opts', '-c', str(count), '-d',
           str(depth), '-s', str(size), '-o', str(offset)]
    if step:
        cmd += ['-S', str(step)]
    if write:
        # A fixed non-zero pattern: zero writes could be optimised away.
        cmd += ['-w', '--pattern=90']
    return cmd + [opts]


def bench(opts, count, size, depth=16, offset=0, step=None, write=True):
    """Seconds ``qemu-img bench`` takes, from start to exit."""
    return timed(bench_cmd(opts, count, size, depth, offset, step, write))


def io_script(requests, op='read', pattern=0x5a):
    """A qemu-io command script: one ``op`` per (offset, length), quiet."""
    lines = []
    for offset, length in requests:
        if op == 'write':
            lines.append('write -q -P %d %d %d' % (pattern, offset, length))
        else:
            lines.append('read -q %d %d' % (offset, length))
    lines.append('quit')
    return '\n'.join(lines) + '\n'


def qemu_io(opts, script):
    """Seconds the requests of ``script`` take in qemu-io.

    qemu-io starts, opens the disk and quits in a second run with an empty
    script; that time is subtracted, so only the requests are counted.
    """
    cmd = [QEMU_IO, '--image-opts', opts]
    total = timed(cmd, script)
    empty = timed(cmd, 'quit\n')
    return max(total - empty, 1e-6)


def info(path):
    """``qemu-img info`` of a disk the benchmark made (trusted, so without
    the prlimit wrapper nova and the plugin use on image files).
    """
    out = run([QEMU_IMG, 'info', '--output=json', '--force-share', path])
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


def check_direct_io(directory):
    """None when O_DIRECT (cache=none) works in directory, else why not."""
    path = os.path.join(directory, '.bench-direct-probe')
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    except OSError as exc:
        return 'O_DIRECT open failed: %s' % exc
    try:
        os.close(fd)
    finally:
        os.unlink(path)
    return None
