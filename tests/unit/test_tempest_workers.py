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

"""tools/tempest_workers.py: how the cloud tier's Tempest run is split
(parallel classes dealt by their recorded seconds, serial ones alone), run
as tools/cloud-tempest runs it: a Python process importing the test
classes (here a made-up package of them) and writing the files Tempest
reads.
"""

import datetime
import io
import os
import re
import subprocess
import sys
import textwrap

import subunit
import yaml

from tests import base

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(TOP, 'tools', 'tempest_workers.py')

MODULE = textwrap.dedent('''
    class Base(object):
        _serial = False

        @classmethod
        def is_serial_execution_requested(cls):
            return cls._serial

    def serial(cls):
        cls._serial = True
        return cls

    @serial
    class Alone(Base):
        pass

    class AloneToo(Alone):
        pass

    class Long(Base):
        pass

    class Middle(Base):
        pass

    class Short(Base):
        pass

    class Unknown(Base):
        pass

    class ByMethod(Base):
        @classmethod
        def is_serial_execution_requested(cls):
            return True
''')


class TestTempestWorkers(base.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.instances_path
        os.mkdir(os.path.join(self.dir, 'fakeplugin'))
        with open(os.path.join(self.dir, 'fakeplugin', '__init__.py'),
                  'w'):
            pass
        with open(os.path.join(self.dir, 'fakeplugin', 'tests.py'),
                  'w') as f:
            f.write(MODULE)

    def run_script(self, *args, stdin=None):
        env = dict(os.environ, PYTHONPATH=self.dir)
        return subprocess.run([sys.executable, SCRIPT] + list(args),
                              input=stdin, capture_output=True, env=env,
                              timeout=60)

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, 'w') as f:
            f.write(text)
        return path

    def run_split(self, ids, times, workers=2):
        """The script's split of ``ids`` by ``times`` (the files' texts):
        (its process, the directory it wrote to).
        """
        out = os.path.join(self.dir, 'out')
        os.mkdir(out)
        proc = self.run_script(
            'split', '--ids', self.write('ids.txt', ids),
            '--times', self.write('times.txt', times),
            '--workers', str(workers), '--out', out)
        return proc, out

    def split(self, ids, times, workers=2):
        proc, out = self.run_split(ids, times, workers)
        self.assertEqual(0, proc.returncode, proc.stderr)

        def lines(name):
            with open(os.path.join(out, name)) as f:
                return f.read().splitlines()
        with open(os.path.join(out, 'workers.yaml')) as f:
            workers = [w['worker'] for w in yaml.safe_load(f)]
        return (lines('parallel.txt'), lines('serial.txt'), workers,
                proc.stdout.decode())

    def test_split(self):
        ids = '\n'.join([
            'fakeplugin.tests.Alone.test_a[id-1,smoke]',
            'fakeplugin.tests.AloneToo.test_b[id-2]',
            'fakeplugin.tests.Long.test_c[id-3]',
            'fakeplugin.tests.Long.test_d[id-4]',
            'fakeplugin.tests.Middle.test_e',
            'fakeplugin.tests.Short.test_f[id-6]',
            'fakeplugin.tests.Unknown.test_g[id-7](scenario-1)',
            'fakeplugin.tests.ByMethod.test_h',
        ]) + '\n'
        times = textwrap.dedent('''
            # seconds class
            100 fakeplugin.tests.Long
            60 fakeplugin.tests.Middle
            10 fakeplugin.tests.Short
            50 fakeplugin.tests.Alone
        ''')
        parallel, serial, workers, out = self.split(ids, times)
        self.assertEqual(['fakeplugin.tests.Alone.test_a[id-1,smoke]',
                          'fakeplugin.tests.AloneToo.test_b[id-2]',
                          'fakeplugin.tests.ByMethod.test_h'], serial)
        self.assertEqual(['fakeplugin.tests.Long.test_c[id-3]',
                          'fakeplugin.tests.Long.test_d[id-4]',
                          'fakeplugin.tests.Middle.test_e',
                          'fakeplugin.tests.Short.test_f[id-6]',
                          'fakeplugin.tests.Unknown.test_g[id-7](scenario-1)'],
                         parallel)
        # The longest first, each to the least loaded: Long (100) alone;
        # Middle (60), Unknown (30 by default) and Short (10) together.
        picked = [[i for i in parallel
                   if any(re.search(r, i) for r in worker)]
                  for worker in workers]
        self.assertEqual([parallel[:2], parallel[2:]], picked)
        self.assertIn('worker 0: 1 classes, about 100 s', out)
        self.assertIn('worker 1: 3 classes, about 100 s', out)
        self.assertIn('serial: 3 classes, about 110 s '
                      '(Alone, AloneToo, ByMethod)', out)

    def test_a_class_named_like_the_start_of_another(self):
        # A worker's regex is its class's whole name, then a dot.
        ids = ('fakeplugin.tests.Short.test_f\n'
               'fakeplugin.tests.ShortX.test_x\n')
        parallel, serial, workers, _ = self.split(
            ids, '90 fakeplugin.tests.ShortX\n')
        self.assertEqual([], serial)
        for worker, expected in zip(workers, (['fakeplugin.tests.ShortX'],
                                              ['fakeplugin.tests.Short'])):
            self.assertEqual(
                [i for i in parallel
                 if i.rpartition('.')[0] in expected],
                [i for i in parallel if any(re.search(r, i)
                                            for r in worker)])

    def test_a_line_not_a_test_id(self):
        # stestr list prints ids only: anything else is an error, never a
        # test left out.
        proc, _out = self.run_split('fakeplugin.tests.Long.test_c\n'
                                    'fakeplugin.tests.Long.test c\n', '')
        self.assertEqual(1, proc.returncode)
        self.assertIn("ids.txt:2: 'fakeplugin.tests.Long.test c' is not a "
                      'test id', proc.stderr.decode())

    def test_bad_times_line(self):
        proc, _out = self.run_split('', '12s fakeplugin.tests.Long\n')
        self.assertEqual(1, proc.returncode)
        self.assertIn("times.txt:1: '12s fakeplugin.tests.Long' is not "
                      '"SECONDS CLASS"', proc.stderr.decode())

    def test_times_of_a_run(self):
        stream = io.BytesIO()
        result = subunit.StreamResultToBytes(stream)
        start = datetime.datetime(2026, 11, 30, tzinfo=datetime.timezone.utc)
        for test_id, begin, end, status in (
                ('fakeplugin.tests.Long.test_c[id-3]', 0, 40, 'success'),
                ('fakeplugin.tests.Long.test_d[id-4]', 40, 100, 'fail'),
                ('fakeplugin.tests.Short.test_f', 5, 7, 'skip')):
            result.status(test_id=test_id, test_status='inprogress',
                          timestamp=start + datetime.timedelta(seconds=begin))
            result.status(test_id=test_id, test_status=status,
                          timestamp=start + datetime.timedelta(seconds=end))
        proc = self.run_script('times', stdin=stream.getvalue())
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertEqual('100 fakeplugin.tests.Long\n'
                         '2 fakeplugin.tests.Short\n', proc.stdout.decode())
