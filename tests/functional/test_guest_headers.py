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

"""Issue 31 finding 3: a guest cannot make the host scan its disk.

The guest writes a header into the first bytes of its raw disk (a VMDK
sparse header whose grain directory is "at end", a VHDX identifier and
region table naming the disk's last MiB, a LUKS header, a qcow2 header);
the server is then resized (moved from host src to host dst), cold
migrated back and hard rebooted, once with a 1 GiB disk and once with a
64 GiB one (sparse, mode none: nothing allocated). Hosts src and dst share
one instance directory (nova copies with cp -r, which skips holes; rsync
--sparse would read the 64 GiB itself).

Every format_inspector.InspectWrapper nova or the plugin makes is counted:
an instance disk recorded raw is never inspected at all, and an inspector
fed more than formats.HEADER_PREFIX of one stops there (the step then
fails), so the old code's whole-disk scan fails fast instead of running
for minutes. Each step of the 64 GiB server takes about as long as the
1 GiB server's.
"""

import time

import fixtures
from oslo_log import log as logging
from oslo_utils.imageutils import format_inspector
from oslo_utils import units

from prealloc_backend.disk import formats
from tests.functional import multihost
from tests.unit.disk import test_formats

LOG = logging.getLogger(__name__)

# Sizes (GiB) of the two servers' disks; each resize adds a GiB.
SIZES = (1, 64)
# A step of the large server may take this many times the small one's,
# plus SLACK_SECONDS (a busy 2-core machine), and no longer.
FACTOR = 3
SLACK_SECONDS = 10


class InspectedFiles(fixtures.Fixture):
    """Bytes fed to each InspectWrapper, by the name of the file it reads
    ([(name, bytes)], one entry per wrapper); a wrapper fed more than
    formats.HEADER_PREFIX of a file outside ``spared`` raises there.
    """

    def __init__(self, spared):
        super().__init__()
        self.spared = spared

    def _setUp(self):
        self.wrappers = []
        self.past_prefix = []
        fixture = self
        real = format_inspector.InspectWrapper

        class Counting(real):
            def __init__(wrapper, source, *args, **kwargs):
                super().__init__(source, *args, **kwargs)
                wrapper.entry = [getattr(source, 'name', None), 0]
                fixture.wrappers.append(wrapper.entry)

            def read(wrapper, size):
                chunk = super().read(size)
                wrapper.entry[1] += len(chunk)
                name = wrapper.entry[0]
                if (wrapper.entry[1] > formats.HEADER_PREFIX and
                        not str(name).startswith(fixture.spared)):
                    fixture.past_prefix.append(tuple(wrapper.entry))
                    raise RuntimeError('inspected past the prefix: %s'
                                       % name)
                return chunk

        self.useFixture(fixtures.MockPatchObject(
            format_inspector, 'InspectWrapper', Counting))

    def disks(self, since=0):
        """The entries of files other than ``spared``, from the
        ``since``-th wrapper on.
        """
        return [tuple(e) for e in self.wrappers[since:]
                if not str(e[0]).startswith(self.spared)]


class _GuestHeader:

    kind = None

    def setUp(self):
        super().setUp()
        self.add_host('src', 'raw', 'none', shared=True)
        self.add_host('dst', 'raw', 'none', shared=True)
        # nova's own inspection of its image cache (the base images, 4 MiB
        # of random data) is not the guest's disk.
        self.inspected = self.useFixture(InspectedFiles(self.base_dir()))
        self.image_id, _image_path = self.upload_image('raw')

    def step(self, name, timings, func, *args):
        start = time.monotonic()
        try:
            result = func(*args)
        finally:
            # A failed step fails on what made it fail, if it was this.
            self.assertEqual([], self.inspected.past_prefix,
                             'during %s' % name)
        timings[name] = time.monotonic() - start
        return result

    def resize(self, server, flavor):
        self.api.post_server_action(server['id'],
                                    {'resize': {'flavorRef': flavor}})
        server = self._wait_for_state_change(server, 'VERIFY_RESIZE')
        return self._confirm_resize(server)

    def migrate(self, server, host):
        server = self._migrate_server(server, host=host)
        return self._confirm_resize(server)

    def hard_reboot(self, server):
        self.api.post_server_action(server['id'],
                                    {'reboot': {'type': 'HARD'}})
        server = self._wait_for_state_change(server, 'ACTIVE')
        self._wait_for_instance_action_event(
            server, 'reboot', 'compute_reboot_instance', 'success')
        return server

    def flow(self, gib):
        """Boot a server with a ``gib`` GiB raw disk, write the header,
        resize, migrate back, hard reboot; {step: seconds}.
        """
        small = self.create_flavor(disk=gib)
        large = self.create_flavor(disk=gib + 1)
        server = self._create_server(image_uuid=self.image_id,
                                     flavor_id=small, networks='none',
                                     host='src')
        disk = self.host_disk('src', server)
        size = (gib + 1) * units.Gi
        # (Read at boot: a new disk's header is its image's.)
        since = len(self.inspected.wrappers)
        test_formats.write_guest_header(disk, self.kind, size)
        header = test_formats.guest_header(self.kind, size)
        timings = {}
        server = self.step('resize', timings, self.resize, server, large)
        self.assertEqual('dst', self.server_host(server))
        server = self.step('cold migration', timings, self.migrate, server,
                           'src')
        self.assertEqual('src', self.server_host(server))
        server = self.step('hard reboot', timings, self.hard_reboot,
                           server)
        # Still a raw disk of the new size holding what the guest wrote.
        disk = self.host_disk('src', server)
        self.assertEqual('raw', formats.disk_info_format(
            self.host_dir('src', server) + '/disk.info', disk))
        with open(disk, 'rb') as f:
            for offset, data in header.items():
                f.seek(offset)
                self.assertEqual(data, f.read(len(data)))
            f.seek(0, 2)
            self.assertEqual(size, f.tell())
        # Recorded raw everywhere: never inspected once the guest wrote.
        self.assertEqual([], self.inspected.disks(since), timings)
        return timings

    def test_resize_migrate_hard_reboot(self):
        timings = {gib: self.flow(gib) for gib in SIZES}
        LOG.info('%s: seconds per step: %s', self.kind, timings)
        small, large = (timings[gib] for gib in SIZES)
        for name, seconds in small.items():
            self.assertLessEqual(large[name],
                                 FACTOR * seconds + SLACK_SECONDS,
                                 '%s: %s' % (name, timings))


class TestVMDKGrainDirectoryAtEnd(_GuestHeader, multihost.MultiHostTestBase):
    kind = 'vmdk'


class TestVHDX(_GuestHeader, multihost.MultiHostTestBase):
    kind = 'vhdx'


class TestLUKS(_GuestHeader, multihost.MultiHostTestBase):
    kind = 'luks'


class TestQcow2(_GuestHeader, multihost.MultiHostTestBase):
    kind = 'qcow2'
