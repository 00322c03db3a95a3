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

"""A long command stops on its first SIGINT or SIGTERM, every time.

Use::

    from prealloc_backend.system import stopping

    with stopping.on_signals() as stop:
        try:
            for step in steps:
                stop.check()          # raises stopping.Stopped
                run(step)             # its child processes are killed
        except stopping.Stopped:
            ...                       # what finished is known here
    report(...)
    return DOCUMENTED_STATUS if stop.requested else 0

What happens on the first SIGINT or SIGTERM inside ``on_signals()``:

* the signal handler only records the signal (``stop.signum``): it raises
  nothing. An exception raised from a handler surfaces wherever the main
  thread happens to be, and where that is a ``__del__``, an at-fork
  callback (logging's ``_releaseLock`` runs after every fork with a
  ``preexec_fn``, which oslo.concurrency's execute uses) or a weakref
  callback, Python prints "Exception ignored" and carries on: the command
  did not stop (issue 36);
* ``signal.set_wakeup_fd`` wakes a watcher thread at once, even when the
  main thread is blocked waiting for a child: the watcher stops (SIGSTOP)
  then kills (SIGKILL) every descendant of this process, found through
  ``/proc/<pid>/task/*/children`` recursively, and every process group one
  of them leads; it keeps doing so every POLL seconds until the context
  ends, so a child started after the signal dies as well. The owner of a
  killed child (``subprocess``, oslo.concurrency) reaps it and sees it
  killed by SIGKILL; any direct child still there when the context ends
  is killed and reaped then;
* the command's loop calls ``stop.check()`` (or :func:`check`, which
  checks the context in force) between its steps, and ``Stopped`` is
  raised there, from normal flow. ``Stopped`` derives from BaseException,
  as KeyboardInterrupt does, so that no ``except Exception`` swallows it;
* a second signal changes nothing: the stop is already under way.

:func:`pause_point` is a test hook: tests/integration/test_bench_signals.py
sets ``PREALLOC_TEST_PAUSE_AT`` to make a command wait at a named point
(in an at-fork callback, a ``__del__``, a logging handler...) and send it
a signal there. Unset, it costs one dictionary lookup.
"""

import contextlib
import glob
import logging
import os
import select
import signal
import sys
import threading
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Seconds between two sweeps of the watcher once a stop is requested.
POLL = 0.05
# Seconds to wait for a killed direct child to be reaped.
REAP_WAIT = 10
# The byte that tells the watcher to end (no signal has number 0).
_QUIT = 0

_active = None


class Stopped(BaseException):
    """The command was asked to stop (SIGINT or SIGTERM): raised by
    Stop.check(), never by a signal handler.
    """

    def __init__(self, signum):
        self.signum = signum
        super().__init__('stopped by %s' % signal_name(signum))

    @property
    def status(self):
        """128 + the signal's number (130: SIGINT, 143: SIGTERM), the
        status a shell gives a command the signal killed.
        """
        return exit_status(self.signum)


