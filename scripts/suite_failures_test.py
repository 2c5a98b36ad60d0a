"""Tests of suite_failures.py on a JUnit report as ctest writes it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest
from xml.sax.saxutils import escape

import suite_failures

GTEST_OUTPUT = """[ RUN      ] TlsServerTest.Refused
server_test.cc:1065: Failure
Value of:
  no_ca.message().find("TLS handshake failed") != std::string::npos
  Actual: false
[  FAILED  ] TlsServerTest.Refused (3012 ms)
"""
PYTHON_OUTPUT = (
    "test_x (test_security.T.test_x) ... FAIL\n"
    + "".join("I1128 control plane log line %d\n" % i for i in range(5000))
    + "======================================================================\n"
    "FAIL: test_x (test_security.T.test_x)\n"
    "----------------------------------------------------------------------\n"
    "Traceback (most recent call last):\n"
    '  File "test_security.py", line 115, in test_x\n'
    "    self.assertLess(entry['slowest'], PROBE_TIMEOUT, server)\n"
    "AssertionError: 1.43 not less than 1.0 : operator probes\n"
)


def junit(cases: list[tuple[str, str, str]]) -> str:
    body = "".join(
        '<testcase name="%s" status="%s" time="1"><system-out>%s</system-out></testcase>'
        % (name, status, escape(out))
        for name, status, out in cases
    )
    return '<?xml version="1.0"?><testsuite tests="%d">%s</testsuite>' % (len(cases), body)


class SuiteFailuresTest(unittest.TestCase):
    def run_on(self, cases: list[tuple[str, str, str]]) -> str:
        with tempfile.NamedTemporaryFile("w", suffix=".xml", delete=False) as f:
            f.write(junit(cases))
        self.addCleanup(os.remove, f.name)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite_failures.py")
        done = subprocess.run(
            [sys.executable, script, f.name], capture_output=True, text=True, check=True
        )
        return done.stdout

    def test_failed_tests_are_named_with_their_assertions_and_passed_ones_are_not(self) -> None:
        out = self.run_on(
            [
                ("tls_test.TlsServerTest.Refused", "fail", GTEST_OUTPUT),
                ("e2e.security", "fail", PYTHON_OUTPUT),
                ("e2e.chart", "run", PYTHON_OUTPUT),
            ]
        )
        self.assertIn("failed: tls_test.TlsServerTest.Refused", out)
        self.assertIn("server_test.cc:1065: Failure", out)
        self.assertIn("Actual: false", out)
        self.assertIn("failed: e2e.security", out)
        self.assertIn("FAIL: test_x (test_security.T.test_x)", out)
        self.assertIn("AssertionError: 1.43 not less than 1.0 : operator probes", out)
        self.assertNotIn("e2e.chart", out)
        self.assertNotIn("control plane log line", out)
        self.assertLess(len(out.splitlines()), 20)

    def test_output_without_a_recognised_failure_shows_its_last_lines(self) -> None:
        lines = ["line %d" % i for i in range(40)]
        out = suite_failures.reasons("\n".join(lines), 30)
        self.assertEqual(out, lines[-10:])

    def test_the_lines_per_test_are_bounded(self) -> None:
        many = "\n".join("x.cc:%d: Failure" % i for i in range(100))
        out = suite_failures.reasons(many, 30)
        self.assertEqual(len(out), 31)
        self.assertIn("more in the test's own output", out[-1])

    def test_an_unreadable_report_is_an_error_saying_so(self) -> None:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite_failures.py")
        done = subprocess.run(
            [sys.executable, script, "/nonexistent/junit.xml"], capture_output=True, text=True
        )
        self.assertEqual(done.returncode, 1)
        self.assertIn("cannot read /nonexistent/junit.xml", done.stderr)


if __name__ == "__main__":
    unittest.main()
