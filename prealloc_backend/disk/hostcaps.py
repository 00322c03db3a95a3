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

"""What this host's QEMU and libvirt can do, asked of them, not of their
version numbers.

One capability so far: qcow2's ``discard-no-unref`` (QEMU 8.1; the fix
for clusters already zero is in 8.1.3 and 8.2) written by libvirt as
``<driver discard_no_unref='on'/>`` (libvirt 9.5). With it a guest's
discard of a qcow2 disk marks the clusters zero and keeps their place in
the image: the range reads zeros, ``qemu-img convert`` (a snapshot) skips
it, and a later write goes to the same cluster without allocating one.

- QEMU: ``qemu-img info --image-opts`` opens a scratch qcow2 with
  ``discard-no-unref=on``. A QEMU without the option refuses to open it
  ("Block format 'qcow2' does not support the option"), one with it opens
  it (measured: 10.0.13 rc 0, 7.2.22 rc 1). qemu-img's block layer is the
  one the guests' QEMU (qemu-system, the same source package) is built
  from; libvirt checks the guests' binary itself when it starts a domain.
- libvirt: its domain schema (``domaincommon.rng``, installed with the
  libvirt library that nova's libvirt-python loads) names the attribute
  from 9.5 on. No API says it (``virConnectGetDomainCapabilities`` lists
  no driver attributes), and libvirt 9.0 drops an attribute it does not
  know from a domain defined without validation, silently: the schema is
  libvirt's own answer.

Each answer is asked once per process (nova-compute, the check) and
cached: packages change under a running nova-compute only with a restart.
"""

import collections
import functools
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
# check).
Answer = collections.namedtuple('Answer', ['supported', 'reason'])


def qemu_discard_no_unref():
    """Answer: can this host's QEMU open a qcow2 node with
    ``discard-no-unref=on``?
    """
    try:
        with tempfile.TemporaryDirectory(prefix='prealloc-caps-') as tmp:
            path = os.path.join(tmp, 'probe.qcow2')
            qemu.execute('create', '-q', '-f', 'qcow2', path, '1M',
                         timeout=30)
            qemu.execute('info', '--image-opts',
                         'driver=qcow2,discard-no-unref=on,'
                         'file.driver=file,file.filename=%s' % path,
                         timeout=30)
    except exception.QemuImgError as exc:
        if 'discard-no-unref' in (exc.kwargs.get('stderr') or ''):
            return Answer(False, "qemu-img: qcow2 has no 'discard-no-unref' "
                                 'option (QEMU < 8.1)')
        return Answer(False, 'the probe failed: %s' % exc)
    except (exception.PreallocError, OSError) as exc:
        return Answer(False, 'the probe failed: %s' % exc)
    return Answer(True, "qemu-img opens a qcow2 with 'discard-no-unref=on'")


def libvirt_discard_no_unref(schemas=LIBVIRT_DOMAIN_SCHEMAS):
    """Answer: does this host's libvirt know ``discard_no_unref``?"""
    for path in schemas:
        try:
            with open(path, encoding='utf-8') as f:
                known = 'discard_no_unref' in f.read()
        except FileNotFoundError:
            continue
        except OSError as exc:
            return Answer(False, 'cannot read %s: %s' % (path, exc))
        if known:
            return Answer(True, "libvirt's domain schema (%s) has "
                                'discard_no_unref' % path)
        return Answer(False, "libvirt's domain schema (%s) has no "
                             'discard_no_unref (libvirt < 9.5)' % path)
    return Answer(False, "libvirt's domain schema is not installed (%s)"
                  % ', '.join(schemas))


@functools.lru_cache(maxsize=None)
def discard_no_unref():
    """Answer: both QEMU and libvirt have it (cached per process)."""
    answers = [qemu_discard_no_unref(), libvirt_discard_no_unref()]
    missing = [a.reason for a in answers if not a.supported]
    if missing:
        answer = Answer(False, '; '.join(missing))
    else:
        answer = Answer(True, '; '.join(a.reason for a in answers))
    LOG.info('qcow2 discard-no-unref on this host: %s (%s)',
             'yes' if answer.supported else 'no', answer.reason)
    return answer
