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

"""What a killed or interrupted adoption leaves, found and recovered.

Shared by ``prealloc-backend adopt`` (first thing of every run) and
nova-compute's start (the driver's init_host, before nova starts any guest
of the host: after a power cut the disk's name must be the complete file
before ``resume_guests_state_on_host_boot`` boots it). Both hold the host's
adopt lock (``instances_path/.prealloc-adopt-<host>.lock``) meanwhile.

Whoever recovers records it, with the kernel's boot ID, in
``.prealloc-adopt-<host>.recovered`` beside the lock. nova-compute's start
waits (RECOVERY_WAIT at most) while an adopt holds the lock, until it can
take the lock and recover itself or the record says this boot's recovery
ran (an adopt recovers as soon as it holds the lock; ``--dry-run``
recovers nothing and holds it for a moment): so that no guest is resumed
from a half-made copy because an adopt timer took the lock first at boot.

Only instances whose libvirt domain this host defines are recovered: with
a shared instances_path the others are another host's.
"""

import fcntl
import glob
import os
import time

from oslo_log import log as logging

from prealloc_backend.adoption import live
from prealloc_backend import exception
from prealloc_backend.system import fileops

LOG = logging.getLogger(__name__)

# The instance's task_state while it is being adopted (nova's field is a
# free string; its API refuses actions in any task state but None).
TASK_STATE = 'prealloc_adopting'
LOCK_NAME = '.prealloc-adopt-%s.lock'
RECOVERED_NAME = '.prealloc-adopt-%s.recovered'
BOOT_ID = '/proc/sys/kernel/random/boot_id'
# Seconds nova-compute's start waits, at most, for a running adopt to
# have recovered (or to end).
RECOVERY_WAIT = 300
# Seconds an adopt waits, at most, for the host's lock (nova-compute's
# start recovering holds it for moments; another adopt, for its run).
LOCK_WAIT = 60
# libvirt's virErrorNumber for an unknown domain (by value: this module
# imports without the libvirt python module).
VIR_ERR_NO_DOMAIN = 42
# Seconds a connection that died waits for libvirtd to answer again (a
# restart: its first connection waits for QEMU's capabilities probe, about
# 8 s on the tier's machines).
RECONNECT_TIMEOUT = 90


class AlreadyRunning(Exception):
    pass


def lock_path(instances_path, host):
    """The adopt lock of ``host`` ([DEFAULT] host) in instances_path: one
    per host, so that hosts sharing instances_path do not wait on each
    other.
    """
    return os.path.join(instances_path, LOCK_NAME % host.replace('/', '_'))


def recovered_path(instances_path, host):
    return os.path.join(instances_path,
                        RECOVERED_NAME % host.replace('/', '_'))


def boot_id():
    """The kernel's ID of this boot."""
    with open(BOOT_ID) as f:
        return f.read().strip()


def mark_recovered(instances_path, host):
    """Record that this boot's recovery ran (the caller holds the lock)."""
    fileops.write_file(recovered_path(instances_path, host), boot_id(),
                       mode=0o600)


