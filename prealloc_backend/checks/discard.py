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

Reads the configuration and asks the host's QEMU and libvirt whether they
have qcow2's discard-no-unref (disk.hostcaps: one qemu-img run on a
scratch file in the temporary directory, one read of libvirt's schema);
touches no instance file. The answer comes from ``diskplan.guest_discard``,
the function the backend's ``libvirt_info`` asks for each disk's
``<driver discard=... discard_no_unref=...>``, for the host's disk format
and every mode a flavor may choose.
"""

from prealloc_backend.checks import result
from prealloc_backend.disk import hostcaps
from prealloc_backend.planner import diskplan
from prealloc_backend.planner.modes import Mode

# What a guest's TRIM does, by what the disk's <driver> says.
_IGNORED = ("ignored (the reserved blocks, the qcow2 layout and the "
            "trimmed data stay)")
_NO_UNREF = ("dropped with discard-no-unref (the range reads zeros and "
             "snapshots skip it; its clusters keep their place; the host "
             "blocks under it are freed)")
_NO_UNREF_AGAIN = _NO_UNREF[:-1] + (" and reserved again at the guest's "
                                    "next start, hard reboot, resize or "
                                    "cold migration)")
_FREED = 'passed to the file (the host blocks it covers are freed)'


def discard_by_mode(host, no_unref):
    """{mode name: diskplan.GuestDiscard} of new disks of the host's
    format, ``no_unref`` being the host's discard-no-unref answer.
    """
    nova_discard = host.conf.libvirt.hw_disk_discard
    choice = host.conf.prealloc_backend.guest_discard
    return {mode.value: diskplan.guest_discard(mode, host.disk_format,
                                             nova_discard, choice,
                                             no_unref=no_unref)
            for mode in Mode}


def _behaviour(discard):
    if discard.no_unref:
        return _NO_UNREF_AGAIN if discard.reserve_again else _NO_UNREF
    if discard.discard == 'ignore':
        return _IGNORED
    return _FREED


def check_guest_discard(host):
    """A guest's TRIM keeps what the host's mode reserved, or the report
    says which disks lose it; either way it says what a TRIM does on each
    mode's disks, and whether this host has discard-no-unref.
    """
    nova_discard = host.conf.libvirt.hw_disk_discard
    choice = host.conf.prealloc_backend.guest_discard
    fmt = host.disk_format
    facts = {'hw_disk_discard': nova_discard, 'guest_discard': choice}
    if fmt is None:
        return result.success(
            'Not file disks (images_type = %s): nothing to check.'
            % host.conf.libvirt.images_type, **facts)
    capable = hostcaps.discard_no_unref()
    facts['discard_no_unref'] = {'supported': capable.supported,
                                 'reason': capable.reason}
    by_mode = discard_by_mode(host, capable.supported)
    facts['discard'] = {m: d.discard for m, d in by_mode.items()}
    facts['discard_no_unref_modes'] = sorted(
        m for m, d in by_mode.items() if d.no_unref)
    facts['reserved_again_modes'] = sorted(
        m for m, d in by_mode.items() if d.reserve_again)
    if nova_discard != 'unmap':
        return result.success(
            "[libvirt] hw_disk_discard = %s: QEMU does not pass a guest's "
            'discards to the disk files; a TRIM changes nothing on the '
            'host.' % (nova_discard or 'unset'), **facts)
    groups = {}
    for mode in Mode:
        groups.setdefault(_behaviour(by_mode[mode.value]), []).append(
            mode.value)
    what = '; '.join('mode %s: %s' % (', '.join(modes), behaviour)
                     for behaviour, modes in groups.items())
    capability = ('This host %s qcow2 discard-no-unref: %s.'
                  % ('has' if capable.supported else 'lacks',
                     capable.reason))
    summary = ("hw_disk_discard = unmap, guest_discard = %s. A guest's TRIM "
               'on %s disks of %s. %s' % (choice, fmt.value, what,
                                          capability))
    losing = [m for m, d in by_mode.items()
              if d.discard == 'unmap' and not d.no_unref and
              (Mode(m) in (Mode.SPACE, Mode.FULL) or
               (fmt is diskplan.DiskFormat.QCOW2 and Mode(m).preallocates))]
    if losing:
        return result.warning(
            '%s On disks of mode %s that undoes the preallocation: the '
            'freed ranges are allocated again on the next write (the slow '
            'first-write path) and the host can run out of space under the '
            "guest. This host's mode is %s."
            % (summary, ', '.join(sorted(losing)), host.mode.value),
            "Set [prealloc_backend] guest_discard = keep to keep the "
            "reservation (a guest's TRIM then frees nothing), or keep "
            'reclaim if thin reclaim matters more here.', **facts)
    if (choice == 'zero' and fmt is diskplan.DiskFormat.QCOW2 and
            not capable.supported):
        return result.warning(
            '%s guest_discard = zero therefore acts as keep here.'
            % summary,
            "Install QEMU 8.1.3 or later and libvirt 9.5 or later (Debian "
            "13, or Debian 12's bookworm-backports), restart nova-compute, "
            'or set guest_discard = keep to say what this host does.',
            **facts)
    if choice == 'zero' and fmt is diskplan.DiskFormat.RAW:
        return result.warning(
            '%s guest_discard = zero changes nothing on raw disks: it acts '
            'as keep.' % summary,
            'Set guest_discard = keep to say what this host does.', **facts)
    return result.success(summary, **facts)
