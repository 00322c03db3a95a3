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

"""prealloc_backend.adapter.events: the instance-action event of a host's disk
work, the fault's reason, a failed build's outcome, the instance handed to
nova's static _disk_raw_to_qcow2.

NOTE(nova): nova's instance-action records live in its database, which this
tier has none of: the three nova object methods DiskEvent calls are
replaced by an in-memory list (what the functional tier checks through
nova's API: tests/functional).
"""


import fixtures
from nova.compute import vm_states
from nova import context as nova_context
from nova import exception as nova_exception
from nova import objects

from prealloc_backend.adapter import events
from prealloc_backend import exception
from tests import base


class _Event:
    def __init__(self, event):
        self.event = event


class TestDiskEvent(base.TestCase):

    def setUp(self):
        super().setUp()
        self.context = nova_context.RequestContext('user', 'project',
                                                   is_admin=False)
        self.instance = self.make_instance()
        self.rows = []
        self.finished = []
        self.action = objects.InstanceAction(id=7)
        # In-memory stand-ins for nova's database (see the module's NOTE).
        self.useFixture(fixtures.MockPatchObject(
            objects.InstanceAction, 'get_by_request_id',
            side_effect=lambda ctx, uuid, req: self.action))
        self.useFixture(fixtures.MockPatchObject(
            objects.InstanceActionEventList, 'get_by_action',
            side_effect=lambda ctx, action_id: [_Event(r)
                                                for r in self.rows]))
        self.useFixture(fixtures.MockPatchObject(
            objects.InstanceActionEvent, 'event_start',
            side_effect=lambda ctx, uuid, name, **kw: self.rows.append(
                name)))
        self.useFixture(fixtures.MockPatchObject(
            objects.InstanceActionEvent, 'event_finish_with_failure',
            side_effect=lambda ctx, uuid, name, exc_val=None, **kw:
            self.finished.append((name, exc_val))))

    def test_each_host_gets_its_own_name(self):
        for _host in range(3):
            with events.DiskEvent(self.context, self.instance):
                pass
        self.assertEqual([events.DISK_EVENT, events.DISK_EVENT + '_2',
                          events.DISK_EVENT + '_3'], self.rows)

    def test_failure_recorded_and_raised(self):
        error = exception.AllocationFailed(path='/i/disk', reason='EIO')

        def work():
            with events.DiskEvent(self.context, self.instance):
                raise error

        self.assertRaises(exception.AllocationFailed, work)
        self.assertEqual([(events.DISK_EVENT, error)], self.finished)

    def test_no_action_records_nothing(self):
        self.action = None
        with events.DiskEvent(self.context, self.instance):
            pass
        self.assertEqual([], self.rows)
        self.assertEqual([], self.finished)

    def test_no_context_records_nothing(self):
        with events.DiskEvent(None, self.instance):
            pass
        self.assertEqual([], self.rows)


class TestReasons(base.TestCase):

    def test_space_figures_first(self):
        exc = exception.InsufficientDiskSpace(
            path='/a/long/path/disk', needed=10, free=1, directory='/a')
        self.assertEqual('Not enough space to preallocate: 10 bytes needed, '
                         '1 bytes free (disk /a/long/path/disk)',
                         events.short_reason(exc))

    def test_other_errors_their_message(self):
        exc = exception.AllocationFailed(path='/i/disk', reason='EIO')
        self.assertEqual(exc.format_message(), events.short_reason(exc))

    def _failure_of(self, exc, vm_state):
        instance = self.make_instance()
        instance.vm_state = vm_state
        return instance, events.build_failure(instance, exc)

    def test_first_build_on_this_host_s_failure_tries_another(self):
        exc = exception.AllocationFailed(path='/i/disk', reason='EIO')
        _instance, failure = self._failure_of(exc, vm_states.BUILDING)
        self.assertIsInstance(failure,
                              nova_exception.ComputeResourcesUnavailable)
        self.assertIn('EIO', failure.format_message())

    def test_invalid_or_cancelled_aborts(self):
        for exc in (exception.InvalidFlavorPolicy(value='x', key='k',
                                                  allowed='a'),
                    exception.AllocationCancelled(path='/i/disk',
                                                  reason='deleted')):
            instance, failure = self._failure_of(exc, vm_states.BUILDING)
            self.assertIsInstance(failure,
                                  nova_exception.BuildAbortException)
            self.assertIn(instance.uuid, failure.format_message())

    def test_not_a_first_build_is_nova_s(self):
        exc = exception.AllocationFailed(path='/i/disk', reason='EIO')
        _instance, failure = self._failure_of(exc, vm_states.ACTIVE)
        self.assertIs(exc, failure)
