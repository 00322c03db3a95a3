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

"""``prealloc-backend report``: this host's capacity figures for
Prometheus, in a file node_exporter's textfile collector reads::

    prealloc-backend report --config-file /etc/nova/nova.conf \\
        --output /var/lib/prometheus/node-exporter/prealloc_backend.prom

Run as root from a systemd timer (etc/systemd/). The figures are
checks/capacity.py's (``prealloc-backend check --json`` carries the same,
in its Capacity row): instances_path read by a child process as its
owner, guests through a read-only libvirt connection. This module is the
command line and the output: the metric families (prometheus_client's, not
text made by hand), and the file.

The file is written by root, beside the one it replaces, flushed, renamed
into place and the directory flushed (system/fileops.write_file):
node_exporter reads the old file or the new one, whole, even after a power
cut. prometheus_client's own write_to_textfile renames before anything is
flushed, so a power cut can leave an empty or cut file, whose metrics
node_exporter then drops (node_textfile_scrape_error). The directory must
be root's alone: root writes there by name.
"""

import errno
import os
import stat
import sys
import time
import traceback

from prometheus_client import core
from prometheus_client import exposition

from prealloc_backend.checks import capacity
from prealloc_backend.checks import owner
from prealloc_backend.cmd import check as check_cmd
from prealloc_backend import conf as pb_conf
from prealloc_backend import exception
from prealloc_backend.privsep import beneath
from prealloc_backend.system import fileops

# Debian's and Ubuntu's prometheus-node-exporter reads this directory
# (--collector.textfile.directory).
DEFAULT_OUTPUT = '/var/lib/prometheus/node-exporter/prealloc_backend.prom'
PREFIX = 'prealloc_'
# Exit codes.
OK = 0
PARTIAL = 1      # written; some figure could not be read (see the file)
NOT_MEASURED = 2     # written with prealloc_report_success 0
ERROR_EXIT = 255


class _Families:
    """Collects metric families; a prometheus_client collector."""

    def __init__(self):
        self.families = []

    def gauge(self, name, documentation, labels=()):
        family = core.GaugeMetricFamily(PREFIX + name, documentation,
                                        labels=list(labels))
        self.families.append(family)
        return family

    def collect(self):
        return iter(self.families)


