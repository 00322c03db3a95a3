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

"""Check what a guest's TRIM (discard) will do to this host's disks.

Reads the configuration only (runs as whoever runs the check, touches no
file). The answer comes from ``diskplan.guest_discard``, the function the
backend's ``libvirt_info`` asks for each disk's ``<driver discard=...>``,
for the host's disk format and every mode a flavor may choose.
"""

from prealloc_backend.checks import result
from prealloc_backend.planner import diskplan
from prealloc_backend.planner.modes import Mode


def discard_by_mode(host):
    """{mode name: the disk's discard attribute (None: unset)} for new
    disks of the host's format.
    """
    nova_discard = host.conf.libvirt.hw_disk_discard
    choice = host.conf.prealloc_backend.guest_discard
    return {mode.value: diskplan.guest_discard(mode, host.disk_format,
                                             nova_discard, choice)
            for mode in Mode}


def check_guest_discard(host):
    """A guest's TRIM keeps what the host's mode reserved, or the report
    says which disks lose it.
    """
    nova_discard = host.conf.libvirt.hw_disk_discard
    choice = host.conf.prealloc_backend.guest_discard
    fmt = host.disk_format
    facts = {'hw_disk_discard': nova_discard, 'guest_discard': choice}
    if fmt is None:
        return result.success(
            'Not file disks (images_type = %s): nothing to check.'
            % host.conf.libvirt.images_type, **facts)
    by_mode = discard_by_mode(host)
    facts['discard'] = by_mode
    if nova_discard != 'unmap':
        return result.success(
            "[libvirt] hw_disk_discard = %s: QEMU does not pass a guest's "
            'discards to the disk files; a TRIM changes nothing on the '
            'host.' % (nova_discard or 'unset'), **facts)
    thin = sorted(m for m, value in by_mode.items() if value == 'unmap')
    kept = sorted(m for m, value in by_mode.items() if value == 'ignore')
    losing = [m for m in thin if Mode(m) in (Mode.SPACE, Mode.FULL) or
              (fmt is diskplan.DiskFormat.QCOW2 and Mode(m).preallocates)]
    thin_text = ("a guest's TRIM frees the host blocks it covers on %s "
                 'disks of mode %s' % (fmt.value, ', '.join(thin)))
    if not losing:
        return result.success(
            "hw_disk_discard = unmap, guest_discard = %s: a guest's TRIM is "
            'ignored on %s disks of mode %s (their reservation and layout '
            'stay); %s, which reserve nothing.'
            % (choice, fmt.value, ', '.join(kept), thin_text), **facts)
    host_mode = host.mode.value
    return result.warning(
        'hw_disk_discard = unmap, guest_discard = reclaim: %s. On disks of '
        'mode %s that undoes the preallocation: the freed ranges are '
        'allocated again on the next write (the slow first-write path) and '
        'the host can run out of space under the guest. This host\'s mode '
        'is %s.' % (thin_text, ', '.join(losing), host_mode),
        "Set [prealloc_backend] guest_discard = keep to keep the "
        "reservation (a guest's TRIM then frees nothing), or keep "
        'reclaim if thin reclaim matters more here.', **facts)
