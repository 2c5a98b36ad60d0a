"""vf-bench's command line: every benchmark runs (briefly), and bad input gets a clear error."""

import os
import re
import subprocess
import unittest

VF_BENCH = os.path.join(os.environ["VF_BIN_DIR"], "vf-bench")
TINY = ["--dataset", "synthetic", "--steps", "2", "--repeats", "1"]


def assert_ratio_of_printed_times(test, ratio, t1, tv):
    """RATIO (printed to 0.001) is TV / T1 (printed in ms to 0.001, so each is off by up to
    0.0005 ms): they agree to within what that rounding can move the quotient."""
    ratio, t1, tv = float(ratio), float(t1), float(tv)
    rounding = (tv + 0.0005) / (t1 - 0.0005) - tv / t1 + 0.0005
    test.assertAlmostEqual(ratio, tv / t1, delta=rounding + 1e-9)


def run(*args):
    p = subprocess.run([VF_BENCH, *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def has_gpu():
    return os.path.exists("/dev/nvidia0")


class VfBenchTest(unittest.TestCase):
    def test_help_lists_every_benchmark_and_option(self):
        rc, out, _ = run("--help")
        self.assertEqual(rc, 0)
        for word in [
            "vnode-overhead",
            "reduction",
            "memory",
            "throughput",
            "products",
            "tuning",
            "--device",
            "--micro-batches",
            "--reduction",
        ]:
            self.assertIn(word, out)

    def test_no_benchmark_is_a_usage_error(self):
        rc, _, err = run()
        self.assertEqual(rc, 2)
        self.assertIn("usage: vf-bench", err)

    def test_unknown_benchmark_and_bad_values_are_named(self):
        cases = [
            (["bogus"], "unknown benchmark 'bogus'"),
            (["throughput", "--device", "tpu"], "--device must be cpu or cuda"),
            (["throughput", "--reduction", "approximate"], "--reduction must be exact or fast"),
            (
                ["throughput", "--global-batch", "100", "--virtual-nodes", "3", *TINY],
                "multiple of --virtual-nodes",
            ),
            (
                ["vnode-overhead", "--micro-batches", "32,x", *TINY],
                "--micro-batches: 'x' is not an integer",
            ),
            (
                ["vnode-overhead", "--micro-batches", "32.5", *TINY],
                "--micro-batches: '32.5' is not an integer",
            ),
            (
                ["vnode-overhead", "--micro-batches", "0", *TINY],
                "--micro-batches: '0' is not an integer between 1 and",
            ),
            (["throughput", "--dataset", "/nonexistent"], "/nonexistent"),
            (["products", "--micro-batches", "-4"], "--micro-batches: '-4' is not an integer"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                rc, _, err = run(*args)
                self.assertNotEqual(rc, 0)
                self.assertIn(message, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_throughput_reports_a_rate(self):
        rc, out, err = run(
            "throughput",
            "--virtual-nodes",
            "4",
            "--global-batch",
            "64",
            "--reduction",
            "fast",
            *TINY,
        )
        self.assertEqual(rc, 0, err)
        fields = dict(re.findall(r"(\w+)=(\S+)", out))
        self.assertEqual(fields["device"], "cpu")
        self.assertEqual(fields["reduction"], "fast")
        self.assertEqual(fields["micro_batch"], "16")
        rate = float(fields["samples_per_second"])
        step = float(fields["ms_per_step"])
        self.assertGreater(rate, 0)
        self.assertAlmostEqual(rate * step / 1e3, 64, delta=0.5)

    def test_tuning_times_each_configuration_and_checks_the_weights(self):
        # On the CPU every configuration issues the same work (the speed-ups are a GPU's), so
        # this checks the plumbing: six rows, the defaults at 1, the weights compared.
        rc, out, err = run("tuning", "--virtual-nodes", "4", "--global-batch", "64", *TINY)
        self.assertEqual(rc, 0, err)
        rows = re.findall(r"^(\S.*?)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
        self.assertEqual(
            [r[0] for r in rows],
            [
                "defaults",
                "one lane (nodes in turn)",
                "without record (CUDA graphs)",
                "without fused-fold or record",
                "without pinned-staging",
                "none of them",
            ],
        )
        self.assertEqual(rows[0][2], "1.000")
        self.assertIn("final weights: the same bits in every configuration", out)

    def test_vnode_overhead_prints_a_ratio_per_micro_batch(self):
        rc, out, err = run(
            "vnode-overhead", "--virtual-nodes", "4", "--micro-batches", "8,16", *TINY
        )
        self.assertEqual(rc, 0, err)
        rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
        self.assertEqual([(r[0], r[1]) for r in rows], [("32", "8"), ("64", "16")])
        # the BLAS kernel set decides the times, so the header names it
        self.assertRegex(out, r"one worker on cpu \(OpenBLAS \w+, 1 thread\), exact reduction")
        for r in rows:
            assert_ratio_of_printed_times(self, r[4], r[2], r[3])

    def test_products_times_both_sides_and_counts_differing_outputs(self):
        rc, out, err = run(
            "products",
            "--virtual-nodes",
            "3",
            "--micro-batches",
            "5,16",
            "--steps",
            "2",
            "--repeats",
            "1",
        )
        self.assertEqual(rc, 0, err)
        rows = re.findall(
            r"^\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+) of\s+(\d+)$", out, re.M
        )
        self.assertEqual([(r[0], r[1]) for r in rows], [("15", "5"), ("48", "16")])
        self.assertRegex(out, r"on cpu \(OpenBLAS \w+, 1 thread\): V=3 products")
        for r in rows:
            assert_ratio_of_printed_times(self, r[4], r[2], r[3])
            # layer 0's forward product: global batch x 512 outputs
            self.assertEqual(int(r[6]), int(r[0]) * 512)
            self.assertLessEqual(int(r[5]), int(r[6]))

    def test_memory_measures_three_children(self):
        rc, out, err = run(
            "memory", "--virtual-nodes", "2", "--micro-batch", "4", "--dataset", "synthetic"
        )
        self.assertEqual(rc, 0, err)
        rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)$", out, re.M)
        self.assertEqual(
            [(r[0], r[1], r[2]) for r in rows],
            [("2", "8", "4"), ("32", "128", "4"), ("2", "128", "64")],
        )
        self.assertTrue(all(float(r[3]) > 10 for r in rows), rows)  # MiB of a real process
        self.assertIn("ratio, global batch 16x at equal micro-batch", out)

    @unittest.skipIf(has_gpu(), "this machine has a GPU")
    def test_cuda_without_a_gpu_says_so(self):
        rc, _, err = run("throughput", "--device", "cuda", *TINY)
        self.assertEqual(rc, 1)
        self.assertIn("no CUDA device", err)


if __name__ == "__main__":
    unittest.main()
