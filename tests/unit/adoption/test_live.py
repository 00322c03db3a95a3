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

"""What recover() does with what an interrupted adoption left.

Real files in a temporary directory, and real image locks: "QEMU holds a
file" is an open file description of this process holding the lock QEMU
takes on its write-permission byte (fileops.QEMU_WRITER_BYTE), which
recover reads as it reads QEMU's. The libvirt domain is a fake (this tier
has no libvirtd): it records the block job calls and says whether a job
runs and whether the guest is paused. The same paths against a real
libvirtd and QEMU, with the copying process SIGKILLed, are in
tests/functional/real/test_adopt.py.
"""

import json
import os

import fixtures

from prealloc_backend.adoption import live
from prealloc_backend import exception
from prealloc_backend.system import fileops
from tests import base

# The running domain's ID (one per QEMU process).
DOMAIN_ID = 7


class FakeDomain:

    def __init__(self, path, active=True, job=False, paused=False,
                 dev='vda', on_abort=None):
        self.path = path
        self.dev = dev
        self.active = active
        self.job = job
        self.paused = paused
        self.on_abort = on_abort
        self.calls = []

    def ID(self):
        return DOMAIN_ID if self.active else -1

    def isActive(self):
        return self.active

    def XMLDesc(self, flags):
        return ("<domain><devices><disk type='file' device='disk'>"
                "<source file='%s'/><target dev='%s'/></disk></devices>"
                "</domain>" % (self.path, self.dev))

    def blockJobInfo(self, dev, flags):
        return {'cur': 1, 'end': 1} if self.job else {}

    def blockJobAbort(self, dev, flags):
        self.calls.append(('abort', dev, flags))
        self.job = False
        if self.on_abort:
            # QEMU closes the copy's target when the copy is aborted.
            self.on_abort()

    def info(self):
        return [live.DOMAIN_PAUSED if self.paused else live.DOMAIN_RUNNING]

    def state(self):
        return ([live.DOMAIN_PAUSED, live.PAUSED_USER] if self.paused
                else [live.DOMAIN_RUNNING, 1])

    def resume(self):
        self.calls.append(('resume',))
        self.paused = False


class _DiskFiles(base.TestCase):
    """An instance directory: the disk, its copy and journal, and QEMU's
    image locks on them.
    """

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.path = os.path.join(self.dir, 'disk')
        self.orig = self.path + live.ORIG_SUFFIX
        self.new = self.path + live.NEW_SUFFIX

    def write(self, path, text):
        with open(path, 'w') as f:
            f.write(text)

    def read(self, path):
        with open(path) as f:
            return f.read()

    def qemu_holds(self, path):
        """Hold QEMU's write lock on ``path``; returns what releases it."""
        fd = os.open(path, os.O_RDONLY)
        fileops.ofd_lock_shared(fd, fileops.QEMU_WRITER_BYTE)
        held = [fd]

        def release():
            if held:
                os.close(held.pop())
        self.addCleanup(release)
        return release

    def journal(self, phase, paused=False, dev='vda', domain_id=DOMAIN_ID):
        self.write(live.journal_path(self.path),
                   json.dumps({'phase': phase, 'dev': dev,
                               'paused': paused,
                               'domain_id': domain_id if paused else None}))

    def domain(self, **kwargs):
        return FakeDomain(self.path, **kwargs)

    def left(self):
        return sorted(os.listdir(self.dir))


