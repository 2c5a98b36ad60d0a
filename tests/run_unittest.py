#!/usr/bin/env python3
"""`python3 -m unittest -v MODULE...` that also prints each case's seconds and CPU seconds.

The suite's multi-process tests are Python modules of several cases each, and ctest times only
the module: a line `case-time 12.3 s test_x.Class.test_y` after each case lets
scripts/test.sh list the slowest cases from ctest's JUnit report (Python 3.11's unittest has no
--durations). On 2 cores the suite is bound by the CPU more than by any one test's turn, so
each case's CPU seconds follow (`case-cpu 20.1 s ID`), and the module's at the end
(`module-cpu 250.3 s ARGS`): this process's and those of the processes it started that ended
and were waited for within it (a vf run's workers, a control plane stopped by the test); what
a daemon left running, or reparented away, is not counted. The working directory is first on
sys.path in place of this script's folder, as it is for `-m unittest`.
Usage: run_unittest.py MODULE [MODULE...] (any `python3 -m unittest` arguments)."""

from __future__ import annotations

import os
import resource
import sys
import time
import unittest
from typing import Any, cast


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have ended and been
    waited for (theirs include their own waited-for children)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime


class TimedResult(unittest.TextTestResult):
    """A verbose result that writes each case's wall-clock and CPU seconds when it ends. Not
    thread-safe (unittest runs one case at a time)."""

    _started = 0.0
    _cpu = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        self._started = time.monotonic()
        self._cpu = cpu_seconds()
        super().startTest(test)

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        self.stream.write("case-time %.1f s %s\n" % (time.monotonic() - self._started, test.id()))
        self.stream.write("case-cpu %.1f s %s\n" % (cpu_seconds() - self._cpu, test.id()))
        self.stream.flush()


def main(argv: list[str]) -> None:
    sys.path[0] = os.getcwd()
    # typeshed's resultclass is a callable of private stream types; the class is one.
    runner = unittest.TextTestRunner(resultclass=cast(Any, TimedResult), verbosity=2)
    program = unittest.main(
        module=None, argv=["run_unittest.py", "-v", *argv], testRunner=runner, exit=False
    )
    sys.stderr.write("module-cpu %.1f s %s\n" % (cpu_seconds(), ",".join(argv)))
    sys.exit(0 if program.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
