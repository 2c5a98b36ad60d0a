"""run_unittest.py runs a module from the working directory as `python3 -m unittest -v` does,
with `case-time` and `case-cpu` lines after each case and a `module-cpu` line at the end, and
fails as it does."""

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
    import subprocess
    import sys
    import time
    import unittest
    import helper  # beside it, in the working directory

    # A child process that spins for 0.5 s of CPU, then ends and is waited for.
    SPIN = "import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass"


    class T(unittest.TestCase):
        def test_slow(self):
            time.sleep(0.3)

        def test_busy_child(self):
            subprocess.run([sys.executable, "-c", SPIN], check=True)

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
        cases = {"test_mod.T.test_slow", "test_mod.T.test_busy_child", "test_mod.T.test_fails"}
        self.assertEqual(set(times), cases, run.stderr)
        self.assertGreaterEqual(times["test_mod.T.test_slow"], 0.3)
        self.assertIn("Ran 3 tests", run.stderr)

    def test_each_case_has_its_cpu_seconds_its_ended_children_included(self) -> None:
        run = self.run_module(2)
        cpu = dict(
            (m.group(2), float(m.group(1)))
            for m in re.finditer(r"^case-cpu (\d+\.\d) s (\S+)$", run.stderr, re.M)
        )
        self.assertEqual(len(cpu), 3, run.stderr)
        # The child's 0.5 s are the busy case's, not the sleeping one's.
        self.assertGreaterEqual(cpu["test_mod.T.test_busy_child"], 0.5, run.stderr)
        self.assertLess(cpu["test_mod.T.test_slow"], 0.2, run.stderr)
        module = re.search(r"^module-cpu (\d+\.\d) s test_mod$", run.stderr, re.M)
        self.assertIsNotNone(module, run.stderr)
        assert module is not None
        self.assertGreaterEqual(float(module.group(1)), cpu["test_mod.T.test_busy_child"])

    def test_a_failed_case_fails_the_run(self) -> None:
        run = self.run_module(3)
        self.assertEqual(run.returncode, 1, run.stderr)
        self.assertIn("FAIL: test_fails", run.stderr)
        self.assertIn("case-time", run.stderr)
        self.assertIn("module-cpu", run.stderr)


if __name__ == "__main__":
    unittest.main()
