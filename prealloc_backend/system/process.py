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

"""The one way prealloc_backend runs a process: :func:`execute` for a
command, :func:`call_in_child` for a Python function in a forked child (the
check's steps run as another user, checks/owner.py). Either way a process
root starts has a deadline: ``call_in_child`` requires one (the user a
child drops to can stop it with SIGSTOP; past the deadline it is killed
with SIGKILL by its PID and reaped).

Everything the plugin runs (qemu-img for nova-compute, fallocate
--dig-holes after a migration, the host checks, the benchmark's tools and
its guest) goes through here, so that every command:

* runs through oslo.concurrency's ``processutils.execute``, as nova's own
  commands do: the same debug log line for each command, the same way of
  setting resource limits (``prlimit``: a Python wrapper sets the limits,
  then execs the command, so the limited process is the command itself);
* runs as ``env LC_ALL=C LANG=C <command>``, as nova runs qemu-img: the
  output is parsed (qemu-img's JSON and messages, ``--version`` lines,
  filefrag's "N extents found") and an operator's locale must not translate
  it or change its number format;
* may have a wall-clock ``timeout``: when it expires the process is killed
  and reaped (processutils alone raises subprocess.TimeoutExpired and
  leaves the process running), then ProcessTimeout is raised;
* fails in one typed way: a non-zero exit, a death by signal or a command
  that cannot be started all raise exception.ProcessFailed, which names the
  command, the exit code and what the command printed on stderr. Callers
  catch that one type (qemu.py turns it into its subclass QemuImgError).

Limits are chosen per command by the caller, not here, because they depend
on what the command does: nova's ``[libvirt] images_cpu_time_limit`` and
``images_address_space_limit`` contain qemu-img on untrusted image files,
and qemu.py keeps both for every command that reads such a file, but lifts
the CPU limit where qemu-img writes the data area itself (``falloc`` and
``full`` preallocation), whose CPU time grows with the disk size; a
wall-clock timeout bounds those instead. Trusted tools (the benchmark's
qemu-img bench on disks it made, the checks' ``--version`` runs) need a
timeout only.

Nothing in prealloc_backend/privsep/ runs a process: the privileged daemon
does its work with system calls only.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback

from oslo_concurrency import processutils
from oslo_log import log as logging

from prealloc_backend import exception

# The resource limits a command may be given (``limits=``): cpu_time
# (seconds), address_space (bytes), ... (oslo.concurrency's ProcessLimits).
Limits = processutils.ProcessLimits

LOG = logging.getLogger(__name__)

C_LOCALE = ('env', 'LC_ALL=C', 'LANG=C')
# Seconds to wait for a killed process to be reaped.
KILL_WAIT = 10


def execute(*cmd, timeout=None, limits=None, stdin=None, cwd=None,
            binary=False):
    """Run ``cmd`` in the C locale; return its stdout.

    :param timeout: seconds (wall clock) after which the process is killed
        and ProcessTimeout raised; None or 0: no limit.
    :param limits: a :data:`Limits` applied to the process (prlimit).
    :param stdin: str or bytes written to the process's standard input.
    :param cwd: directory the process starts in.
    :param binary: return bytes instead of str.
    :raises exception.ProcessFailed: non-zero exit (exit_code < 0: killed
        by that signal), or the command cannot be started.
    :raises exception.ProcessTimeout: ``timeout`` expired (process killed).
    """
    cmd = tuple(str(arg) for arg in cmd)
    shown = ' '.join(cmd)
    started = []
    try:
        out, _err = processutils.execute(
            *(C_LOCALE + cmd), process_input=stdin, cwd=cwd, binary=binary,
            prlimit=limits, timeout=timeout or None,
            on_execute=started.append)
    except processutils.ProcessExecutionError as exc:
        raise exception.ProcessFailed(
            cmd=shown, exit_code=exc.exit_code,
            stderr=(exc.stderr or '').strip(), stdout=exc.stdout or '')
    except OSError as exc:
        # env itself, the prlimit wrapper's Python or cwd is missing (a
        # missing command is env's exit code 127, "No such file").
        raise exception.ProcessFailed(cmd=shown, exit_code=None,
                                      stderr=str(exc), stdout='')
    except BaseException as exc:
        # Timed out, or interrupted (KeyboardInterrupt in the benchmark):
        # never leave the command running behind us (subprocess.run kills
        # it too).
        _kill(started)
        if _is_timeout(exc):
            raise exception.ProcessTimeout(cmd=shown, timeout=timeout)
        raise
    return out


def _is_timeout(exc):
    # NOTE(eventlet): not isinstance(exc, subprocess.TimeoutExpired). Under
    # eventlet (nova's monkey patching, which the tests use), processutils runs
    # eventlet's green Popen, built on a second copy of the subprocess module:
    # its TimeoutExpired is another class of the same name.
    return any(cls.__name__ == 'TimeoutExpired' and
               cls.__module__ == subprocess.__name__
               for cls in type(exc).__mro__)


def _kill(started):
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        try:
            # Bounded: a process stuck in the kernel (D state, a failing
            # disk) must not hold its caller forever.
            proc.wait(timeout=KILL_WAIT)
        except Exception as exc:
            if not _is_timeout(exc):
                raise
            LOG.warning('%(pid)d still alive %(wait)d s after SIGKILL '
                        '(uninterruptible?); not waiting longer',
                        {'pid': proc.pid, 'wait': KILL_WAIT})
        # Not read: a grandchild of the command may hold the pipes open.
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe:
                pipe.close()


def _message(exc):
    if hasattr(exc, 'format_message'):
        return exc.format_message()
    return str(exc)


def _answer_from_child(func, args, answer):
    status = 0
    try:
        data = json.dumps({'result': func(*args)})
    except BaseException as exc:
        status = 1
        data = json.dumps({'error': type(exc).__name__,
                           'message': _message(exc),
                           'traceback': traceback.format_exc()[-4000:]})
    try:
        data = data.encode()
        while data:
            data = data[os.write(answer, data):]
    except BaseException:
        status = 2
    finally:
        # Never return into the caller's code (its cleanups, its tests).
        os._exit(status)


def _reap(pid, wait):
    """waitpid(pid) for at most ``wait`` seconds; the wait status, or None
    when the process is still there (stuck in the kernel).
    """
    end = time.monotonic() + wait
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= end:
            return None
        time.sleep(0.01)


def _kill_child(pid):
    """SIGKILL the unreaped child ``pid`` (its PID cannot be reused before
    it is reaped; a stopped process dies of SIGKILL too, which no user can
    block or catch), then reap it within KILL_WAIT seconds.
    """
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    status = _reap(pid, KILL_WAIT)
    if status is None:
        LOG.warning('%(pid)d still alive %(wait)d s after SIGKILL '
                    '(uninterruptible?); not waiting longer',
                    {'pid': pid, 'wait': KILL_WAIT})
    return status


def call_in_child(func, *args, deadline, what=None, max_answer=1 << 20):
    """Run ``func(*args)`` in a forked child (which may drop privileges:
    nothing of it comes back but its answer) and return ``(reply,
    wait_status)``: reply is ``{'result': what func returned}`` (anything
    JSON carries), ``{'error': class name, 'message': ..., 'traceback':
    ...}`` when it raised, or None when the child ended without a readable
    answer or answered more than ``max_answer`` bytes.

    ``deadline`` (seconds, required): the child must have answered and
    ended by then. A child that dropped to another user can be stopped
    (SIGSTOP) or slowed down by that user; past the deadline it is killed
    with SIGKILL by its PID and reaped, and ProcessTimeout is raised
    naming ``what`` (default: the function's name). Whatever else ends the
    wait (KeyboardInterrupt, any exception) kills and reaps it the same
    way before propagating.
    """
    if not deadline or deadline <= 0:
        raise ValueError('call_in_child needs a positive deadline, got %r'
                         % (deadline,))
    what = what or getattr(func, '__name__', repr(func))
    end = time.monotonic() + deadline
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        # Nothing of the caller's standard streams: a child its user keeps
        # alive (stopped, or in a system call that does not end) must not
        # hold the caller's output open after the caller ended.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        _answer_from_child(func, args, write_end)
    os.close(write_end)
    reaped = False
    chunks, size = [], 0
    try:
        poller = select.poll()
        poller.register(read_end, select.POLLIN | select.POLLHUP)
        while True:
            left = end - time.monotonic()
            if left <= 0 or not poller.poll(max(1, int(left * 1000))):
                if time.monotonic() < end:
                    continue
                raise exception.ProcessTimeout(cmd=what, timeout=deadline)
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            size += len(chunk)
            if size > max_answer:
                chunks = None
                break
            chunks.append(chunk)
        # The answer is complete (or too long): the child must still end
        # by the deadline (it may be stopped right after writing it).
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reaped = True
                break
            if time.monotonic() >= end:
                raise exception.ProcessTimeout(cmd=what, timeout=deadline)
            time.sleep(0.01)
    finally:
        os.close(read_end)
        if not reaped:
            _kill_child(pid)
    if chunks is None:
        return None, status
    try:
        reply = json.loads(b''.join(chunks).decode())
    except ValueError:
        return None, status
    return (reply if isinstance(reply, dict) else None), status