class TestRecover(_DiskFiles):

    def test_nothing_to_do(self):
        self.write(self.path, 'guest')
        self.assertIsNone(live.recover(self.domain(), self.path))
        self.assertEqual(['disk'], self.left())

    def test_journal_cut_before_its_rename_is_removed(self):
        # A kill inside the journal's write (fileops.write_file), before
        # its rename: only its temporary file, no target.
        self.write(self.path, 'guest')
        self.write(live.journal_path(self.path) + '.tmp', '{"pha')
        self.assertIn('a journal never written',
                      live.recover(self.domain(), self.path))
        self.assertEqual(['disk'], self.left())
        self.assertEqual('guest', self.read(self.path))

    def test_target_never_swapped_in_is_removed(self):
        self.write(self.path, 'guest')
        self.write(self.new, 'target')
        self.assertIn('never used', live.recover(self.domain(), self.path))
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_copy_running_is_aborted_and_undone(self):
        self.write(self.orig, 'guest')
        self.write(self.path, 'half a copy')
        self.qemu_holds(self.orig)
        release = self.qemu_holds(self.path)
        self.journal(live.SWAPPED)
        domain = self.domain(job=True, on_abort=release)
        self.assertIn('copy undone', live.recover(domain, self.path))
        # The copy aborted, never pivoted.
        self.assertEqual([('abort', 'vda', 0)], domain.calls)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_killed_while_paused_before_the_pivot(self):
        # The guest paused on the original file; the next run undoes the
        # copy and resumes it.
        self.write(self.orig, 'guest')
        self.write(self.path, 'copy')
        self.qemu_holds(self.orig)
        release = self.qemu_holds(self.path)
        self.journal(live.SWAPPED, paused=True)
        domain = self.domain(job=True, paused=True, on_abort=release)
        self.assertIn('resumed', live.recover(domain, self.path))
        self.assertEqual([('abort', 'vda', 0), ('resume',)], domain.calls)
        self.assertEqual('guest', self.read(self.path))

    def test_killed_after_the_pivot_before_the_journal(self):
        # QEMU holds the new file alone: the pivot happened; the journal
        # still says swapped. The new file is the disk.
        self.write(self.orig, 'old')
        self.write(self.path, 'guest')
        self.qemu_holds(self.path)
        self.journal(live.SWAPPED, paused=True)
        domain = self.domain(paused=True)
        self.assertIn('pivot completed', live.recover(domain, self.path))
        self.assertEqual([('resume',)], domain.calls)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_swapped_killed_between_the_renames(self):
        self.write(self.orig, 'guest')
        self.write(self.new, 'target')
        self.qemu_holds(self.orig)
        self.journal(live.SWAPPED)
        live.recover(self.domain(), self.path)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_swapped_killed_before_the_renames(self):
        self.write(self.path, 'guest')
        self.write(self.new, 'target')
        self.qemu_holds(self.path)
        self.journal(live.SWAPPED)
        live.recover(self.domain(), self.path)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_swapped_after_a_power_cut(self):
        # No QEMU: before 'pivoted' the original file is the disk, even if
        # the pivot had happened (the guest wrote nothing since its pause).
        self.write(self.orig, 'guest')
        self.write(self.path, 'copy')
        self.journal(live.SWAPPED, paused=True)
        live.recover(self.domain(active=False), self.path)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_pivoted_after_a_power_cut_keeps_the_new_file(self):
        self.write(self.orig, 'old')
        self.write(self.path, 'guest')
        self.journal(live.PIVOTED, paused=True)
        live.recover(None, self.path)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_pivoted_resumes_the_guest_it_paused(self):
        self.write(self.orig, 'old')
        self.write(self.path, 'guest')
        self.qemu_holds(self.path)
        self.journal(live.PIVOTED, paused=True)
        domain = self.domain(paused=True)
        live.recover(domain, self.path)
        self.assertEqual([('resume',)], domain.calls)

    def test_a_guest_not_paused_by_adopt_stays_paused(self):
        self.write(self.path, 'guest')
        self.qemu_holds(self.path)
        self.journal(live.PIVOTED, paused=False)
        domain = self.domain(paused=True)
        live.recover(domain, self.path)
        self.assertEqual([], domain.calls)

    def test_qemu_started_from_the_copy_is_left_alone(self):
        # After a crash something booted the guest from the disk's name
        # (the copy) while the journal says the original is the disk and
        # the adoption never paused it (so never pivoted): no file is
        # renamed or removed, the journal stays.
        self.write(self.orig, 'guest')
        self.write(self.path, 'copy')
        self.qemu_holds(self.path)
        self.journal(live.SWAPPED)
        self.assertRaisesRegex(exception.PreallocError, 'left as it is',
                               live.recover, self.domain(), self.path)
        self.assertEqual('guest', self.read(self.orig))
        self.assertEqual('copy', self.read(self.path))
        self.assertIn('disk.prealloc-adopt', self.left())

    def test_a_new_qemu_on_the_copy_is_not_a_pivot(self):
        # The adoption had paused a QEMU (ID 7); the one on the copy now is
        # another (started from the disk's name): left as it is.
        self.write(self.orig, 'guest')
        self.write(self.path, 'copy')
        self.qemu_holds(self.path)
        self.journal(live.SWAPPED, paused=True, domain_id=3)
        self.assertRaisesRegex(exception.PreallocError, 'left as it is',
                               live.recover, self.domain(), self.path)
        self.assertEqual('guest', self.read(self.orig))

    def test_no_lock_on_either_file_is_refused(self):
        # A running guest and no image lock on either file (locking off):
        # nothing tells which file it runs on.
        self.write(self.orig, 'guest')
        self.write(self.path, 'copy')
        self.journal(live.SWAPPED)
        self.assertRaisesRegex(exception.PreallocError, 'locking off',
                               live.recover, self.domain(), self.path)
        self.assertEqual(['disk', 'disk.prealloc-adopt',
                          'disk.prealloc-adopt-orig'], self.left())

    def test_journal_naming_another_disk_is_refused(self):
        self.write(self.orig, 'guest')
        self.write(self.path, 'copy')
        self.qemu_holds(self.orig)
        self.journal(live.SWAPPED, dev='vdb')
        domain = self.domain(job=True)
        self.assertRaisesRegex(exception.PreallocError, "'vdb'",
                               live.recover, domain, self.path)
        self.assertEqual([], domain.calls)

    def test_offline_rewrite_leftover_removed(self):
        self.write(self.path, 'guest')
        self.write(self.path + '.prealloc-tmp', 'half a rewrite')
        live.begin_offline(self.path)
        self.assertIn('offline', live.recover(None, self.path))
        self.assertEqual(['disk'], self.left())

    def test_journals_the_old_code_wrote_are_recovered(self):
        # The bytes adoption's own journal writer wrote before it became
        # disk/journal.py's JournalFile (no pid): a fleet's adopt killed
        # before the upgrade left them, the upgraded one recovers them.
        old = ('{"phase": "%s", "dev": "vda", "paused": true, '
               '"domain_id": 7, "time": 1764403200.5}')
        self.write(self.orig, 'old')
        self.write(self.path, 'guest')
        self.qemu_holds(self.path)
        self.write(live.journal_path(self.path), old % live.PIVOTED)
        domain = self.domain(paused=True)
        self.assertIn('pivot completed', live.recover(domain, self.path))
        self.assertEqual(([('resume',)], ['disk'], 'guest'),
                         (domain.calls, self.left(), self.read(self.path)))
        self.write(self.path + '.prealloc-tmp', 'half a rewrite')
        self.write(live.journal_path(self.path),
                   '{"phase": "offline", "dev": null, "paused": false, '
                   '"domain_id": null, "time": 1764403200.5}')
        self.assertIn('offline', live.recover(None, self.path))
        self.assertEqual(['disk'], self.left())

    def test_the_journal_written_now(self):
        live._journal(self.path, live.SWAPPED, 'vda', paused=True,
                      domain_id=DOMAIN_ID)
        journal = live.journal_path(self.path)
        self.assertEqual(self.path + '.prealloc-adopt', journal)
        self.assertEqual(0o600, os.stat(journal).st_mode & 0o777)
        record = json.loads(self.read(journal))
        self.assertEqual(
            {'phase': 'swapped', 'dev': 'vda', 'paused': True,
             'domain_id': DOMAIN_ID, 'pid': os.getpid()},
            {k: v for k, v in record.items() if k != 'time'})
        self.assertEqual(record, live.read_journal(self.path))
        live._end_journal(self.path)
        self.assertEqual([], self.left())

    def test_unreadable_journal_leaves_everything(self):
        self.write(self.orig, 'guest')
        self.write(self.path, 'half a copy')
        self.write(live.journal_path(self.path), '{"phase": "sideways"}')
        self.assertRaisesRegex(exception.PreallocError, 'sideways',
                               live.recover, self.domain(), self.path)
        for text in ('not json', '["swapped"]', '{"dev": "vda"}',
                     '[' * 100000):
            self.write(live.journal_path(self.path), text)
            self.assertRaisesRegex(exception.PreallocError, 'unreadable',
                                   live.recover, self.domain(), self.path)
        self.assertEqual('guest', self.read(self.orig))
        self.assertEqual(3, len(self.left()))


