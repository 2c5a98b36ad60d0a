"""The shipped example trains Fashion-MNIST to at least 85% test accuracy (its full length, as
`vf run examples/fashion-mnist.yaml` runs it), with progress lines on the way."""

import unittest

from harness import EXAMPLE, VfTestCase, vf


class ExampleTest(VfTestCase):
    def test_example_reaches_85_percent_test_accuracy(self):
        run = vf("run", EXAMPLE)
        self.assertSucceeded(run)
        self.assertGreaterEqual(run.summary["test_accuracy"], 0.85)
        progress = [line for line in run.stdout.splitlines() if line.startswith("step ")]
        self.assertGreater(len(progress), 3, run.stdout)
        self.assertRegex(progress[-1], r"loss \d+\.\d+ .* samples/s\s+ETA \d+:\d\d")
        self.assertRegex(run.stdout, r"weights sha256 [0-9a-f]{64}")
        self.assertRegex(run.stdout, r"test accuracy \d+\.\d\d%")


if __name__ == "__main__":
    unittest.main()
