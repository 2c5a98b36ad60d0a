"""`cmake --install` of the build tree to a prefix gives programs that work from there: `vf`,
`virtualflow-agent` and `virtualflow-operator` start from another directory, link nothing in
the build or source tree, and `vf simulate` (whose throughput profiles are compiled in) and a
short `vf run` (which starts the agent installed beside it) work; so does `vf simulate` from a
copy of the `vf` binary alone, as a user who downloads one binary has it."""

import os
import shutil
import subprocess
import tempfile
import unittest

from harness import DATASET_DIR, SOURCE_DIR, job_yaml, write

BUILD_DIR = os.environ.get("VF_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
CMAKE = os.environ.get("VF_CMAKE", "cmake")
PROGRAMS = ["vf", "virtualflow-agent", "virtualflow-operator"]
TRACE = os.path.join(SOURCE_DIR, "examples", "traces", "medium20_8jph.json")
CLUSTER = os.path.join(SOURCE_DIR, "examples", "clusters", "8-v100.yaml")
PROFILES = os.path.join(SOURCE_DIR, "operator", "sim", "data", "throughput.yaml")


def run(cmd, cwd, timeout=120):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


class InstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="vf-install-")
        cls.tmp = os.path.realpath(cls._tmp.name)
        cls.prefix = os.path.join(cls.tmp, "prefix")
        proc = run([CMAKE, "--install", BUILD_DIR, "--prefix", cls.prefix], cwd=cls.tmp)
        if proc.returncode != 0:
            cls._tmp.cleanup()
            raise AssertionError("cmake --install failed:\n%s%s" % (proc.stdout, proc.stderr))
        # The example files the commands read, copied out, and an empty directory to run in:
        # nothing the programs are given or run from is in the source or build tree.
        cls.work = os.path.join(cls.tmp, "work")
        os.makedirs(cls.work)
        cls.trace = shutil.copy(TRACE, cls.work)
        cls.cluster = shutil.copy(CLUSTER, cls.work)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def bin(self, name):
        return os.path.join(self.prefix, "bin", name)

    def simulate(self, vf, *extra):
        proc = run([vf, "simulate", self.trace, "--cluster", self.cluster, *extra], cwd=self.work)
        self.assertEqual(proc.returncode, 0, "%s simulate failed:\n%s" % (vf, proc.stderr))
        self.assertIn("mean JCT", proc.stdout)
        return proc.stdout

    def test_programs_are_installed_and_start_from_another_directory(self):
        for name in PROGRAMS:
            with self.subTest(program=name):
                path = self.bin(name)
                self.assertTrue(os.access(path, os.X_OK), "%s not installed" % path)
                proc = run([path, "--help"], cwd=self.work)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertIn("usage: %s" % name, proc.stdout)

    def test_installed_files_name_no_build_or_source_directory(self):
        trees = [os.path.realpath(BUILD_DIR), os.path.realpath(SOURCE_DIR)]
        installed = [
            os.path.join(root, f) for root, _, files in os.walk(self.prefix) for f in files
        ]
        self.assertTrue(installed)
        for path in installed:
            with self.subTest(file=os.path.relpath(path, self.prefix)):
                ldd = run(["ldd", path], cwd=self.work)
                self.assertEqual(ldd.returncode, 0, ldd.stderr)
                self.assertNotIn("not found", ldd.stdout)
                dynamic = run(["readelf", "-d", path], cwd=self.work).stdout
                for tree in trees:
                    self.assertNotIn(tree + "/", ldd.stdout)
                    self.assertNotIn(tree, dynamic)

    def test_installed_vf_simulates_with_its_built_in_profiles(self):
        installed = self.simulate(self.bin("vf"))
        # The same numbers as the build tree's vf given the data file itself.
        from_file = self.simulate(os.path.join(BUILD_DIR, "bin", "vf"), "--profiles", PROFILES)
        self.assertEqual(installed, from_file)

    def test_a_copy_of_vf_alone_simulates(self):
        alone = os.path.join(self.tmp, "alone")
        os.makedirs(alone, exist_ok=True)
        vf = shutil.copy(self.bin("vf"), alone)
        self.assertEqual(os.listdir(alone), ["vf"])
        self.simulate(vf, "--summary-only")

    def test_profiles_flag_still_overrides_the_built_in_data(self):
        vf = self.bin("vf")
        other = os.path.join(
            SOURCE_DIR, "operator", "sim", "data", "throughput-trace-author-v100.yaml"
        )
        self.simulate(vf, "--summary-only", "--profiles", shutil.copy(other, self.work))
        missing = os.path.join(self.work, "no-such-profiles.yaml")
        proc = run(
            [vf, "simulate", self.trace, "--cluster", self.cluster, "--profiles", missing],
            cwd=self.work,
        )
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("no-such-profiles.yaml: cannot open", proc.stderr)

    def test_installed_vf_runs_a_short_job_with_the_agent_beside_it(self):
        job = write(
            os.path.join(self.work, "job.yaml"),
            job_yaml(
                steps="3", virtualNodes="2", globalBatchSize="64", replicas="{min: 1, max: 1}"
            ),
        )
        self.assertTrue(os.path.isdir(DATASET_DIR), "Fashion-MNIST not at %s" % DATASET_DIR)
        proc = run([self.bin("vf"), "run", job], cwd=self.work, timeout=300)
        self.assertEqual(proc.returncode, 0, "vf run failed:\n%s\n%s" % (proc.stdout, proc.stderr))
        self.assertIn("weights sha256", proc.stdout)


if __name__ == "__main__":
    unittest.main()
