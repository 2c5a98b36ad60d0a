#!/usr/bin/env python3
"""Prints, for each failed test in ctest's JUnit report, the lines that say why it failed.

A failed end-to-end test's output holds thousands of lines of control-plane logs before the
assertion that failed; a reader of the suite's last screen (or of CI's tail) needs only the
assertion. Usage: suite_failures.py JUNIT.xml [MAX_LINES_PER_TEST]"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

# GoogleTest's "file:line: Failure", a sanitizer's report, a Python traceback's end.
_GTEST_FAILURE = re.compile(r":\d+: Failure$|^Value of:|^Expected|^  Actual|^Which is")
_SANITIZER = re.compile(r"^(==\d+==ERROR|WARNING: ThreadSanitizer|SUMMARY: \w+Sanitizer)")
_PY_HEADER = re.compile(r"^(FAIL|ERROR): ")
_PY_EXCEPTION = re.compile(r"^\w+(\.\w+)*(Error|Exception|Failure|Interrupt)\b")


def reasons(output: str, limit: int) -> list[str]:
    """The lines of OUTPUT that name a failure: gtest failures with the lines after them,
    sanitizer reports' first lines, Python's FAIL/ERROR headers and exception lines."""
    lines = output.splitlines()
    picked: list[str] = []
    follow = 0
    for line in lines:
        if _GTEST_FAILURE.search(line) or _SANITIZER.search(line):
            follow = 6
        elif _PY_HEADER.match(line) or _PY_EXCEPTION.match(line):
            follow = 1
        if follow > 0:
            picked.append(line[:400])
            follow -= 1
        if len(picked) >= limit:
            picked.append("[... more in the test's own output]")
            break
    if not picked:
        picked = [line[:400] for line in lines[-min(limit, 10) :]]
    return picked


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write(__doc__ or "")
        return 2
    limit = int(argv[2]) if len(argv) > 2 else 30
    try:
        root = ET.parse(argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        sys.stderr.write("suite_failures: cannot read %s: %s\n" % (argv[1], e))
        return 1
    for case in root.iter("testcase"):
        if case.get("status") != "fail":
            continue
        print("  failed: %s" % case.get("name"))
        out = case.find("system-out")
        for line in reasons(out.text or "" if out is not None else "", limit):
            print("    | " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