class LostConnection(Exception):
    """What libvirt raises on a connection whose libvirtd went away."""


class CopyingDomain(FakeDomain):
    """A domain whose connection dies (libvirtd restarted) after
    ``calls_left`` looks at the copy.
    """

    def __init__(self, path, calls_left):
        super().__init__(path)
        self.calls_left = calls_left

    def blockCopy(self, dev, dest, params, flags):
        self.calls.append(('copy', dev, flags))
        self.job = True

    def XMLDesc(self, flags):
        if self.calls_left <= 0:
            raise LostConnection('Cannot write data: Broken pipe')
        return ("<domain><devices><disk type='file' device='disk'>"
                "<source file='%s'/><target dev='%s'/>%s</disk></devices>"
                "</domain>" % (self.path, self.dev,
                               "<mirror ready='no'/>" if self.job else ''))

    def blockJobInfo(self, dev, flags):
        if self.calls_left <= 0:
            raise LostConnection('Cannot write data: Broken pipe')
        self.calls_left -= 1
        return {'cur': 0, 'end': 1}

    def connect(self):
        if self.calls_left <= 0:
            raise LostConnection('internal error: client socket is closed')
        return self


class TestLibvirtdRestart(_DiskFiles):
    """libvirtd restarted during the copy: QEMU and the copy run on, the
    command's connection is dead; the undo goes through a new one.
    """

    def start(self):
        self.write(self.path, 'guest')
        self.qemu_holds(self.path)
        self.write(self.new, 'preallocated')

    def test_copy_undone_through_a_new_connection(self):
        self.start()
        dead = CopyingDomain(self.path, calls_left=2)
        # The new libvirtd found the copy QEMU still runs.
        fresh = self.domain(job=True)
        reconnects = []

        def reconnect():
            reconnects.append(True)
            return fresh

        exc = self.assertRaises(live.AdoptionFailed, live.adopt_running,
                                dead, 'vda', self.path, self.new,
                                reconnect=reconnect)
        self.assertIn("libvirtd's connection was lost", str(exc))
        self.assertIn('stays on its original disk', str(exc))
        self.assertEqual([True], reconnects)
        self.assertEqual([('abort', 'vda', 0)], fresh.calls)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_without_reconnect_the_journal_stays(self):
        self.start()
        dead = CopyingDomain(self.path, calls_left=1)
        self.assertRaises(LostConnection, live.adopt_running,
                          dead, 'vda', self.path, self.new)
        # Nothing could be undone: everything stays for the next run.
        self.assertEqual(['disk', 'disk.prealloc-adopt',
                          'disk.prealloc-adopt-orig'], self.left())
        self.assertEqual('guest', self.read(self.orig))

    def test_libvirt_back_without_the_domain_leaves_everything(self):
        self.start()
        dead = CopyingDomain(self.path, calls_left=2)
        self.assertRaises(LostConnection, live.adopt_running,
                          dead, 'vda', self.path, self.new,
                          reconnect=lambda: None)
        # recover would have had the journal alone, not QEMU's locks.
        self.assertEqual(['disk', 'disk.prealloc-adopt',
                          'disk.prealloc-adopt-orig'], self.left())

    def pivoted(self):
        # After the pivot: QEMU on the new file (at the disk's name), the
        # guest paused by the adoption, the journal says pivoted.
        self.write(self.orig, 'guest')
        self.write(self.path, 'preallocated with the guest')
        self.qemu_holds(self.path)
        self.journal(live.PIVOTED, paused=True)

    def test_resume_lost_after_the_pivot_is_done_through_a_new_one(self):
        self.pivoted()
        dead = CopyingDomain(self.path, calls_left=0)
        fresh = self.domain(paused=True)
        domain, running = live._resume_after_loss(
            dead, self.path, lambda: fresh, LostConnection('gone'))
        self.assertIs(fresh, domain)
        self.assertTrue(running)
        self.assertEqual([('resume',)], fresh.calls)
        self.assertEqual(['disk'], self.left())

    def test_resume_lost_and_libvirtd_not_back_says_paused(self):
        self.pivoted()
        dead = CopyingDomain(self.path, calls_left=0)

        def reconnect():
            raise exception.PreallocError(reason='did not answer again')

        exc = self.assertRaises(live.AdoptionFailed, live._resume_after_loss,
                                dead, self.path, reconnect,
                                LostConnection('gone'))
        self.assertIn('stays PAUSED', str(exc))
        # Everything stays for the next run (or nova-compute's start).
        self.assertEqual(['disk', 'disk.prealloc-adopt',
                          'disk.prealloc-adopt-orig'], self.left())


