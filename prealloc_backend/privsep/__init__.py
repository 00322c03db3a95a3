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

"""The privilege-separation context of prealloc_backend.

One context with one capability, CAP_DAC_OVERRIDE: the daemon opens instance
disks for writing although libvirt (dynamic_ownership) may have chown'ed them
to the qemu user with mode 0600. It needs nothing else: it never changes
owners or modes (no CAP_CHOWN or CAP_FOWNER), never mounts (no
CAP_SYS_ADMIN), and reads only what it opens for writing
(CAP_DAC_READ_SEARCH would add reading any file, which it does not need).

The entrypoints live in prealloc_backend.privsep.fs (what they accept: its
docstring, and doc/source/admin/security.rst); paths are resolved by
prealloc_backend.privsep.beneath. Import prealloc_backend.privsep.fs by its
full path so that privileged calls stand out where they are made.
"""

import errno
import threading

from oslo_log import log as logging
from oslo_privsep import capabilities
from oslo_privsep import priv_context

from prealloc_backend import conf

LOG = logging.getLogger(__name__)


def _watch(channel):
    """Fail the pending calls of a channel whose reader thread ended.

    NOTE(oslo.privsep): comm.ClientChannel._reader_main (3.12, and master
    at 1e31e77) handles only EOF: any other error from the socket ends the
    reader thread, and ECONNRESET is what a daemon killed mid-call leaves.
    The thread then dies without failing the pending calls or setting
    ``running = False``, so the pending call, and every later one, waits
    forever. https://bugs.launchpad.net/bugs/1623286 reported this hang
    for socket.timeout, and its fix (oslo.privsep commit 3b53619) skips
    only that error in comm.Deserializer; ``running``, added for
    https://bugs.launchpad.net/bugs/1715374 (commit e896ed3), is cleared
    only on EOF. No upstream report of the ECONNRESET case was found. So
    do what the EOF branch does: fail the pending calls and mark the
    channel stopped, so that the next call starts a new daemon. Drop this
    when _reader_main handles every socket error.
    """
    channel.reader_thread.join()
    error = OSError(errno.EPIPE, 'the prealloc_backend privsep daemon died')
    with channel.lock:
        for future in channel.outstanding_msgs.values():
            future.set_exception(error)
        channel.running = False


# errnos of a send to a daemon that is gone (its socket closed or reset)
_CHANNEL_GONE = (errno.EPIPE, errno.ECONNRESET)


def _mark_stopped(channel):
    """Mark ``channel`` stopped so that the next call starts a new daemon."""
    with channel.lock:
        channel.running = False


class _PrivContext(priv_context.PrivContext):
    """A PrivContext whose channel cannot outlive its daemon unnoticed."""

    def _wrap(self, func, *args, _wrap_timeout=None, **kwargs):
        """oslo.privsep's _wrap (3.12), but a call whose send found the
        daemon gone marks the channel it used stopped before the error
        propagates.

        NOTE(oslo.privsep): PrivContext._wrap tests ``channel.running``
        only before it sends, and only the reader thread clears it. A call
        sent to a daemon that was just killed fails with EPIPE or
        ECONNRESET from the socket before the reader thread (or _watch,
        after it) has marked the channel stopped; the next call then found
        the channel still "running", was sent into the same dead socket
        and failed too (seen once in
        tests/privileged/test_privsep_daemon_root.py under load). Marking
        it here, in the caller's thread, makes the next call start a new
        daemon whatever the reader thread has done so far. The channel
        marked is the one this call used, never one another thread started
        meanwhile. No upstream report of this race was found (the nearest,
        https://bugs.launchpad.net/bugs/1715374, made the context restart a
        channel already marked stopped).
        """
        if not self.client_mode:
            return func(*args, **kwargs)
        name = '%s.%s' % (func.__module__, func.__name__)
        if self.channel is not None and not self.channel.running:
            LOG.warning('RESTARTING PrivContext for %s', name)
            self.stop()
        if self.channel is None:
            self.start()
        channel = self.channel
        if channel is None:
            raise RuntimeError('channel is not initialized')
        try:
            return channel.remote_call(name, args, kwargs,
                                       _wrap_timeout or self.timeout)
        except OSError as exc:
            if exc.errno in _CHANNEL_GONE:
                LOG.warning('The prealloc_backend privsep daemon is gone '
                            '(%s): the next call starts a new one', exc)
                _mark_stopped(channel)
            raise

    def start(self, method=priv_context.Method.ROOTWRAP):
        super().start(method)
        channel = self.channel
        with self.start_lock:
            if channel is None or getattr(channel, '_prealloc_watched',
                                          False):
                return
            channel._prealloc_watched = True
        threading.Thread(target=_watch, args=(channel,), daemon=True,
                         name='prealloc-privsep-watch').start()

    def stop(self):
        try:
            super().stop()
        except OSError as exc:
            # shutdown() of a socket that the dead daemon reset
            LOG.debug('Closing the privsep channel: %s', exc)
            self.channel = None


ctx = _PrivContext(
    'prealloc_backend',
    cfg_section=conf.PRIVSEP_GROUP,
    pypath=__name__ + '.ctx',
    capabilities=[capabilities.CAP_DAC_OVERRIDE],
)
