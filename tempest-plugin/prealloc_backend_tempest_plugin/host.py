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

"""Commands on a compute host, for checks of its files (whitebox).

``[prealloc] host_access = local`` runs them on this machine, as the user
running Tempest; ``ssh`` runs the same argument vectors through ``ssh`` on
the server's compute host; ``command`` through ``host_command`` given the
host's name (the one-box cloud of tools/cloud-up: ``tools/cloud-host``
enters the compute host's namespaces). Read-only commands (qemu-img info
and map, stat of files and filesystems, filefrag, virsh dumpxml,
prealloc-backend check and report --stdout, and qemu-img convert of a
disk into a temporary file of the host's /tmp, removed after its md5sum:
``guest_md5``), and two that change the host: ``prealloc-backend adopt``
(PreallocAdoptTest), with a configuration file of its own in the host's
/tmp, removed after; a file of fallocate(2)'d blocks in ``[prealloc]
scratch_path`` (PreallocCapacityTest: files nova does not know about on
the instances filesystem), removed after.
"""

import json
import shlex
import subprocess
from xml.etree import ElementTree

from tempest import config

CONF = config.CONF


# python3 -c READ_NOFOLLOW PATH: print the end of a regular file, every
# component of PATH opened with O_NOFOLLOW from /.
READ_NOFOLLOW = """
import os, stat, sys
parts = [p for p in sys.argv[1].split('/') if p]
fd = os.open('/', os.O_RDONLY | os.O_DIRECTORY)
try:
    for name in parts[:-1]:
        nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                      dir_fd=fd)
        os.close(fd)
        fd = nfd
    try:
        f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
                    dir_fd=fd)
    except FileNotFoundError:
        sys.exit(0)
finally:
    os.close(fd)
st = os.fstat(f)
if not stat.S_ISREG(st.st_mode):
    sys.exit('not a regular file: %s' % sys.argv[1])
os.lseek(f, max(0, st.st_size - 262144), os.SEEK_SET)
sys.stdout.write(os.read(f, 262144).decode('utf-8', 'replace'))
"""


class HostCommandFailed(Exception):
    def __init__(self, argv, returncode, stdout, stderr):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__('%s exited %s: %s%s' % (
            shlex.join(argv), returncode, stdout[-2000:], stderr[-2000:]))