def families(found, success=True, error=None, seconds=0.0, now=None):
    """The metric families of a checks.capacity.Figures (None when the
    host could not be measured: then only the report's own metrics, with
    ``error`` as a label of prealloc_report_success).
    """
    out = _Families()
    success_family = out.gauge(
        'report_success', 'Whether the last report measured this host '
        '(1) or not (0; the error label says why).', ['error'])
    success_family.add_metric([error or ''], 1 if success else 0)
    out.gauge('report_timestamp_seconds',
              'When the report measured (Unix time).').add_metric(
        [], found.measured_at if found else (now or time.time()))
    out.gauge('report_duration_seconds',
              'Seconds the report took to measure.').add_metric(
        [], found.seconds if found else seconds)
    if found is None:
        return out
    path = [found.instances_path]
    host = found.host_facts()
    info = out.gauge('host_info', "This host's policy (value 1).",
                     ['path', 'mode', 'format', 'reserving',
                      'disk_inventory'])
    info.add_metric(path + [found.mode.value,
                            found.fmt.value if found.fmt else 'none',
                            'true' if found.reserving else 'false',
                            found.disk_inventory], 1)
    for name, doc, value in (
            ('fs_size_bytes', 'Size of the instances filesystem.',
             host['fs_size_bytes']),
            ('fs_free_bytes', 'Bytes of the instances filesystem nova\'s '
             'user may still take (f_bavail).', host['fs_free_bytes']),
            ('fs_reserved_unwritten_bytes', 'Bytes of instance disks in '
             'extents reserved but not yet written (FIEMAP unwritten: '
             'fallocate(2), modes space; mode full\'s zeros are written).',
             host['reserved_unwritten_bytes']),
            ('fs_thin_promised_bytes', 'Bytes the instance disks may still '
             'take as they are written (virtual size and qcow2 metadata '
             'not yet allocated).', host['thin_promised_bytes']),
            ('fs_base_images_bytes', 'Bytes the base images (image cache) '
             'hold.', host['base_images_bytes']),
            ('fs_other_bytes', 'Bytes used by anything but this host\'s '
             'instance disks (base images, logs, other files, the '
             'filesystem\'s reserve for root).', host['other_bytes']),
            ('host_reservable_bytes', 'Bytes new disks could still reserve: '
             'free, less what thin disks may still take, '
             'reserved_host_disk_mb, a new disk\'s qcow2 metadata and the '
             'flavors of this host\'s servers not yet on disk.',
             host['reservable_bytes']),
            ('disks', 'Instance disks found.', host['disks'])):
        out.gauge(name, doc, ['path']).add_metric(path, value)
    placement = host['placement']
    if placement['total_gb'] is not None:
        for name, doc, value in (
                ('placement_total_bytes', 'DISK_GB total the driver reports '
                 '(computed here from nova.conf and the figures).',
                 placement['total_gb'] * capacity.GiB),
                ('placement_reserved_bytes', 'DISK_GB reserved the driver '
                 'reports.', placement['reserved_gb'] * capacity.GiB),
                ('placement_allocation_ratio', 'DISK_GB allocation ratio '
                 'the driver reports (from nova.conf).',
                 placement['allocation_ratio'])):
            out.gauge(name, doc, ['path']).add_metric(path, value)
    if placement['offered_bytes'] is not None:
        out.gauge('placement_offered_bytes', 'Bytes placement still offers '
                  'for new disks here: (total - reserved) * ratio less the '
                  'flavors of the guests libvirt knows.',
                  ['path']).add_metric(path, placement['offered_bytes'])
    out.gauge('libvirt_up', 'Whether libvirt answered the read-only '
              'connection.', ['path']).add_metric(
        path, 0 if found.libvirt_error else 1)
    out.gauge('report_problems', 'Disks or directories not read whole '
              '(the check\'s JSON lists them).', ['path']).add_metric(
        path, len(found.scan.problems))
    labels = ['instance_uuid', 'disk', 'mode', 'format']
    virtual = out.gauge('disk_virtual_bytes', 'Virtual size of an instance '
                        'disk.', labels)
    allocated = out.gauge('disk_allocated_bytes', 'Bytes an instance disk '
                          'holds on the filesystem (st_blocks).', labels)
    unwritten = out.gauge('disk_unwritten_bytes', 'Bytes of an instance '
                          'disk reserved but not yet written (FIEMAP).',
                          labels)
    at_policy = out.gauge('disk_at_policy', 'Whether an instance disk has '
                          'what its mode asks (1) or not (0): the verdict '
                          'of prealloc-backend adopt.', labels)
    for disk in found.disks:
        values = [disk.facts.instance, disk.facts.name, disk.mode.value,
                  disk.facts.fmt]
        virtual.add_metric(values, disk.facts.virtual_size)
        allocated.add_metric(values, disk.facts.allocated)
        if disk.facts.unwritten is not None:
            unwritten.add_metric(values, disk.facts.unwritten)
        if disk.at_policy is not None:
            at_policy.add_metric(values, 1 if disk.at_policy else 0)
    paused = out.gauge('guest_paused_io_error', 'Whether a guest is paused '
                       'on an I/O error (libvirt: PAUSED, reason IOERROR; '
                       'ENOSPC among others).', ['instance_uuid'])
    for uuid in sorted(found.guests):
        paused.add_metric([uuid], 1 if found.guests[uuid].paused_io_error
                          else 0)
    return out


def render(collector):
    """The Prometheus text format of a collector (prometheus_client)."""
    registry = core.CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return exposition.generate_latest(registry)


class UnsafeOutput(Exception):
    """The output's directory is not one root may write into."""


def _open_output_directory(directory):
    """A descriptor (read-only, close-on-exec) of ``directory``, reached
    from / without following a symlink in any component, and checked: as
    root, the directory itself is root's and writable by nobody else. Its
    parents may be another user's (Debian's /var/lib/prometheus is the
    prometheus user's): whatever they do to the names above, the file is
    written through this descriptor, into this directory only.
    """
    try:
        path_fd = beneath.open_absolute_dir(directory)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise UnsafeOutput('%s is not a directory' % directory)
        if exc.errno == errno.ELOOP:
            raise UnsafeOutput('%s: a symlink on the way (root follows '
                               'none there)' % directory)
        raise UnsafeOutput('%s: %s' % (directory, exc))
    try:
        fd = os.open('.', os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                     dir_fd=path_fd)
    finally:
        os.close(path_fd)
    st = os.fstat(fd)
    if os.geteuid() == 0 and (st.st_uid != 0 or
                              owner.writable_by_others(st)):
        os.close(fd)
        why = ('is owned by %s' % owner.describe_owner(st)
               if st.st_uid != 0 else
               'may be written by its group or by others (mode %04o)'
               % stat.S_IMODE(st.st_mode))
        raise UnsafeOutput('%s %s: root writes there, so only root may '
                           'change it' % (directory, why))
    return fd


