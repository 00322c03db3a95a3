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

"""A build whose disk does not fit on a host is rescheduled, and the user
sees that host's reason in the server's instance actions.

NON-SHARED instance directories: host 'full' keeps its instances on a real
64 MiB loop-mounted ext4 (a 1 GiB space-mode disk cannot fit), host 'roomy'
on the test's directory. 'full' has more RAM, so nova's RAM weigher tries it
first. The full hosts report nova's own DISK_GB inventory
(``disk_inventory = nova``), as a thin host does for a flavor in mode
space: with the plugin's inventory placement would not offer them at all
(test_placement_capacity), and the compute host's own refusal is what
remains where placement's view is nova's.
"""

import re

from nova.tests.fixtures import libvirt as fakelibvirt

from tests.functional import multihost

# The event's details: the backend's whole message.
REASON = re.compile(r'Not enough space to preallocate disk \S+: \d+ bytes '
                    r'needed, \d+ bytes free')
# The fault (255 characters at most): the figures first.
FAULT_REASON = re.compile(r'Last exception: Insufficient compute resources: '
                          r'Not enough space to preallocate: \d+ bytes '
                          r'needed, \d+ bytes free')


def _host_info(mem_gb):
    return fakelibvirt.HostInfo(cpu_nodes=2, cpu_sockets=1, cpu_cores=2,
                                cpu_threads=2, kB_mem=mem_gb * 1024 * 1024)


class TestReschedule(multihost.MultiHostTestBase):

    def _events(self, server, api):
        """{event name: [events]} of the server's create action; the
        plugin's per-host disk events (compute_prealloc_disks,
        compute_prealloc_disks_2...) under compute_prealloc_disks.
        """
        actions = api.get_instance_actions(server['id'])
        create = [a for a in actions if a['action'] == 'create']
        self.assertEqual(1, len(create), actions)
        details = api.get_instance_action_details(server['id'],
                                                  create[0]['request_id'])
        events = {}
        for event in details['events']:
            name = re.sub(r'^(compute_prealloc_disks)_\d+$', r'\1',
                          event['event'])
            events.setdefault(name, []).append(event)
        return events

    def test_lands_on_host_with_room(self):
        self.add_loop_host('full', 64, host_info=_host_info(32),
                           disk_inventory='nova')
        self.add_host('roomy', host_info=_host_info(16))
        image_id, image_path = self.upload_image('raw')
        flavor = self.create_flavor(disk=1)
        server = self._create_server(image_uuid=image_id, flavor_id=flavor,
                                     networks='none', api=self.user_api)
        self.assertEqual('roomy', self.server_host(server))
        self.assertQcow2Overlay(
            self.host_disk('roomy', server), 'space', 1024 ** 3,
            self.host_base('roomy', image_id))
        self.assertContentEqual(self.host_disk('roomy', server), image_path)
        # Nothing left on the host that could not take it.
        self.assertNothingLeft(server, 'full')

        # The user (not admin) sees both hosts' disk events: one failed,
        # one successful, on two different hosts (hostId).
        events = self._events(server, self.user_api)
        disk_events = events['compute_prealloc_disks']
        self.assertEqual(['Error', 'Success'],
                         sorted(e['result'] for e in disk_events))
        failed = [e for e in disk_events if e['result'] == 'Error'][0]
        succeeded = [e for e in disk_events if e['result'] == 'Success'][0]
        self.assertNotEqual(failed['hostId'], succeeded['hostId'])
        self.assertNotIn('traceback', failed)
        # nova 34 shows an event's details (the reason) to admins only by
        # default; a cloud that grants os_compute_api:os-instance-actions:
        # events:details to project readers shows users why.
        self.assertNotIn('details', failed)
        self.policy.set_rules({
            'os_compute_api:os-instance-actions:events:details':
                'rule:project_reader_or_admin'}, overwrite=False)
        failed = [e for e in self._events(server, self.user_api)[
            'compute_prealloc_disks'] if e['result'] == 'Error'][0]
        self.assertRegex(failed['details'], REASON)
        # The admin sees which host it was.
        admin_events = self._events(server, self.api)
        failed = [e for e in admin_events['compute_prealloc_disks']
                  if e['result'] == 'Error'][0]
        self.assertEqual('full', failed['host'])
        self.assertIn('InsufficientDiskSpace', failed['traceback'])

    def test_no_host_with_room(self):
        """Every host full and [scheduler] max_attempts = number of hosts:
        the final fault names the last host's reason (nova's "Last
        exception"), each host's reason is in its event.
        """
        self.flags(max_attempts=2, group='scheduler')
        self.add_loop_host('full1', 64, disk_inventory='nova')
        self.add_loop_host('full2', 64, disk_inventory='nova')
        image_id, _path = self.upload_image('raw')
        flavor = self.create_flavor(disk=1)
        server = self._create_server(image_uuid=image_id, flavor_id=flavor,
                                     networks='none', api=self.user_api,
                                     expected_state='ERROR')
        fault = self.fault_message(server)
        self.assertIn('Exceeded maximum number of retries', fault)
        self.assertRegex(fault, FAULT_REASON)
        failed = [e for e in self._events(server, self.api)[
            'compute_prealloc_disks'] if e['result'] == 'Error']
        self.assertEqual(['full1', 'full2'],
                         sorted(e['host'] for e in failed))
        for host in ('full1', 'full2'):
            self.assertNothingLeft(server, host)
