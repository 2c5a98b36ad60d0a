#!/usr/bin/env python3
"""`python3 -m unittest -v MODULE...` that also prints each case's seconds.

The suite's multi-process tests are Python modules of several cases each, and ctest times only
the module: a line `case-time 12.3 s test_x.Class.test_y` after each case lets
scripts/test.sh list the slowest cases from ctest's JUnit report (Python 3.11's unittest has no
--durations). The working directory is first on sys.path in place of this script's folder,
as it is for `-m unittest`.
Usage: run_unittest.py MODULE [MODULE...] (any `python3 -m unittest` arguments)."""

from __future__ import annotations

import os
import sys
import time
import unittest
from typing import Any, cast


class TimedResult(unittest.TextTestResult):
    """A verbose result that writes each case's wall-clock seconds when it ends. Not
    thread-safe (unittest runs one case at a time)."""

    _started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        self._started = time.monotonic()
        super().startTest(test)

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        self.stream.write("case-time %.1f s %s\n" % (time.monotonic() - self._started, test.id()))
        self.stream.flush()


def main(argv: list[str]) -> None:
    sys.path[0] = os.getcwd()
    # typeshed's resultclass is a callable of private stream types; the class is one.
    runner = unittest.TextTestRunner(resultclass=cast(Any, TimedResult), verbosity=2)
    unittest.main(module=None, argv=["run_unittest.py", "-v", *argv], testRunner=runner)


if __name__ == "__main__":
    main(sys.argv[1:])
