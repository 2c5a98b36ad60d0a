"""`vf simulate` on the published job traces (examples/traces/): every job completes, the
reported statistics agree with the per-job results, and each policy keeps its own invariants. No
assertion here depends on which policy wins: those numbers are results, reported in
docs/simulator.md."""

import json
import os
import statistics
import subprocess
import unittest

from harness import BIN_DIR, SOURCE_DIR, VF, VfTestCase

TRACES_DIR = os.path.join(SOURCE_DIR, "examples", "traces")
TRACES = ["medium20_8jph.json", "medium20_10jph.json"]
CLUSTERS = os.path.join(SOURCE_DIR, "examples", "clusters")
POLICIES = ["static", "elastic", "autoscale"]


def simulate_command():
    """`vf simulate`, or the simulator's own binary (same entry point) where `vf` lacks it."""
    probe = subprocess.run([VF, "simulate", "--help"], capture_output=True, text=True)
    if probe.returncode == 0:
        return [VF, "simulate"]
    return [os.path.join(BIN_DIR, "vf-sim"), "simulate"]


class SimulateTest(VfTestCase):
    @classmethod
    def setUpClass(cls):
        cls.simulate = simulate_command()

    def run_sim(self, *args, expect_ok=True):
        proc = subprocess.run(
            self.simulate + list(args), capture_output=True, text=True, timeout=300
        )
        if expect_ok:
            self.assertEqual(proc.returncode, 0, "vf simulate failed:\n%s" % proc.stderr)
        return proc

    def trace(self, name):
        """A trace the repository carries: missing is a failure, never a skip."""
        path = os.path.join(TRACES_DIR, name)
        self.assertTrue(os.path.exists(path), "trace %s not found" % path)
        return path

    def run_json(self, trace_path, cluster="8-v100.yaml", *extra):
        proc = self.run_sim(
            trace_path,
            "--cluster",
            os.path.join(CLUSTERS, cluster),
            "--policy",
            ",".join(POLICIES),
            "--json",
            *extra,
        )
        return json.loads(proc.stdout)

    def check_run(self, run, trace_jobs, gpus):
        jobs = run["jobs"]
        self.assertEqual(len(jobs), len(trace_jobs))
        summary = run["summary"]
        self.assertEqual(summary["unfinished_jobs"], 0)
        jcts = []
        for job, spec in zip(jobs, trace_jobs, strict=True):
            where = "%s %s" % (run["policy"], job["id"])
            self.assertEqual(job["arrival_seconds"], spec["arrival_time"], where)
            self.assertGreaterEqual(job["start_seconds"], job["arrival_seconds"], where)
            self.assertGreater(job["finish_seconds"], job["start_seconds"], where)
            self.assertAlmostEqual(
                job["jct_seconds"], job["finish_seconds"] - job["arrival_seconds"], places=6
            )
            self.assertGreaterEqual(job["max_workers"], 1, where)
            self.assertLessEqual(job["max_workers"], spec["gpu_demand"], where)
            self.assertLessEqual(job["max_workers"], gpus, where)
            if run["policy"] == "static":
                self.assertEqual(job["resizes"], 0, where)
                self.assertEqual(job["max_workers"], spec["gpu_demand"], where)
            jcts.append(job["jct_seconds"])
        self.assertAlmostEqual(summary["mean_jct_seconds"], statistics.mean(jcts), places=3)
        self.assertAlmostEqual(summary["median_jct_seconds"], statistics.median(jcts), places=3)
        self.assertEqual(summary["p99_jct_seconds"], max(jcts))  # nearest rank of 20 jobs
        self.assertAlmostEqual(
            summary["makespan_seconds"], max(j["finish_seconds"] for j in jobs), places=6
        )
        self.assertGreater(summary["gpu_utilisation"], 0.0)
        self.assertLessEqual(summary["gpu_utilisation"], 1.0 + 1e-9)
        gpu_seconds = sum(j["gpu_seconds"] for j in jobs)
        self.assertLessEqual(gpu_seconds, gpus * summary["makespan_seconds"] * (1 + 1e-9))

    def test_every_job_of_both_traces_completes_under_every_policy(self):
        for name in TRACES:
            with self.subTest(trace=name):
                path = self.trace(name)
                with open(path) as f:
                    trace_jobs = json.load(f)
                result = self.run_json(path)
                self.assertEqual([r["policy"] for r in result["runs"]], POLICIES)
                self.assertEqual(result["cluster"]["gpus"], {"V100": 8})
                for run in result["runs"]:
                    self.check_run(run, trace_jobs, gpus=8)

    def test_same_input_same_output(self):
        path = self.trace(TRACES[0])
        first = self.run_sim(
            path,
            "--cluster",
            os.path.join(CLUSTERS, "8-v100.yaml"),
            "--policy",
            "elastic,autoscale",
            "--json",
        ).stdout
        again = self.run_sim(
            path,
            "--cluster",
            os.path.join(CLUSTERS, "8-v100.yaml"),
            "--policy",
            "elastic,autoscale",
            "--json",
        ).stdout
        self.assertEqual(first, again)

    def test_table_shows_jobs_and_policies_side_by_side(self):
        path = self.trace(TRACES[1])
        out = self.run_sim(
            path, "--cluster", os.path.join(CLUSTERS, "8-v100.yaml"), "--policy", "static,elastic"
        ).stdout
        for fragment in (
            "mean JCT s",
            "median JCT s",
            "p99 JCT s",
            "makespan s",
            "GPU utilisation",
            "resizes per job",
            "job-19",
            "elastic vs static",
        ):
            self.assertIn(fragment, out)

    def test_proportional_split_is_never_slower_than_even(self):
        for cluster in ("hetero-2v100-8p100.yaml", "hetero-2v100-8k80.yaml"):
            proc = self.run_sim(
                "--predict",
                "resnet50-imagenet",
                "--cluster",
                os.path.join(CLUSTERS, cluster),
                "--workers",
                "2,4,10",
                "--virtual-nodes",
                "80",
                "--global-batch",
                "2560",
                "--split",
                "proportional,even",
                "--json",
            )
            rows = json.loads(proc.stdout)
            by = {(r["workers"], r["split"]): r for r in rows}
            for n in (2, 4, 10):
                prop, even = by[(n, "proportional")], by[(n, "even")]
                self.assertEqual(sum(prop["virtual_nodes"]), 80)
                self.assertEqual(sum(even["virtual_nodes"]), 80)
                self.assertLessEqual(prop["step_seconds"], even["step_seconds"] + 1e-12)

    def test_generated_trace_is_reproducible_and_simulates(self):
        trace_cmd = self.simulate[:-1] + [
            "trace",
            "generate",
            "--jobs",
            "12",
            "--jobs-per-hour",
            "10",
            "--seed",
            "7",
        ]
        first = subprocess.run(trace_cmd, capture_output=True, text=True, check=True).stdout
        again = subprocess.run(trace_cmd, capture_output=True, text=True, check=True).stdout
        self.assertEqual(first, again)
        path = os.path.join(self.tmp, "generated.json")
        with open(path, "w") as f:
            f.write(first)
        trace_jobs = json.loads(first)
        self.assertEqual(len(trace_jobs), 12)
        result = self.run_json(path)
        for run in result["runs"]:
            self.check_run(run, trace_jobs, gpus=8)

    def assertOneLine(self, proc, *fragments):
        self.assertNotEqual(proc.returncode, 0)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertTrue(lines[0].startswith("vf: error: "), lines[0])
        for fragment in fragments:
            self.assertIn(fragment, lines[0])

    def test_bad_input_is_one_clear_line(self):
        cluster = os.path.join(CLUSTERS, "8-v100.yaml")
        path = self.trace(TRACES[0])
        self.assertOneLine(
            self.run_sim(path, "--cluster", cluster, "--policy", "fifo", expect_ok=False),
            "fifo",
            "static",
            "elastic",
            "autoscale",
        )
        self.assertOneLine(
            self.run_sim(path, "--cluster", os.path.join(self.tmp, "none.yaml"), expect_ok=False),
            "none.yaml",
        )
        bad = os.path.join(self.tmp, "bad.json")
        with open(bad, "w") as f:
            f.write(
                '[{"arrival_time": 1, "workload": "bert", "gpu_demand": 3, '
                '"batch_size": 4, "num_epochs": 1, "glue_task": "MRPC"}]'
            )
        self.assertOneLine(
            self.run_sim(bad, "--cluster", cluster, expect_ok=False), "job 0", "divisible"
        )
        self.assertOneLine(self.run_sim(path, expect_ok=False), "--cluster")


if __name__ == "__main__":
    unittest.main()