def signal_name(signum):
    """'SIGTERM' for 15."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return 'signal %d' % signum


def exit_status(signum):
    """128 + signum: the status a shell reports for a command that
    signal ended (130 for SIGINT, 143 for SIGTERM).
    """
    return 128 + signum


class Stop:
    """A stop request: ``signum`` is the first signal received (None until
    one comes); SIGALRM with ``timed_out`` when on_signals()' deadline
    passed first.
    """

    def __init__(self):
        self.signum = None
        self.timed_out = False
        # The deadline's length in seconds, for the messages.
        self.timeout = None
        # PIDs the watcher killed, in order.
        self.killed = []

    @property
    def cause(self):
        """What stopped the command, in words ('SIGTERM', 'its deadline of
        60 s'); None when nothing did.
        """
        if self.signum is None:
            return None
        if self.timed_out:
            return 'its deadline of %g s' % self.timeout
        return signal_name(self.signum)

    @property
    def requested(self):
        return self.signum is not None

    def request(self, signum):
        """Record a stop (the first signal wins). Safe in a signal
        handler: one attribute test and assignment, no lock.
        """
        if self.signum is None:
            self.signum = signum

    def request_timeout(self):
        """Record a stop for the deadline, unless a signal came first."""
        self.request(signal.SIGALRM)
        if self.signum == signal.SIGALRM:
            self.timed_out = True

    def check(self):
        """Raise Stopped if a stop was requested."""
        if self.signum is not None:
            raise Stopped(self.signum)

    @property
    def status(self):
        """exit_status() of the signal received; None without one."""
        return None if self.signum is None else exit_status(self.signum)


def active():
    """The Stop of the on_signals() context in force, or None."""
    return _active


def requested():
    """True when the context in force was asked to stop."""
    return _active is not None and _active.requested


def check():
    """Raise Stopped when the context in force was asked to stop; nothing
    outside on_signals().
    """
    if _active is not None:
        _active.check()


# -- the processes of this one ---------------------------------------------

def children(pid):
    """PIDs of the children of ``pid`` (every thread's), from /proc."""
    found = []
    for path in glob.glob('/proc/%d/task/*/children' % pid):
        try:
            with open(path) as f:
                found.extend(int(p) for p in f.read().split())
        except (OSError, ValueError):
            # The thread or the process ended meanwhile.
            continue
    return found


def descendants(pid=None):
    """PIDs of every descendant of ``pid`` (default: this process),
    parents before their children.
    """
    pid = os.getpid() if pid is None else pid
    out, todo = [], children(pid)
    while todo:
        child = todo.pop(0)
        if child in out:
            continue
        out.append(child)
        todo.extend(children(child))
    return out


def _signal(pid, signum):
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _group_of(pid):
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def kill_descendants():
    """Kill every descendant of this process (and every process group one
    of them leads): each is stopped first (SIGSTOP: a stopped process
    cannot fork one more), the tree read again until nothing new is in it,
    then all are killed (SIGKILL). Returns the PIDs signalled.
    """
    ours = os.getpgrp()
    seen, groups = [], set()
    for _round in range(100):
        new = [pid for pid in descendants() if pid not in seen]
        if not new:
            break
        for pid in new:
            group = _group_of(pid)
            if group == pid and group != ours:
                groups.add(group)
            _signal(pid, signal.SIGSTOP)
            seen.append(pid)
    for pid in seen:
        _signal(pid, signal.SIGKILL)
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return seen


def reap_children(wait=REAP_WAIT):
    """Kill and reap the direct children of this process still there
    (call it only when no code of this process waits for them any more).
    Returns their PIDs.
    """
    pids = children(os.getpid())
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait
    for pid in pids:
        while True:
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    return pids


def seconds_since_start():
    """Seconds since this process started (its start time in /proc, the
    kernel's: the interpreter's start and the imports included).
    """
    with open('/proc/self/stat') as f:
        # After the command name, which may hold spaces and parentheses.
        fields = f.read().rsplit(')', 1)[1].split()
    with open('/proc/uptime') as f:
        uptime = float(f.read().split()[0])
    return uptime - int(fields[19]) / os.sysconf('SC_CLK_TCK')


def _watch(stop, read_fd, signals, deadline=None):
    while True:
        # A short timeout also once the handler alone saw the signal.
        wait = POLL if stop.requested else 0.2
        if deadline is not None and not stop.requested:
            wait = max(0, min(wait, deadline - time.monotonic()))
        ready, _, _ = select.select([read_fd], [], [], wait)
        if (deadline is not None and not stop.requested and
                time.monotonic() >= deadline):
            stop.request_timeout()
        quit = False
        if ready:
            try:
                data = os.read(read_fd, 512)
            except BlockingIOError:
                data = b''
            for number in data:
                if number == _QUIT:
                    quit = True
                elif number in signals:
                    stop.request(number)
        if stop.requested:
            stop.killed.extend(kill_descendants())
        if quit:
            return


@contextlib.contextmanager
def on_signals(signals=SIGNALS, timeout=None):
    """Within the context, SIGINT and SIGTERM (``signals``) request a stop
    instead of their usual effect; yields the Stop (see the module's
    docstring). With ``timeout`` (seconds from now), its end requests a
    stop as a signal does (Stop.timed_out): the command's children are
    killed whatever they do. Enter it in the main thread, one at a time;
    the previous handlers and wakeup fd are back after it.
    """
    global _active
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError('on_signals() must be entered in the main thread')
    if _active is not None:
        raise RuntimeError('on_signals() is already in force')
    stop = Stop()
    stop.timeout = timeout
    deadline = None if timeout is None else time.monotonic() + timeout
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    numbers = {int(s) for s in signals}

    def handler(signum, frame):
        # Nothing else: see the module's docstring.
        stop.request(signum)

    # The wakeup fd first: a signal that finds the handler finds it too.
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {}
    try:
        for signum in signals:
            previous[signum] = signal.signal(signum, handler)
        watcher = threading.Thread(target=_watch, name='stopping-watcher',
                                   args=(stop, read_fd, numbers,
                                         deadline),
                                   daemon=True)
        watcher.start()
        _active = stop
        try:
            yield stop
        finally:
            os.write(write_fd, bytes([_QUIT]))
            watcher.join()
            if stop.requested:
                stop.killed.extend(kill_descendants())
                reap_children()
            _active = None
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        signal.set_wakeup_fd(previous_fd)
        os.close(read_fd)
        os.close(write_fd)


# -- test hooks --------------------------------------------------------------

PAUSE_ENV = 'PREALLOC_TEST_PAUSE_AT'
# Longest pause at a test point.
PAUSE_SECONDS = 30
_paused = set()


def _pause(name):
    if name in _paused:
        return
    _paused.add(name)
    sys.stderr.write('stopping: paused at %s\n' % name)
    sys.stderr.flush()
    deadline = time.monotonic() + PAUSE_SECONDS
    while time.monotonic() < deadline and not requested():
        time.sleep(0.01)


class _PausesWhenDropped:
    def __init__(self, name):
        self.name = name

    def __del__(self):
        _pause(self.name)


class _PausingHandler(logging.Handler):
    def emit(self, record):
        # Called with the handler's lock held.
        _pause('logging')


def pause_point(name):
    """Test hook: when ``PREALLOC_TEST_PAUSE_AT`` is ``name``, say
    "stopping: paused at NAME" on stderr and wait (PAUSE_SECONDS at most,
    until a stop is requested); ``NAME:del``: the same inside an object's
    ``__del__``. Each point pauses once per process.
    """
    wanted = os.environ.get(PAUSE_ENV)
    if not wanted:
        return
    if wanted == name:
        _pause(name)
    elif wanted == name + ':del':
        # Made and dropped: its __del__ runs here.
        _PausesWhenDropped(wanted)


def test_point(name):
    """Test hook: True the first time it is called with the ``name``
    ``PREALLOC_TEST_PAUSE_AT`` gives (after saying "stopping: at NAME" on
    stderr), else False: the caller does what the test wants there.
    """
    if os.environ.get(PAUSE_ENV) != name or name in _paused:
        return False
    _paused.add(name)
    sys.stderr.write('stopping: at %s\n' % name)
    sys.stderr.flush()
    return True


def install_test_hooks():
    """Test hook: ``PREALLOC_TEST_PAUSE_AT=after-fork`` pauses in an
    at-fork callback of the parent (where logging releases its lock after
    each fork), ``=logging`` in a logging handler's emit (its lock held)
    the first time a message of prealloc_backend is logged at INFO or
    above. Nothing without it.
    """
    wanted = os.environ.get(PAUSE_ENV)
    if wanted == 'after-fork':
        os.register_at_fork(after_in_parent=lambda: _pause('after-fork'))
    elif wanted == 'logging':
        logger = logging.getLogger('prealloc_backend')
        logger.setLevel(logging.INFO)
        logger.addHandler(_PausingHandler())
