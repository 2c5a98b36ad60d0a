"""run_unittest.py runs a module from the working directory as `python3 -m unittest -v` does,
with a `case-time` line after each case, and fails as it does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_unittest.py")

MODULE = textwrap.dedent("""\
    import time
    import unittest
    import helper  # beside it, in the working directory


    class T(unittest.TestCase):
        def test_slow(self):
            time.sleep(0.3)

        def test_fails(self):
            self.assertEqual(helper.VALUE, 2)
    """)


class RunUnittestTest(unittest.TestCase):
    def run_module(self, value: int) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_mod.py"), "w") as f:
                f.write(MODULE)
            with open(os.path.join(tmp, "helper.py"), "w") as f:
                f.write("VALUE = %d\n" % value)
            return subprocess.run(
                [sys.executable, RUNNER, "test_mod"],
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=60,
            )

    def test_each_case_has_its_seconds_and_a_pass_exits_0(self) -> None:
        run = self.run_module(2)
        self.assertEqual(run.returncode, 0, run.stderr)
        times = dict(
            (m.group(2), float(m.group(1)))
            for m in re.finditer(r"^case-time (\d+\.\d) s (\S+)$", run.stderr, re.M)
        )
        self.assertEqual(set(times), {"test_mod.T.test_slow", "test_mod.T.test_fails"}, run.stderr)
        self.assertGreaterEqual(times["test_mod.T.test_slow"], 0.3)
        self.assertIn("Ran 2 tests", run.stderr)

    def test_a_failed_case_fails_the_run(self) -> None:
        run = self.run_module(3)
        self.assertEqual(run.returncode, 1, run.stderr)
        self.assertIn("FAIL: test_fails", run.stderr)
        self.assertIn("case-time", run.stderr)


if __name__ == "__main__":
    unittest.main()