class Clock:
    """A clock the test moves: ``step`` seconds per reading."""

    def __init__(self, step):
        self.now = 0.0
        self.step = step

    def __call__(self):
        self.now += self.step
        return self.now


class BusyDomain(FakeDomain):
    """A running guest's copy whose bytes left follow ``left(n)`` at the
    n-th look (a guest writing faster than the copy's rate: they never
    reach a new low). Records the calls; the copy never comes into step.
    """

    def __init__(self, path, left):
        super().__init__(path)
        self.left = left
        # What it has copied by the n-th look (QEMU's cur).
        self.copied = lambda n: 2 ** 20 * n
        self.looks = 0

    def blockCopy(self, dev, dest, params, flags):
        self.calls.append(('copy', dev, dict(params)))
        self.job = True

    def blockJobInfo(self, dev, flags):
        if not self.job:
            return {}
        self.looks += 1
        if self.looks > 1000:
            # A copy the adoption never gives up: fail, not hang.
            raise AssertionError('still copying after 1000 looks')
        copied = self.copied(self.looks)
        return {'cur': copied, 'end': copied + self.left(self.looks)}

    def XMLDesc(self, flags):
        return ("<domain><devices><disk type='file' device='disk'>"
                "<driver type='qcow2'/><source file='%s'/><target dev='%s'/>"
                "%s</disk></devices></domain>"
                % (self.path, self.dev,
                   "<mirror ready='no'/>" if self.job else ''))


