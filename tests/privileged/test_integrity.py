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

"""Data integrity: what the guest sees is the base image, plus zeros.

Every disk here is made through the plugin's image backend exactly as nova's
libvirt driver makes it (``Backend(use_cow).by_name(...).cache(...)``), with
real qemu-img and real files, from base images whose content and layout
(data, written zeros, holes, odd sizes) are drawn from random seeds. Each
seed is recorded in the test's details; set ``PREALLOC_TEST_SEED`` to replay
a run.

The guest's view of a disk is read back independently of the plugin
(``qemu-img convert`` to raw, then byte comparison) and also checked with
``qemu-img compare``.
"""

import hashlib
import os
import random
import shutil
import subprocess

import fixtures
from oslo_log import log as logging
from oslo_utils import units
import testscenarios
from testtools import content

from prealloc_backend.adapter import backend
from prealloc_backend.disk import fsprobe
import prealloc_backend.privsep.fs
from prealloc_backend.system import fileops
from tests import base
from tests import fixtures as pb_fixtures

LOG = logging.getLogger(__name__)

load_tests = testscenarios.load_tests_apply_scenarios

SEED_ENV = 'PREALLOC_TEST_SEED'
# Seeds drawn per format x mode scenario (each also draws its own sizes).
SEEDS_PER_SCENARIO = 2
CLUSTER = 64 * units.Ki
READ_CHUNK = units.Mi

MODES = ('none', 'metadata', 'space', 'full')
# (images_type, base image format, how nova makes the disk)
LAYOUTS = {
    'qcow2-overlay-of-raw': ('qcow2', 'raw', 'image'),
    'qcow2-overlay-of-qcow2': ('qcow2', 'qcow2', 'image'),
    'raw-copy-of-raw': ('raw', 'raw', 'image'),
    # images_type=raw with force_raw_images=False: nova's Flat copies a
    # qcow2 image as it is, and the disk is a qcow2 file.
    'raw-copy-of-qcow2': ('raw', 'qcow2', 'image'),
    # ephemeral and swap disks: nova generates them in place, no base
    'raw-generated': ('raw', None, 'generated'),
}


def seed_source():
    """A random generator of seeds: PREALLOC_TEST_SEED replays a run."""
    fixed = os.environ.get(SEED_ENV)
    if fixed:
        return random.Random(int(fixed))
    return random.SystemRandom()


def random_raw(path, size, rng):
    """Write a raw file of ``size`` bytes made of random segments: random
    data, explicitly written zeros (allocated, not holes) and holes, at
    unaligned offsets. The last byte is always data so the size is exact.
    Returns the sha256 of the content.
    """
    with open(path, 'wb') as f:
        f.truncate(size)
        pos = 0
        while pos < size:
            length = min(rng.randint(1, 192 * units.Ki), size - pos)
            kind = rng.random()
            if kind < 0.45:
                f.seek(pos)
                f.write(rng.randbytes(length))
            elif kind < 0.55:
                f.seek(pos)
                f.write(bytes(length))
            pos += length
        f.seek(size - 1)
        f.write(bytes([rng.randint(1, 255)]))
    return sha256_of(path)


def sha256_of(path, limit=None):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        remaining = limit
        while remaining is None or remaining > 0:
            want = READ_CHUNK if remaining is None else min(READ_CHUNK,
                                                            remaining)
            block = f.read(want)
            if not block:
                break
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
    return digest.hexdigest()


def guest_view(path, out):
    """The bytes a guest reads from disk ``path``, as a raw file ``out``
    (qemu-img follows backing files; nothing of the plugin is involved).
    """
    subprocess.run(['qemu-img', 'convert', '-U', '-O', 'raw', path, out],
                   check=True, capture_output=True)
    return out


def expected_view(base_raw, size, out, writes=()):
    """base_raw's content cut or zero-extended to ``size``, with guest
    ``writes`` [(offset, bytes)] applied: what a guest must read.
    """
    with open(base_raw, 'rb') as src, open(out, 'wb') as dst:
        shutil.copyfileobj(src, dst)
        dst.truncate(size)
        for offset, data in writes:
            dst.seek(offset)
            dst.write(data)
    return out