class ComputeHost(object):
    def __init__(self, host):
        self.host = host

    def run(self, argv, check=True, timeout=300):
        """Run ``argv`` on the host; its stdout (text)."""
        if CONF.prealloc.host_access == 'ssh':
            cmd = ['ssh', '-o', 'BatchMode=yes',
                   '%s@%s' % (CONF.prealloc.ssh_user, self.host),
                   shlex.join(argv)]
        elif CONF.prealloc.host_access == 'command':
            cmd = (shlex.split(CONF.prealloc.host_command or '') +
                   [self.host] + list(argv))
        else:
            cmd = list(argv)
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=timeout,
                              env={'LC_ALL': 'C', 'PATH':
                                   '/usr/local/sbin:/usr/local/bin:'
                                   '/usr/sbin:/usr/bin:/sbin:/bin'})
        if check and proc.returncode != 0:
            raise HostCommandFailed(argv, proc.returncode, proc.stdout,
                                    proc.stderr)
        return proc

    def disk_path(self, server_id, name='disk'):
        return '%s/%s/%s' % (CONF.prealloc.instances_path.rstrip('/'),
                             server_id, name)

    def qemu_img_info(self, path):
        # -f qcow2: the file is the guest's (and the nova user's); no
        # format probing of it. A disk that is not qcow2 fails here.
        return json.loads(self.run(
            ['qemu-img', 'info', '-f', 'qcow2', '--force-share',
             '--output=json', path]).stdout)

    def qemu_img_map(self, path):
        """The guest-visible layout of a qcow2 disk: ``qemu-img map``'s
        ranges (start, length, depth, present, zero, data), without the
        host offsets, which differ between two files of the same layout.
        """
        out = json.loads(self.run(
            ['qemu-img', 'map', '-f', 'qcow2', '--force-share',
             '--output=json', path]).stdout)
        return [(r['start'], r['length'], r['depth'], r.get('present'),
                 r['zero'], r['data']) for r in out]

    def guest_md5(self, path):
        """The md5 of what the guest reads from the qcow2 disk ``path``
        (its backing file's data included): qemu-img convert to a raw
        file of the host's /tmp (sparse where the disk reads zeros),
        md5sum, the file removed. Needs the disk's size free there only
        for data.
        """
        script = ('tmp=$(mktemp /tmp/prealloc-tempest.XXXXXX) || exit 1; '
                  'qemu-img convert -U -f qcow2 -O raw "$1" "$tmp" && '
                  'md5sum <"$tmp"; rc=$?; rm -f "$tmp"; exit $rc')
        return self.run(['sh', '-c', script, 'sh', path]).stdout.split()[0]

    def stat(self, path):
        """(st_size, allocated bytes: st_blocks * 512)."""
        size, blocks = self.run(['stat', '-c', '%s %b', path]).stdout.split()
        return int(size), int(blocks) * 512

    def exists(self, path):
        """Whether ``path`` exists on the host; a failure of anything but
        the path itself (the host unreachable) raises.
        """
        proc = self.run(['stat', '-c', '%i', path], check=False)
        if proc.returncode == 0:
            return True
        if 'No such file or directory' in proc.stderr:
            return False
        raise HostCommandFailed(['stat', '-c', '%i', path], proc.returncode,
                                proc.stdout, proc.stderr)

    def free_and_total(self, path):
        """(bytes free to an unprivileged user, total bytes) of the
        filesystem holding ``path``, from ``stat -f`` (statvfs).
        """
        avail, total, frsize = self.run(
            ['stat', '-f', '-c', '%a %b %S', path]).stdout.split()
        return int(avail) * int(frsize), int(total) * int(frsize)

    def unwritten_bytes(self, path):
        """Bytes in extents the filesystem marks unwritten (fallocate(2)
        reserved them, nothing wrote them), from ``filefrag -v``.
        """
        out = self.run(['filefrag', '-v', '-b1', path]).stdout
        total = 0
        for line in out.splitlines():
            fields = [f.strip() for f in line.split(':')]
            if len(fields) < 5 or not fields[0].isdigit():
                continue
            if 'unwritten' in line:
                total += int(fields[3])
        return total

    def domain_disk_driver(self, instance_name, path):
        """The ``<driver>`` element of the guest disk whose source is
        ``path``, from ``virsh dumpxml``.
        """
        xml = self.run(['virsh', '-c', CONF.prealloc.libvirt_uri, 'dumpxml',
                        instance_name]).stdout
        # virsh's own output on the compute host (not guest data).
        dom = ElementTree.fromstring(xml)
        for disk in dom.findall('./devices/disk'):
            source = disk.find('source')
            if source is not None and source.get('file') == path:
                return disk.find('driver')
        raise AssertionError('%s has no disk %s:\n%s' % (instance_name, path,
                                                         xml))

    def fill(self, path, size):
        """A file of ``size`` bytes reserved with fallocate(2) (nothing
        written) at ``path``.
        """
        self.run(['fallocate', '-l', str(size), path])

    def remove(self, path):
        self.run(['rm', '-f', path])

    def read_console(self, server_id):
        """The last 256 KiB of the server's console log on the host, read
        as root without following a link anywhere on its path (the
        instance's directory is the nova user's: a link there must not
        show root's files), only a regular file, never blocking ("" while
        it does not exist).
        """
        path = '%s/%s/console.log' % (
            CONF.prealloc.instances_path.rstrip('/'), server_id)
        return self.run(['python3', '-c', READ_NOFOLLOW, path]).stdout

    def prealloc_report(self):
        """``prealloc-backend report --stdout`` with nova-compute's
        configuration: the Prometheus text format.
        """
        return self.run([CONF.prealloc.prealloc_backend_command, 'report',
                         '--config-file', CONF.prealloc.compute_config,
                         '--stdout']).stdout

    def prealloc_check(self):
        """``prealloc-backend check --json`` with nova-compute's
        configuration: (exit code, parsed report).
        """
        # --timeout: judged on what it finds, not on how fast a busy test
        # cloud runs it (60 s by default).
        proc = self.run([CONF.prealloc.prealloc_backend_command, 'check',
                         '--config-file', CONF.prealloc.compute_config,
                         '--json', '--timeout', '300'], check=False)
        try:
            report = json.loads(proc.stdout)
        except ValueError:
            report = {'unparsed stdout': proc.stdout,
                      'stderr': proc.stderr}
        return proc.returncode, report