def refusal(output):
    """Why root must not write ``output``, or None (write() checks again,
    on the descriptor it writes through).
    """
    directory = os.path.dirname(os.path.abspath(output))
    if not output.endswith('.prom'):
        return ("%s: node_exporter's textfile collector reads only *.prom "
                'files' % output)
    try:
        os.close(_open_output_directory(directory))
    except UnsafeOutput as exc:
        return str(exc)
    return None


def write(output, data):
    """Replace ``output`` with ``data`` durably (fileops.write_file),
    through a checked descriptor of its directory
    (_open_output_directory), the temporary file named for this process
    (not *.prom: the collector ignores it) and removed if the write fails.
    """
    directory = os.path.dirname(os.path.abspath(output))
    name = os.path.basename(output)
    suffix = '.%d.tmp' % os.getpid()
    dir_fd = _open_output_directory(directory)
    try:
        fileops.write_file(name, data, mode=0o644, suffix=suffix,
                           dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(name + suffix, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    finally:
        os.close(dir_fd)


def add_arguments(parser):
    parser.add_argument(
        '--config-file', action='append', default=[], metavar='PATH',
        help='A configuration file nova-compute reads (repeatable).')
    parser.add_argument(
        '--config-dir', action='append', default=[], metavar='DIR',
        help='A directory of *.conf files nova-compute reads (repeatable).')
    parser.add_argument(
        '--output', default=DEFAULT_OUTPUT, metavar='PATH',
        help='The .prom file to write (default %s), in a directory only '
             'root can change.' % DEFAULT_OUTPUT)
    parser.add_argument(
        '--stdout', action='store_true',
        help='Print the metrics instead of writing --output.')
    parser.add_argument(
        '--deadline', type=int, default=capacity.SCAN_DEADLINE,
        metavar='SECONDS',
        help='Seconds the scan of instances_path may take before it is '
             'killed (default %d).' % capacity.SCAN_DEADLINE)
    parser.add_argument(
        '--verbose', action='store_true',
        help='Print the log lines of the plugin and nova on stderr.')


def run(args, clock=time.monotonic):
    check_cmd.setup_logging(args.verbose)
    try:
        if args.deadline < 1:
            print('Error: --deadline %r: a number of seconds, 1 or more'
                  % args.deadline, file=sys.stderr)
            return ERROR_EXIT
        if not args.stdout:
            why = refusal(args.output)
            if why:
                print('Error: refusing to write %s: %s'
                      % (args.output, why), file=sys.stderr)
                return ERROR_EXIT
        conf = pb_conf.CONF
        start = clock()
        found, error, code = None, None, OK
        try:
            check_cmd.load_config(conf, args.config_file, args.config_dir)
            found = capacity.measure(conf, deadline=args.deadline)
        except (check_cmd.ConfigLoadError, exception.PreallocError,
                owner.UnsafeDirectory, owner.StepFailed, ValueError) as exc:
            error = (exc.format_message()
                     if isinstance(exc, exception.PreallocError)
                     else str(exc))
            code = NOT_MEASURED
            print('Not measured: %s' % error, file=sys.stderr)
        if found is not None and (found.libvirt_error or
                                  found.scan.problems):
            code = PARTIAL
            for problem in found.scan.problems:
                print('Partly read: %s' % problem, file=sys.stderr)
            if found.libvirt_error:
                print('libvirt: %s' % found.libvirt_error, file=sys.stderr)
        data = render(families(found, success=found is not None,
                               error=error, seconds=clock() - start))
        if args.stdout:
            sys.stdout.write(data.decode())
        else:
            try:
                write(args.output, data)
            except UnsafeOutput as exc:
                # Changed since the first look (refusal, above).
                print('Error: refusing to write %s: %s' % (args.output, exc),
                      file=sys.stderr)
                return ERROR_EXIT
        return code
    except Exception:
        print('Error:\n%s' % traceback.format_exc(), file=sys.stderr)
        return ERROR_EXIT