def qemu_img_check(path):
    proc = subprocess.run(['qemu-img', 'check', '-U', '-f', 'qcow2', path],
                          capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def data_ranges(path):
    """[(offset, length)] of the data (non-hole) ranges of a file."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        ranges, pos = [], 0
        for offset, length in fileops.holes(fd, 0, size):
            if offset > pos:
                ranges.append((pos, offset - pos))
            pos = offset + length
        if pos < size:
            ranges.append((pos, size - pos))
        return ranges
    finally:
        os.close(fd)


class IntegrityBase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.scratch = self.useFixture(fixtures.TempDir()).path
        self.fetches = []

    def seeds(self, count):
        source = seed_source()
        seeds = [source.randrange(2 ** 32) for _ in range(count)]
        self.addDetail('seeds', content.text_content(
            '%s=%s' % (SEED_ENV, ' '.join(str(s) for s in seeds))))
        return seeds

    def make_source(self, name, fmt, size, rng):
        """A Glance-like image: random raw content, converted to ``fmt``.
        Returns (image path, raw path of its content, sha256 of content).
        """
        raw = os.path.join(self.scratch, name + '.raw')
        digest = random_raw(raw, size, rng)
        if fmt == 'raw':
            return raw, raw, digest
        image = os.path.join(self.scratch, name + '.' + fmt)
        subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O', fmt, raw,
                        image], check=True, capture_output=True)
        return image, raw, digest

    def fetcher(self, source):
        def fetch(target, *args, **kwargs):
            # NOTE(nova): sparse copy, as nova's fetch_to_raw leaves a
            # converted image: the base keeps its holes.
            self.fetches.append(target)
            subprocess.run(['cp', '--sparse=always', source, target],
                           check=True, capture_output=True)
        return fetch

    def generator(self, rng, writes):
        """fetch_func of a generated disk (ephemeral/swap): nova writes a
        filesystem into a new sparse file; random blocks stand for it.
        """
        def generate(target, *args, **kwargs):
            size = self.generated_size
            with open(target, 'wb') as f:
                f.truncate(size)
                for _ in range(8):
                    offset = rng.randrange(0, size - 4096)
                    data = rng.randbytes(rng.randint(1, 4096))
                    f.seek(offset)
                    f.write(data)
                    writes.append((offset, data))
        return generate

    def cache(self, image, fetch, filename, size, generated=False):
        kwargs = {} if generated else {'image_id': filename}
        image.cache(fetch_func=fetch, filename=filename, size=size, **kwargs)
        return image

    def assert_guest_sees(self, disk, expected, label):
        view = guest_view(disk, os.path.join(self.scratch, 'view.raw'))
        self.assertEqual(os.path.getsize(expected), os.path.getsize(view),
                         '%s: virtual size' % label)
        self.assertEqual(sha256_of(expected), sha256_of(view),
                         '%s: guest-visible content differs' % label)
        rc, out = pb_fixtures.qemu_img_compare(expected, disk)
        self.assertEqual(0, rc, '%s: qemu-img compare: %s' % (label, out))
        os.unlink(view)

    def assert_no_leftovers(self, disk):
        for suffix in (backend.JOURNAL_SUFFIX, backend.TMP_SUFFIX):
            self.assertFalse(os.path.exists(disk + suffix), disk + suffix)


class FormatModeIntegrityTestCase(IntegrityBase):
    """Every format x mode, created then grown: base plus zeros. Raw
    copies also on filesystems whose SEEK_HOLE and fallocate(2) differ.
    """

    scenarios = [
        ('%s-%s' % (layout, mode), {'layout': layout, 'mode': mode,
                                    'fs': None})
        for layout in LAYOUTS for mode in MODES] + [
        ('raw-copy-of-raw-%s-on-%s' % (mode, fs),
         {'layout': 'raw-copy-of-raw', 'mode': mode, 'fs': fs})
        for fs in ('ext4-noextents', 'xfs') for mode in ('space', 'full')]

    def setUp(self):
        super().setUp()
        if self.fs:
            self.use_loop_fs(self.fs, 64)
            self.flags(group='prealloc_backend',
                       fallocate_unsupported='zero-fill')

    def _run_seed(self, seed, index):
        rng = random.Random(seed)
        images_type, base_fmt, how = LAYOUTS[self.layout]
        self.flags(group='prealloc_backend', mode=self.mode)
        # Sizes that are not multiples of the cluster size: a byte-odd raw
        # base, a sector-aligned qcow2 base, odd disk and resize targets.
        if base_fmt == 'raw':
            base_size = rng.randint(1 * units.Mi, 3 * units.Mi) | 1
        else:
            base_size = rng.randint(2048, 6144) * 512 + 512
        if base_size % CLUSTER == 0:
            base_size += 512
        self.assertNotEqual(0, base_size % CLUSTER)
        first = (base_size + 511) // 512 * 512 + rng.randint(1, 64) * 512
        grown = first + rng.randint(1, 96) * 4096 + 512
        label = '%s seed %d' % (self.id(), seed)
        instance = self.make_instance()
        backend_ = backend.Backend(images_type == 'qcow2')
        generated = how == 'generated'
        disk_name = 'disk.eph0' if generated else 'disk'
        filename = '%s-%d-%d' % ('ephemeral' if generated else 'base',
                                 index, seed)

        writes = []
        if generated:
            # nova makes ephemeral disks in place, at their size, from no
            # image: the expected content is what the generator wrote.
            src_raw = os.path.join(self.scratch, 'empty%d.raw' % index)
            open(src_raw, 'wb').close()
            self.generated_size = first
            fetch = self.generator(rng, writes)
        else:
            src, src_raw, _digest = self.make_source('src%d' % index,
                                                     base_fmt, base_size, rng)
            fetch = self.fetcher(src)
        image = backend_.by_name(instance, disk_name, images_type)
        self.cache(image, fetch, filename, first, generated)
        disk = image.path
        self.assert_no_leftovers(disk)
        expected = expected_view(src_raw, first,
                                 os.path.join(self.scratch, 'exp.raw'),
                                 writes)
        self.assert_guest_sees(disk, expected, label + ' (created)')
        self._assert_mode_applied(disk, images_type, first)

        # The guest writes, then the disk is grown (resize): the guest's
        # data and the base must stay, the new tail must read as zeros.
        disk_format = pb_fixtures.qemu_img_info(disk)['format']
        guest_writes = self._guest_writes(disk, disk_format, first, rng)
        image = backend_.by_name(instance, disk_name, images_type)
        self.cache(image, fetch, filename, grown, generated)
        self.assert_no_leftovers(disk)
        expected = expected_view(src_raw, grown,
                                 os.path.join(self.scratch, 'exp.raw'),
                                 writes + guest_writes)
        self.assert_guest_sees(disk, expected, label + ' (grown)')
        self._assert_mode_applied(disk, images_type, grown)
        if disk_format == 'qcow2':
            rc, out = qemu_img_check(disk)
            self.assertEqual(0, rc, '%s: qemu-img check: %s' % (label, out))
        # The base is fetched once, at creation, never for the resize.
        self.assertEqual(0 if generated else 1,
                         self.fetches.count(self.base_path(filename)),
                         label + ': fetches %s' % self.fetches)

    def _guest_writes(self, disk, disk_format, size, rng):
        """Write like a running guest: qemu-io into the qcow2 overlay,
        plain writes into a raw file. Returns [(offset, bytes)].
        """
        writes = []
        for _ in range(4):
            length = rng.randint(1, 16) * 512
            offset = rng.randrange(0, size - length, 512)
            data = rng.randbytes(length)
            writes.append((offset, data))
        if disk_format == 'raw':
            with open(disk, 'r+b') as f:
                for offset, data in writes:
                    f.seek(offset)
                    f.write(data)
            return writes
        for offset, data in writes:
            chunk = os.path.join(self.scratch, 'chunk')
            with open(chunk, 'wb') as f:
                f.write(data)
            # qemu-io writes through the qcow2 driver, as the guest
            # would; a json: filename reads the payload from a raw file.
            subprocess.run(
                ['qemu-io', '-f', 'qcow2', '-c',
                 'write -s %s %d %d' % (chunk, offset, len(data)), disk],
                check=True, capture_output=True)
        return writes

    def _assert_mode_applied(self, disk, images_type, size):
        """Proof that the mode really ran (an integrity test on a thin disk
        would prove little about preallocation).
        """
        allocated = pb_fixtures.allocated(disk)
        # A qcow2 copy made by Flat is preallocated only where it
        # grows (reported as a gap), so only its content is checked.
        copied_qcow2 = self.layout == 'raw-copy-of-qcow2'
        if self.mode in ('space', 'full') and not copied_qcow2:
            self.assertGreaterEqual(allocated, size,
                                    '%s allocated %d < %d' % (disk, allocated,
                                                              size))
        if images_type == 'qcow2':
            info = pb_fixtures.qemu_img_info(disk)
            # Mode none makes exactly nova's overlay (diskplan._none_plan).
            self.assertEqual(self.mode != 'none',
                             info['format-specific']['data'].get(
                                 'extended-l2', False))
        elif LAYOUTS[self.layout][1] == 'qcow2':
            self.assertEqual('qcow2', pb_fixtures.qemu_img_info(disk)[
                'format'])

    def test_content_is_base_plus_zeros(self):
        seeds = self.seeds(SEEDS_PER_SCENARIO)
        for index, seed in enumerate(seeds):
            self._run_seed(seed, index)


class FullNeverOverwritesTestCase(IntegrityBase):
    """``full`` on raw disks holding data scattered among holes, on the
    host's filesystem and on loop-mounted ones whose SEEK_HOLE answers
    differ (ext4 without extents reports unflushed data as holes).
    """

    scenarios = [('host', {'fs': None}),
                 ('ext4-noextents', {'fs': 'ext4-noextents'}),
                 ('xfs', {'fs': 'xfs'})]

    def setUp(self):
        super().setUp()
        if self.fs:
            self.use_loop_fs(self.fs, 64)
        self.flags(group='prealloc_backend', mode='full',
                   fallocate_unsupported='zero-fill')

    def _scattered(self, path, size, rng):
        """Data islands of every awkward kind among holes: single bytes at
        odd offsets, islands straddling 4K and 64K boundaries, the first and
        the last byte, runs of written zeros. Returns the sha256.
        """
        with open(path, 'wb') as f:
            f.truncate(size)
            spots = [(0, 1), (size - 1, 1), (4095, 2), (65535, 3),
                     (size // 2 + 1, 1)]
            for _ in range(rng.randint(20, 60)):
                offset = rng.randrange(0, size - 1)
                spots.append((offset, min(rng.randint(1, 9000),
                                          size - offset)))
            for offset, length in spots:
                f.seek(offset)
                f.write(rng.randbytes(length) if rng.random() < 0.9
                        else bytes(length))
        return sha256_of(path)

    def _assert_filled_and_intact(self, path, digest, before_data, label):
        self.assertEqual(digest, sha256_of(path), label + ': content changed')
        self.assertEqual(0, pb_fixtures.hole_bytes(path),
                         label + ': holes left')
        self.assertGreaterEqual(pb_fixtures.allocated(path),
                                os.path.getsize(path))
        # Every byte that was data before reads the same (the digest says
        # so for the whole file; this names the first island that differs).
        with open(path, 'rb') as f:
            for offset, data in before_data:
                f.seek(offset)
                self.assertEqual(data, f.read(len(data)),
                                 '%s: data at %d overwritten' % (label,
                                                                 offset))

    def _read_data(self, path):
        out = []
        with open(path, 'rb') as f:
            for offset, length in data_ranges(path):
                f.seek(offset)
                out.append((offset, f.read(length)))
        return out

    def test_copy_of_scattered_base(self):
        for seed in self.seeds(3):
            rng = random.Random(seed)
            size = rng.randint(2 * units.Mi, 6 * units.Mi) | 1
            src = os.path.join(self.scratch, 'scattered-%d' % seed)
            self._scattered(src, size, rng)
            instance = self.make_instance()
            image = backend.Backend(False).by_name(instance, 'disk', 'raw')
            image.cache(fetch_func=self.fetcher(src), filename='s%d' % seed,
                        size=size + 3 * units.Mi, image_id='s%d' % seed)
            expected = expected_view(src, size + 3 * units.Mi,
                                     os.path.join(self.scratch, 'exp'))
            self._assert_filled_and_intact(image.path, sha256_of(expected),
                                           self._read_data(expected),
                                           'seed %d' % seed)

    def test_existing_disk_with_guest_data(self):
        """An existing raw disk (hard reboot, resize) switched to full: the
        guest's data stays byte for byte, the holes become zeros.
        """
        for seed in self.seeds(3):
            rng = random.Random(seed)
            instance = self.make_instance()
            image = backend.Backend(False).by_name(instance, 'disk', 'raw')
            os.makedirs(os.path.dirname(image.path), exist_ok=True)
            size = rng.randint(2 * units.Mi, 6 * units.Mi) // 512 * 512
            digest = self._scattered(image.path, size, rng)
            before = self._read_data(image.path)
            src = os.path.join(self.scratch, 'unused')
            open(src, 'wb').close()
            image.cache(fetch_func=self.fetcher(src), filename='u%d' % seed,
                        size=size, image_id='u%d' % seed)
            self._assert_filled_and_intact(image.path, digest, before,
                                           'seed %d' % seed)

    def test_zero_fill_entrypoint_ranges(self):
        """The privileged zero-fill called range by range, with ranges that
        start and end inside data islands and inside holes.
        """
        for seed in self.seeds(3):
            rng = random.Random(seed)
            inst_dir = os.path.join(self.instances_path, 'i%d' % seed)
            os.makedirs(inst_dir)
            path = os.path.join(inst_dir, 'disk')
            size = rng.randint(1 * units.Mi, 4 * units.Mi) | 1
            digest = self._scattered(path, size, rng)
            before = self._read_data(path)
            holes = pb_fixtures.hole_bytes(path)
            cuts = sorted(rng.sample(range(1, size), 7))
            bounds = [0] + cuts + [size]
            written = 0
            for start, stop in zip(bounds, bounds[1:]):
                written += prealloc_backend.privsep.fs.zero_fill_range(
                    path, start, stop - start)
            # A cut inside a hole: filling the first part allocates the
            # whole filesystem block, which the next range finds as data
            # (reading zeros), so the sum can be below the first count.
            self.assertLessEqual(written, holes)
            self.assertGreater(written, 0)
            self._assert_filled_and_intact(path, digest, before,
                                           'seed %d' % seed)
            # A second pass finds nothing to write.
            self.assertEqual(0, prealloc_backend.privsep.fs.zero_fill_range(
                path, 0, size))
            self.assertEqual(digest, sha256_of(path))

    def test_space_then_full_keeps_data(self):
        """Unwritten extents left by fallocate (space) read as zeros and
        report as holes: zero-filling them later (full) keeps every byte.
        """
        for seed in self.seeds(2):
            rng = random.Random(seed)
            inst_dir = os.path.join(self.instances_path, 'sf%d' % seed)
            os.makedirs(inst_dir)
            path = os.path.join(inst_dir, 'disk')
            size = rng.randint(1 * units.Mi, 4 * units.Mi) // 4096 * 4096
            digest = self._scattered(path, size, rng)
            before = self._read_data(path)
            if fsprobe.supports_fallocate(inst_dir):
                prealloc_backend.privsep.fs.fallocate_range(path, 0, size)
            self.assertEqual(digest, sha256_of(path))
            prealloc_backend.privsep.fs.zero_fill_range(path, 0, size)
            self._assert_filled_and_intact(path, digest, before,
                                           'seed %d' % seed)