def recovered_this_boot(instances_path, host):
    """True when the record says a recovery ran since this boot."""
    try:
        fd = os.open(recovered_path(instances_path, host),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC |
                     os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return os.read(fd, 64).decode(errors='replace').strip() == boot_id()
    except OSError:
        return False
    finally:
        os.close(fd)


def wait_to_recover(instances_path, host, timeout=RECOVERY_WAIT,
                    clock=time.monotonic, sleep=time.sleep):
    """For nova-compute's start: the host's adopt lock, once it is free
    (its descriptor: the caller recovers, then closes it), or None when
    there is nothing to wait for: no adopt ever ran on this host (no lock
    file), or an adopt holding the lock has recovered since this boot.
    Logs once that it waits. Raises AlreadyRunning when, after
    ``timeout`` seconds, an adopt still holds the lock and this boot's
    recovery has not run.
    """
    start = clock()
    said = False
    while True:
        try:
            return host_lock(instances_path, host, create=False)
        except AlreadyRunning:
            pass
        if recovered_this_boot(instances_path, host):
            LOG.info('prealloc_backend: a running prealloc-backend adopt '
                     'has recovered what an interrupted adoption left '
                     'since this boot')
            return None
        if clock() - start > timeout:
            raise AlreadyRunning(
                'a prealloc-backend adopt has held %s for %d s without '
                'recovering since this boot'
                % (lock_path(instances_path, host), timeout))
        if not said:
            LOG.warning('prealloc_backend: a prealloc-backend adopt holds '
                        '%(lock)s: waiting up to %(wait)d s for it to '
                        'recover what an interrupted adoption left (or to '
                        'end) before nova starts any guest',
                        {'lock': lock_path(instances_path, host),
                         'wait': timeout})
            said = True
        sleep(1)


def host_lock(instances_path, host, create=True, wait=0, stop=None,
              clock=time.monotonic, sleep=time.sleep):
    """This host's adopt lock (flock, opened without following a symlink):
    its descriptor; close it to release. Raises AlreadyRunning when it is
    still held after ``wait`` seconds, stopping.Stopped when ``stop`` (a
    stopping.Stop) is requested meanwhile. With ``create`` False, None
    when the lock file does not exist (no adopt ever ran on this host:
    nothing of one can be left).
    """
    path = lock_path(instances_path, host)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC |
                     (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        if create:
            raise
        return None
    deadline = clock() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if stop is not None and stop.requested:
                os.close(fd)
                stop.check()
            if clock() >= deadline:
                os.close(fd)
                raise AlreadyRunning(
                    'another prealloc-backend adopt runs on this host, or '
                    'nova-compute\'s start is recovering (%s is locked%s)'
                    % (path, ', waited %g s' % wait if wait else ''))
        sleep(0.5)


def leftovers(instances_path, uuid='*'):
    """Disk paths under instances_path (of instance ``uuid``, or of all)
    with a journal or a target an adoption left.
    """
    top = glob.escape(instances_path)
    found = set()
    # The journal's temporary file too: a kill inside its write.
    for suffix in (live.JOURNAL_SUFFIX, live.JOURNAL_SUFFIX + '.tmp',
                   live.NEW_SUFFIX, live.ORIG_SUFFIX):
        for path in glob.glob(os.path.join(top, glob.escape(uuid)
                                           if uuid != '*' else '*',
                                           '*' + suffix)):
            found.add(path[:-len(suffix)])
    return sorted(found)


def lookup(conn, uuid):
    """The libvirt domain of ``uuid`` on ``conn``, or None when libvirt
    says there is none (any other error is raised).
    """
    try:
        return conn.lookupByUUIDString(uuid)
    except Exception as exc:
        code = getattr(exc, 'get_error_code', None)
        if code is not None and code() == VIR_ERR_NO_DOMAIN:
            return None
        raise


class Connection(object):
    """The command's libvirt connection, opened again (same URI) when it
    no longer answers: a restarted libvirtd's clients stay dead, while its
    guests and their block jobs run on.
    """

    def __init__(self, conn, opener=None, timeout=RECONNECT_TIMEOUT):
        self.uri = conn.getURI()
        self._conn = conn
        self._opener = opener
        self.timeout = timeout
        # Why libvirtd was given up on: later calls fail at once (a run
        # of --all does not wait again for each instance).
        self.gone = None

    def _open(self):
        if self._opener is not None:
            return self._opener(self.uri)
        import libvirt
        return libvirt.open(self.uri)

    def get(self):
        """A connection that answered just now."""
        try:
            self._conn.getLibVersion()
            return self._conn
        except Exception:
            pass
        try:
            self._conn.close()
        except Exception:
            pass
        if self.gone is not None:
            raise exception.PreallocError(reason=self.gone)
        LOG.warning('libvirt connection to %s lost: opening it again',
                    self.uri)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self._conn = self._open()
                self._conn.getLibVersion()
                return self._conn
            except Exception as exc:
                if time.monotonic() > deadline:
                    self.gone = ('libvirtd on %s did not answer again '
                                 'within %d s: %s'
                                 % (self.uri, self.timeout, exc))
                    raise exception.PreallocError(reason=self.gone)
            time.sleep(1)

    def lookup(self, uuid):
        return lookup(self.get(), uuid)

    def close(self):
        try:
            self._conn.close()
        except Exception:
            pass


def recover_all(conn, instances_path, say, failed):
    """live.recover for each disk an adoption left, of the domains this
    host defines; ``say(text)`` and ``failed(text)`` report. Returns the
    paths it could not recover (another host's are not counted).
    """
    unrecovered = []
    for path in leftovers(instances_path):
        uuid = os.path.basename(os.path.dirname(path))
        try:
            domain = lookup(conn, uuid)
            if domain is None:
                say('%s: left by an adoption, but this host defines no '
                    'domain %s (another host\'s, or deleted): left as it '
                    'is' % (path, uuid))
                continue
            done = live.recover(domain, path)
        except Exception as exc:
            failed('%s: could not recover an interrupted adoption: %s'
                   % (path, exc))
            unrecovered.append(path)
            continue
        if done:
            say('%s: %s' % (path, done))
    return unrecovered


def release(instance):
    """Put the instance's task_state back to None if it is ours."""
    from nova import exception as nova_exception
    instance.task_state = None
    try:
        instance.save(expected_task_state=[TASK_STATE])
    except (nova_exception.UnexpectedTaskStateError,
            nova_exception.InstanceNotFound):
        pass   # deleted, or someone else's now


def release_stale_claims(context, host, instances_path, say):
    """Task states a killed adopt left on ``host``'s instances, where
    nothing of an adoption is left beside their disks (recover_all ran;
    what it could not recover keeps the claim, so that nova moves no
    half-adopted disk).
    """
    from nova import objects
    for instance in objects.InstanceList.get_by_host(context, host):
        if instance.task_state != TASK_STATE:
            continue
        if leftovers(instances_path, instance.uuid):
            say('instance %s: task_state %s kept: an interrupted adoption '
                'is left beside its disks' % (instance.uuid, TASK_STATE))
            continue
        release(instance)
        say('instance %s: task_state %s left by a killed adopt cleared'
            % (instance.uuid, TASK_STATE))