class TestCopyThatDoesNotConverge(_DiskFiles):
    """A copy kept from coming into step ends within its bounds, undone:
    the guest on its original disk, nothing left over. Real files and
    image locks; the domain is a fake (see BusyDomain) and the clock the
    test's.
    """

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.MockPatch('time.sleep'))
        self.write(self.path, 'guest')
        self.release = self.qemu_holds(self.path)
        self.write(self.new, 'preallocated')

    def adopt(self, domain, limits):
        def abort(dev, flags):
            domain.calls.append(('abort', dev, flags))
            domain.job = False
        domain.blockJobAbort = abort
        return self.assertRaises(live.NotConverging, live.adopt_running,
                                 domain, 'vda', self.path, self.new,
                                 bandwidth=2 ** 20, limits=limits)

    def assert_undone(self, domain):
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())
        # Aborted, never pivoted.
        self.assertIn(('abort', 'vda', 0), domain.calls)
        self.assertNotIn(('abort', 'vda', live.BLOCK_JOB_ABORT_PIVOT),
                         domain.calls)

    def test_no_new_low_for_the_stall_time(self):
        # The bytes left grow: the guest writes faster than the rate (1
        # MiB/s: QEMU's 16 MiB burst is paid back in 16 s, which the stall
        # time is allowed beyond its 30 s).
        domain = BusyDomain(self.path, lambda n: 2 ** 20 * (10 + n))
        clock = Clock(step=1.0)
        exc = self.adopt(domain, live.CopyLimits(stall=30, rate=2 ** 20,
                                                 clock=clock))
        self.assertIn('no new low of the bytes left for 46 s', str(exc))
        self.assertIn('higher --max-rate or at a quieter time', str(exc))
        self.assertIn('stays on its original disk', str(exc))
        # Given up on the first look past that time, not later.
        self.assertLess(clock.now, 56)
        self.assert_undone(domain)

    def test_past_its_bound(self):
        # New lows at every look, too slowly ever to end: it has copied 4
        # times what it had to copy at its start (80 MiB, once QEMU sized
        # the job at its first look) when it is given up, however fast or
        # slow the storage.
        domain = BusyDomain(self.path, lambda n: 2 ** 26 - n)
        domain.copied = lambda n: n * 2 ** 24
        limits = live.CopyLimits(stall=30, rate=2 ** 20,
                                 clock=Clock(step=1.0))
        self.assertEqual(4 * 2 ** 26, limits.work(2 ** 26))
        exc = self.adopt(domain, limits)
        # Given up at its 20th look, the first past 320 MiB.
        self.assertIn('it copied 320.0 MiB, 4 times what it had to copy',
                      str(exc))
        self.assert_undone(domain)

    def test_slow_storage_is_not_given_up(self):
        # A quiet guest, a copy far slower than --max-rate (1000 MiB/s
        # asked, 1 MiB a look): it converges, however long it takes.
        domain = BusyDomain(self.path, lambda n: max(0, 2 ** 20 * (200 - n)))
        domain.copied = lambda n: n * 2 ** 20
        domain.job = True
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.adoption.live._mirror_ready',
            lambda dom, dev: (True, domain.looks >= 200)))
        live._wait_ready(domain, 'vda', None, lambda: False,
                         live.CopyLimits(stall=30, rate=1000 * 2 ** 20,
                                         clock=Clock(step=1.0)))
        self.assertEqual(200, domain.looks)

    def test_a_rate_limited_copy_waiting_after_its_burst(self):
        # QEMU's mirror copies 16 MiB at once, then waits 16 s at 1 MiB/s:
        # no new low for longer than the stall time, and a quiet guest.
        def copied(n):
            return min(2 ** 24 * (1 + n // 16), 2 ** 26)
        domain = BusyDomain(self.path, lambda n: 2 ** 26 - copied(n))
        domain.copied = copied
        domain.job = True
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.adoption.live._mirror_ready',
            lambda dom, dev: (True, copied(domain.looks) == 2 ** 26)))
        limits = live.CopyLimits(stall=5, rate=2 ** 20, clock=Clock(1.0))
        self.assertEqual(5 + 16, limits.quiet)
        live._wait_ready(domain, 'vda', None, lambda: False, limits)
        self.assertEqual(48, domain.looks)

    def test_the_jobs_first_looks_are_not_its_size(self):
        # QEMU sizes the job first: libvirt shows 0 of 1 for a while. The
        # copy then moves and comes into step after the stall time.
        sizes = {1: (0, 1), 2: (0, 1)}
        domain = BusyDomain(self.path, lambda n: 0)
        domain.job = True

        def info(dev, flags):
            domain.looks += 1
            cur, end = sizes.get(domain.looks, (
                domain.looks * 2 ** 20, 300 * 2 ** 20))
            return {'cur': cur, 'end': end}
        domain.blockJobInfo = info
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.adoption.live._mirror_ready',
            lambda dom, dev: (True, domain.looks >= 300)))
        live._wait_ready(domain, 'vda', None, lambda: False,
                         live.CopyLimits(stall=30, clock=Clock(step=1.0)))
        self.assertEqual(300, domain.looks)

    def test_a_copy_that_converges_is_not_given_up(self):
        # The same stall time: the copy is in step (ready) after 20 looks,
        # 20 s, with the guest's last 4 KiB left at every look after (a
        # busy guest): copied once it is paused.
        domain = BusyDomain(self.path,
                            lambda n: max(4096, 2 ** 20 * (20 - n)))
        domain.job = True
        looks = []

        def ready(dom, dev):
            looks.append(True)
            return True, domain.looks >= 20
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.adoption.live._mirror_ready', ready))
        live._wait_ready(domain, 'vda', None, lambda: False,
                         live.CopyLimits(stall=30, clock=Clock(step=1.0)))
        self.assertEqual(20, domain.looks)
