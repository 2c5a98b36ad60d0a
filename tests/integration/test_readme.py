"""Every shell block of README.md, run or checked, so that a README command that breaks (a renamed
file, script or flag) fails here.

- `vf run` and `vf simulate` commands run as written, from a throwaway directory that holds a
  copy of `examples/` and `build/` pointing at this build (so the README's relative paths resolve
  and nothing is written into the source tree). The runs of one job file with the same `--steps`
  must print the same weights SHA-256, as the README says; a `--capacity` run must resize. The
  PyTorch command needs the Python environment (VF_PYTHON) and is skipped without it.
- `cmake --install build --prefix P` installs this build to a temporary prefix, whose `vf`
  starts. `cmake --build build` is not run: the suite runs on a build made just before.
- `./scripts/quickstart.sh` and `./scripts/test.sh` are not run (they install packages and build;
  the suite is the second): the scripts must exist and be executable, and `.ci/run` must run the
  README's test command.
- The Kubernetes block: `helm install` runs as `helm template` with the README's arguments
  (`$REGISTRY` set) and must render, with the README's image repositories; every file
  `kubectl apply -f` names must be a `VirtualFlowJob` that `vf`'s validator accepts (the CRD
  accepts and rejects the same manifests: e2e.crd); `kubectl get` must name the CRD's resource.
  A real control plane is not started here: one takes minutes on 2 cores, and e2e.chart
  (`helm install` into one) and e2e.operator (the example trained by the operator) cover that.
- A command this test does not know how to check fails it.

Besides the shell blocks: every path the blocks and the prose's code spans name exists; the README's
Python block is excerpts of examples/torch/cnn.py (verbatim, in order; `# ...` lines mark what is
left out), the program the PyTorch command runs; its YAML block is examples/torch-cnn.yaml less its
comment lines; every relative link of README.md and docs/status.md leads to a file, and to a heading
of it when it names an anchor; the README is under 8 KB and no table cell of it, docs/status.md or
docs/reliability.md is over 300 characters.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

from harness import BIN_DIR, SOURCE_DIR

README = os.path.join(SOURCE_DIR, "README.md")
CNN = os.path.join(SOURCE_DIR, "examples", "torch", "cnn.py")
CNN_JOB = os.path.join(SOURCE_DIR, "examples", "torch-cnn.yaml")
CRD = os.path.join(SOURCE_DIR, "crds", "virtualflowjob.yaml")
PYTHON = os.environ.get("VF_PYTHON", "")
BUILD_DIR = os.environ.get("VF_BUILD_DIR", os.path.dirname(BIN_DIR))
CMAKE = os.environ.get("VF_CMAKE", "cmake")
REGISTRY = "registry.test/vf"
RUN_TIMEOUT = 600
# `vf run JOB --workers 5000` validates the job, then refuses the worker count before it starts
# anything: this message, and only this one, means "the validator accepted the job".
ACCEPTED = "--workers 5000 exceeds spec.virtualNodes"
# Paths into the repository that commands and their comments name.
PATH_RE = re.compile(
    r"(?<![\w/$.-])((?:scripts|examples|charts|crds|docs|python|build/bin)/[\w./-]*\w)"
)


def read(path):
    with open(path) as f:
        return f.read()


def blocks(text, lang):
    """The fenced code blocks of TEXT in language LANG, as lists of lines."""
    return [
        m.group(1).splitlines()
        for m in re.finditer(r"^```%s\n(.*?)^```\s*$" % re.escape(lang), text, re.S | re.M)
    ]


def commands(lines):
    """The commands of a shell block: continuation lines joined, each split into words
    (comments dropped) and then at `&&`."""
    out, current = [], ""
    for line in lines:
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        words = shlex.split(current, comments=True)
        current = ""
        cmd = []
        for w in words:
            if w == "&&":
                out.append(cmd)
                cmd = []
            else:
                cmd.append(w)
        if cmd:
            out.append(cmd)
    return out


def program(words):
    """(assignments, program, arguments) of a command: leading NAME=value words apart."""
    i = 0
    while i < len(words) and re.match(r"^[A-Za-z_]\w*=", words[i]):
        i += 1
    return words[:i], words[i], words[i + 1 :]


def slug(heading):
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    in_code = False
    for line in read(path).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"^#{1,6} (.*)$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else "%s-%d" % (s, n))
    return out


class ReadmeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.text = read(README)
        cls.sh = [c for b in blocks(cls.text, "sh") for c in commands(b)]
        cls._tmp = tempfile.TemporaryDirectory(prefix="vf-readme-")
        cls.tmp = os.path.realpath(cls._tmp.name)
        cls.work = os.path.join(cls.tmp, "work")
        os.makedirs(cls.work)
        shutil.copytree(os.path.join(SOURCE_DIR, "examples"), os.path.join(cls.work, "examples"))
        os.symlink(os.path.dirname(os.path.realpath(BIN_DIR)), os.path.join(cls.work, "build"))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def env(self):
        env = dict(os.environ, REGISTRY=REGISTRY)
        if PYTHON:
            # After the README's own PATH: where $HOME/.cache/virtualflow/py is not the
            # environment (VF_CACHE_DIR set), python3 is still the suite's.
            env["PATH"] = env.get("PATH", "") + os.pathsep + os.path.dirname(PYTHON)
        return env

    def shell(self, words, timeout=RUN_TIMEOUT):
        line = " ".join(w if re.match(r"^[\w./:,=+$-]+$", w) else shlex.quote(w) for w in words)
        return subprocess.run(
            ["bash", "-c", line],
            cwd=self.work,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    # ------------------------------------------------------------------ the blocks

    def test_readme_has_the_blocks_it_promises(self):
        progs = [os.path.basename(program(c)[1]) for c in self.sh]
        for name in ("quickstart.sh", "test.sh", "vf", "cmake", "helm", "kubectl"):
            self.assertIn(name, progs)
        self.assertEqual(len(blocks(self.text, "python")), 1)
        self.assertEqual(len(blocks(self.text, "yaml")), 1)

    def test_every_shell_command(self):
        shas = {}
        for words in self.sh:
            _, prog, args = program(words)
            with self.subTest(command=" ".join(words)):
                name = os.path.basename(prog)
                if prog.startswith("./scripts/") or prog.startswith("scripts/"):
                    self.check_script(prog)
                elif name == "vf":
                    self.check_vf(words, args, shas)
                elif name == "cmake":
                    self.check_cmake(args)
                elif name == "helm":
                    self.check_helm(args)
                elif name == "kubectl":
                    self.check_kubectl(args)
                else:
                    self.fail("a README command this test does not know how to check")
        for key, values in shas.items():
            with self.subTest(same_weights=key):
                self.assertEqual(len(set(values)), 1, "runs of %s %s: %s" % (key + (values,)))

    def test_paths_the_blocks_name_exist(self):
        for block in blocks(self.text, "sh"):
            for path in PATH_RE.findall("\n".join(block)):
                with self.subTest(path=path):
                    if path.startswith("build/bin/"):
                        full = os.path.join(BIN_DIR, path[len("build/bin/") :])
                    else:
                        full = os.path.join(SOURCE_DIR, path)
                    self.assertTrue(os.path.exists(full), "%s: no such file" % path)
        # And the paths the prose names in code spans (the components' folders, the scripts).
        prose = re.sub(r"(?ms)^```.*?^```", "", self.text)
        for span in re.findall(r"`([^`\s]+)`", prose):
            if "/" in span and re.match(r"^[\w.-]+(/[\w.-]+)*/?$", span):
                with self.subTest(path=span):
                    self.assertTrue(os.path.exists(os.path.join(SOURCE_DIR, span)), span)

    def check_script(self, prog):
        path = os.path.join(SOURCE_DIR, prog)
        self.assertTrue(os.access(path, os.X_OK), "%s: missing or not executable" % prog)
        if os.path.basename(prog) == "test.sh":
            ci = read(os.path.join(SOURCE_DIR, ".ci", "run"))
            self.assertRegex(ci, r"(?m)^exec %s\s*$" % re.escape(prog), ".ci/run runs another test")

    def check_vf(self, words, args, shas):
        if "examples/torch-cnn.yaml" in args and not PYTHON:
            self.skipTest("no Python environment (VF_PYTHON) for the PyTorch example")
        proc = self.shell(words)
        self.assertEqual(proc.returncode, 0, "failed:\n%s\n%s" % (proc.stdout, proc.stderr))
        if args[0] != "run":
            return
        m = re.search(r"^weights sha256 ([0-9a-f]{64})$", proc.stdout, re.M)
        self.assertIsNotNone(m, "no weights sha256 in:\n%s" % proc.stdout)
        steps = args[args.index("--steps") + 1] if "--steps" in args else "all"
        shas.setdefault((args[1], steps), []).append(m.group(1))
        if "--capacity" in args:
            r = re.search(r"^finished .* (\d+) resizes?,", proc.stdout, re.M)
            self.assertIsNotNone(r, proc.stdout)
            self.assertGreater(int(r.group(1)), 0, "a --capacity run that never resized")

    def check_cmake(self, args):
        if args[:1] == ["--build"]:
            self.assertEqual(args, ["--build", "build"])
            return
        self.assertEqual(args[:1] + args[2:3], ["--install", "--prefix"], args)
        self.assertEqual(args[1], "build")
        prefix = os.path.join(self.tmp, "prefix")
        proc = subprocess.run(
            [CMAKE, "--install", BUILD_DIR, "--prefix", prefix],
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        for name in ("vf", "virtualflow-agent", "virtualflow-operator"):
            self.assertTrue(os.access(os.path.join(prefix, "bin", name), os.X_OK), name)
        proc = subprocess.run(
            [os.path.join(prefix, "bin", "vf"), "run", "--help"],
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)

    def check_helm(self, args):
        self.assertEqual(args[0], "install")
        sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "e2e"))
        from controlplane import bin_dir  # the pinned helm the e2e tests build

        tools = bin_dir()
        with tempfile.TemporaryDirectory(prefix="vf-helm-") as home:
            env = dict(self.env(), KUBECONFIG=os.devnull)
            for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
                env[var] = os.path.join(home, var.lower())
            argv = [os.path.expandvars(a) if "$REGISTRY" in a else a for a in args[1:]]
            proc = subprocess.run(
                [os.path.join(tools, "helm"), "template", *argv],
                cwd=SOURCE_DIR,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("kind: Deployment", proc.stdout)
        self.assertIn("kind: CustomResourceDefinition", proc.stdout)
        for arg in argv:
            m = re.match(r"^(?:image|agent\.image)\.repository=(.*)$", arg)
            if m:
                self.assertIn(m.group(1) + ":", proc.stdout, "the chart ignored " + arg)

    def check_kubectl(self, args):
        if args[0] == "apply":
            self.assertEqual(args[1], "-f", args)
            path = os.path.join(SOURCE_DIR, args[2])
            self.assertRegex(read(path), r"(?m)^kind: VirtualFlowJob$")
            proc = subprocess.run(
                [os.path.join(BIN_DIR, "vf"), "run", path, "--workers", "5000"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            self.assertIn(ACCEPTED, proc.stderr, "vf's validator refused %s" % args[2])
        elif args[0] in ("get", "describe"):
            crd = read(CRD)
            names = re.findall(r"(?m)^    (?:plural|singular): (\S+)$", crd)
            names += re.search(r"(?m)^    shortNames: \[(.*)\]$", crd).group(1).split(", ")
            self.assertIn(args[1], names)
        else:
            self.fail("kubectl %s: not checked here" % args[0])

    # ------------------------------------------------------------------ the code shown

    def test_python_block_is_excerpts_of_the_example(self):
        """The README's loop is examples/torch/cnn.py's: each run of lines between `# ...`
        markers appears verbatim and contiguous in the file (with one indentation added), the
        runs in order; and the PyTorch command's job file runs that program."""
        lines = read(CNN).splitlines()
        chunks, chunk = [], []
        for line in blocks(self.text, "python")[0]:
            if line.startswith("# ..."):
                chunks.append(chunk)
                chunk = []
            else:
                chunk.append(line)
        chunks.append(chunk)
        pos = 0
        for chunk in (c for c in chunks if c):
            with self.subTest(chunk=chunk[0]):
                found = None
                for start in range(pos, len(lines) - len(chunk) + 1):
                    first = lines[start]
                    indent = first[: len(first) - len(first.lstrip())]
                    if all(
                        (lines[start + i] == indent + c) if c else not lines[start + i].strip()
                        for i, c in enumerate(chunk)
                    ):
                        found = start
                        break
                self.assertIsNotNone(found, "not in %s after line %d:\n%s" % (CNN, pos, chunk))
                pos = found + len(chunk)
        self.assertIn("command: [python3, examples/torch/cnn.py]", read(CNN_JOB))

    def test_yaml_block_is_the_job_file(self):
        want = [line for line in read(CNN_JOB).splitlines() if not line.lstrip().startswith("#")]
        self.assertEqual(blocks(self.text, "yaml")[0], want)

    # ------------------------------------------------------------------ size

    def test_readme_is_short_and_its_tables_narrow(self):
        """The README stays under 8 KB; no table cell of it, of docs/status.md or of
        docs/reliability.md holds more than 300 characters (the rest goes into sections)."""
        self.assertLess(len(self.text.encode()), 8 * 1024, "README.md is over 8 KB")
        for name in ("README.md", "docs/status.md", "docs/reliability.md"):
            for line in read(os.path.join(SOURCE_DIR, name)).splitlines():
                if line.startswith("|"):
                    for cell in line.strip("|").split(" | "):
                        with self.subTest(doc=name, cell=cell[:60]):
                            self.assertLessEqual(len(cell.strip()), 300)

    # ------------------------------------------------------------------ links

    def test_links_lead_somewhere(self):
        for doc in (README, os.path.join(SOURCE_DIR, "docs", "status.md")):
            text = re.sub(r"(?ms)^```.*?^```", "", read(doc))
            for target in re.findall(r"\]\(([^)\s]+)\)", text):
                if re.match(r"^[a-z]+:", target):
                    continue
                with self.subTest(doc=os.path.basename(doc), link=target):
                    path, _, anchor = target.partition("#")
                    full = (
                        os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
                    )
                    self.assertTrue(os.path.exists(full), "%s: no such file" % path)
                    if anchor:
                        self.assertIn(anchor, anchors(full), "%s: no such heading" % target)


if __name__ == "__main__":
    unittest.main()
