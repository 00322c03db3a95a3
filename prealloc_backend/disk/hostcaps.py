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

"""What this host's QEMU and libvirt can do, asked of them where they can
be asked, not read from version numbers.

One capability so far: qcow2's ``discard-no-unref`` (QEMU 8.1; 8.1.3 and
8.2 keep the reference on write-zeroes with unmap too: a guest's
``blkdiscard -z``, a mirror's zero writes) written by libvirt as
``<driver discard_no_unref='on'/>`` (libvirt 9.5). With it a guest's
discard of a qcow2 disk marks the clusters zero and keeps their place in
the image: the range reads zeros, ``qemu-img convert`` (a snapshot) skips
it, and a later write goes to the same cluster without allocating one.

- QEMU's block layer: ``qemu-img info --image-opts`` opens a scratch qcow2
  with ``discard-no-unref=on``. A QEMU without the option refuses to open
  it ("Block format 'qcow2' does not support the option"), one with it
  opens it (measured: 10.0.13 rc 0, 7.2.22 rc 1).
- libvirt's grammar: its domain schema (``domaincommon.rng``, installed
  with the libvirt library) names the attribute from 9.5 on.
- The daemon and the emulator nova-compute's connection talks to: no API
  says whether they take the attribute (``virConnectGetDomainCapabilities``
  lists no driver attributes; a libvirtd older than 9.5 drops an attribute
  it does not know from a domain nova defines, silently; libvirt 9.5+
  refuses a domain whose QEMU lacks it, which would fail the guest's start).
  Where nova-compute runs, the driver's ``init_host`` records the
  connection's libvirt and emulator versions (``record_connection``), and
  both must reach the floors above: the one place where a version
  decides, because the daemon and the emulator may be other packages than
  the library and qemu-img here (containers, a partial upgrade).

The two probes of this host are asked once per process when they answer
(a probe that fails, a full /tmp, is asked again next time): packages
change under a running nova-compute only with a restart.
"""

import collections
import os
import tempfile

from oslo_log import log as logging

from prealloc_backend.disk import qemu
from prealloc_backend import exception

LOG = logging.getLogger(__name__)

# The libvirt library's domain grammar (libvirt0 on Debian and Ubuntu,
# libvirt-libs on RHEL).
LIBVIRT_DOMAIN_SCHEMAS = (
    '/usr/share/libvirt/schemas/domaincommon.rng',
)

# A probe's answer: ``supported`` and, either way, why (for logs and the
# check); ``definite``: False where the probe itself failed (asked again).
Answer = collections.namedtuple('Answer', ['supported', 'reason',
                                           'definite'], defaults=(True,))

# The floors of the connection's daemon and emulator (libvirt's and
# QEMU's numbers: major * 1000000 + minor * 1000 + micro).
LIBVIRT_FLOOR = 9005000
QEMU_FLOOR = 8001003

# (libvirt version, emulator version) of nova-compute's connection, once
# the driver's init_host recorded them.
_connection = None


def _dotted(number):
    return '%d.%d.%d' % (number // 1000000, number // 1000 % 1000,
                         number % 1000)


def record_connection(libvirt_version, emulator_version):
    """Record the versions nova-compute's libvirt connection reports
    (virConnectGetLibVersion, virConnectGetVersion).
    """
    global _connection
    _connection = (int(libvirt_version), int(emulator_version))


def connection_discard_no_unref():
    """Answer for the recorded connection, or None when none was."""
    if _connection is None:
        return None
    lib, emulator = _connection
    missing = []
    if lib < LIBVIRT_FLOOR:
        missing.append('the connection\'s libvirt is %s (9.5.0 writes '
                       'discard_no_unref)' % _dotted(lib))
    if emulator < QEMU_FLOOR:
        missing.append('its QEMU is %s (8.1.3 keeps the clusters on every '
                       'discard)' % _dotted(emulator))
    if missing:
        return Answer(False, '; '.join(missing))
    return Answer(True, "the connection's libvirt %s and QEMU %s"
                  % (_dotted(lib), _dotted(emulator)))


def qemu_discard_no_unref():
    """Answer: can this host's QEMU open a qcow2 node with
    ``discard-no-unref=on``?
    """
    try:
        with tempfile.TemporaryDirectory(prefix='prealloc-caps-') as tmp:
            path = os.path.join(tmp, 'probe.qcow2')
            qemu.execute('create', '-q', '-f', 'qcow2', path, '1M',
                         timeout=30)
            # A comma in an --image-opts value is written twice.
            qemu.execute('info', '--image-opts',
                         'driver=qcow2,discard-no-unref=on,'
                         'file.driver=file,file.filename=%s'
                         % path.replace(',', ',,'),
                         timeout=30)
    except exception.QemuImgError as exc:
        if 'discard-no-unref' in (exc.kwargs.get('stderr') or ''):
            return Answer(False, "qemu-img: qcow2 has no 'discard-no-unref' "
                                 'option (QEMU < 8.1)')
        return Answer(False, 'the probe failed: %s' % exc, definite=False)
    except (exception.PreallocError, OSError) as exc:
        return Answer(False, 'the probe failed: %s' % exc, definite=False)
    return Answer(True, "qemu-img opens a qcow2 with 'discard-no-unref=on'")


def libvirt_discard_no_unref(schemas=LIBVIRT_DOMAIN_SCHEMAS):
    """Answer: does this host's libvirt know ``discard_no_unref``?"""
    for path in schemas:
        try:
            with open(path, 'rb') as f:
                known = b'discard_no_unref' in f.read()
        except FileNotFoundError:
            continue
        except OSError as exc:
            return Answer(False, 'cannot read %s: %s' % (path, exc),
                          definite=False)
        if known:
            return Answer(True, "libvirt's domain schema (%s) has "
                                'discard_no_unref' % path)
        return Answer(False, "libvirt's domain schema (%s) has no "
                             'discard_no_unref (libvirt < 9.5)' % path)
    return Answer(False, "libvirt's domain schema is not installed (%s)"
                  % ', '.join(schemas))


_host_answers = []


def _host_discard_no_unref():
    """The two probes of this host, kept once both gave a definite answer
    (a failed probe is asked again next time).
    """
    if _host_answers:
        return _host_answers
    answers = [qemu_discard_no_unref(), libvirt_discard_no_unref()]
    if all(a.definite for a in answers):
        _host_answers.extend(answers)
    return answers


def forget():
    """Drop what was asked and recorded (tests; a new connection)."""
    global _connection
    _connection = None
    del _host_answers[:]


def discard_no_unref():
    """Answer: this host's qemu-img and libvirt schema have it, and so
    have the connection's libvirt and QEMU where the driver recorded them.
    """
    answers = list(_host_discard_no_unref())
    connection = connection_discard_no_unref()
    if connection is not None:
        answers.append(connection)
    missing = [a.reason for a in answers if not a.supported]
    if missing:
        answer = Answer(False, '; '.join(missing))
    else:
        answer = Answer(True, '; '.join(a.reason for a in answers))
    if connection is None:
        answer = Answer(answer.supported, answer.reason +
                        " (libvirtd's own versions not asked)")
    return answer
