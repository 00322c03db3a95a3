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

"""The ``[prealloc]`` option group of tempest.conf."""

from oslo_config import cfg

prealloc_group = cfg.OptGroup(
    name='prealloc',
    title="prealloc_backend's Tempest tests: where the compute host's "
          "files are and how to reach them")

PreallocGroup = [
    cfg.StrOpt('host_access',
               default='local',
               choices=[('local', 'the compute host is this machine: '
                         'commands run here, as the user running Tempest '
                         '(root, to read QEMU-owned disks)'),
                        ('ssh', 'commands run on the server\'s compute host '
                         'through "ssh [ssh_user@]<host>" (key-based, '
                         'BatchMode); the host is the server\'s '
                         'OS-EXT-SRV-ATTR:host'),
                        ('command', 'commands run through host_command, '
                         'given the host\'s name and then the command '
                         '(tools/cloud-host: compute hosts in namespaces '
                         'of this machine)')],
               help='How the tests run commands on a compute host.'),
    cfg.StrOpt('host_command',
               help='For host_access = command: a command line (split as '
                    'a shell would) that runs its arguments after the first '
                    'on the compute host the first names.'),
    cfg.StrOpt('ssh_user',
               default='root',
               help='User for host_access = ssh.'),
    cfg.StrOpt('instances_path',
               help="The compute hosts' [DEFAULT] instances_path. Unset: "
                    "the host checks are skipped."),
    cfg.StrOpt('scratch_path',
               help="A directory on each compute host's instances "
                    'filesystem, outside instances_path, where the tests '
                    'may put files nova does not know about (the capacity '
                    'test fills the filesystem there, and removes what it '
                    'put). Unset: that test is skipped.'),
    cfg.DictOpt('host_modes',
                default={},
                help="The plugin's mode on each compute host, "
                     "host:mode,... (its [prealloc_backend] mode, or what "
                     "nova's preallocate_images gives): what a disk without "
                     "a flavor mode gets on the host it lands on. A host not "
                     "listed: the tests that need its mode are skipped."),
    cfg.DictOpt('host_qemu_versions',
                default={},
                help="The QEMU version of each compute host, "
                     "host:version,... (a fleet mid-upgrade runs two "
                     "generations). With two hosts of different versions "
                     "the live migrations go from the older to the newer "
                     "(nova's conductor refuses the other way, "
                     "DestinationHypervisorTooOld), and the tests across "
                     "the generations run; otherwise they are skipped."),
    cfg.StrOpt('compute_config',
               default='/etc/nova/nova.conf',
               help="nova-compute's configuration file on the compute "
                    "host (for prealloc-backend check)."),
    cfg.StrOpt('libvirt_uri',
               default='qemu:///system',
               help='libvirt URI for virsh on the compute host.'),
    cfg.StrOpt('prealloc_backend_command',
               default='prealloc-backend',
               help='The prealloc-backend command on the compute host.'),
    cfg.StrOpt('compute_restart_command',
               help="A command line (split as a shell would) that restarts "
                    "the nova-compute of the host its first argument names, "
                    "in the mode '--mode MODE' gives, or in the host's own "
                    "without it (tools/cloud-compute); with '--stop' it "
                    "stops it (the evacuation test), with '--stock' it "
                    "starts nova's own nova-compute without the plugin (the "
                    "test of leaving the plugin). Unset: the adoption test "
                    "boots its server in the host's own mode instead of "
                    "mode none, and the evacuation and leaving tests are "
                    "skipped."),
    cfg.StrOpt('trim_image_ref',
               help="An image whose guest discards part of its disk and "
                    "powers off, reporting on its console "
                    "(bench/prealloc_bench/guest.py's action trim; "
                    "tools/cloud-up's guest-trim). Unset: the test of a "
                    "guest's TRIM through nova is skipped."),
    cfg.StrOpt('reservation_record',
               help="A file on the machine running Tempest to which the "
                    "reservation tests (the walk, evacuation, a guest's "
                    "TRIM, adoption) append one JSON line per step: the "
                    "disk's figures on its host, from the files and from "
                    "prealloc-backend report (tools/cloud-tempest prints "
                    "them as a table). Unset: nothing is recorded."),
]


def list_opts():
    """The ``[prealloc]`` options, for Tempest's sample configuration."""
    return [(prealloc_group.name, PreallocGroup)]
