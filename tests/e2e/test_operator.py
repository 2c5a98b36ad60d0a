"""The operator (virtualflow-operator) against a real control plane: `kubectl apply` of a
VirtualFlowJob runs it on fake GPU nodes through the real scheduler and the pod runner; the job
grows when a node is added, shrinks on cordon and drain, survives pod deletion and an operator
restart (their credentials derived again from the operator's key), and ends with the weights of
a local static run; each job's NetworkPolicy selects its own worker pods and not another
job's, and is made again when deleted and restored when changed; deleting the job collects its
pods, Secrets and NetworkPolicy; a quota that refuses its pods is a condition and one counted
Event on it; an operator that loses its Lease stops acting; jobs competing for too few GPUs
share them within their bounds and the one that cannot start says why; a suspended job has no
pods and, resumed, ends with the weights of an uninterrupted run; a crash-looping worker fails
its job past spec.runPolicy's backoffLimit; a finished job is deleted after its
ttlSecondsAfterFinished."""

import base64
import concurrent.futures
import copy
import http.client
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

from controlplane import ApiError, Component, ControlPlaneTestCase, free_port
from test_chart import selects

SOURCE_DIR = os.environ.get(
    "VF_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
)
BIN_DIR = os.environ.get("VF_BIN_DIR", os.path.join(SOURCE_DIR, "build", "bin"))
CRD_FILE = os.path.join(SOURCE_DIR, "crds", "virtualflowjob.yaml")
EXAMPLE = os.path.join(SOURCE_DIR, "examples", "fashion-mnist.yaml")
NS = "training"


def worker(manifest: dict) -> dict:
    """The worker container of MANIFEST's pod template (the one job_manifest writes)."""
    return manifest["spec"]["template"]["spec"]["containers"][0]


def job_manifest(
    name,
    steps,
    virtual_nodes=8,
    replicas=(1, 4),
    delay_ms=None,
    batch=256,
    hidden=(128,),
    cooldown=0,
):
    """A VirtualFlowJob as a dict; DELAY_MS paces each virtual node so events land mid-run."""
    spec = {
        "virtualNodes": virtual_nodes,
        "globalBatchSize": batch,
        "replicas": {"min": replicas[0], "max": replicas[1]},
        "gpusPerWorker": 1,
        "model": {"name": "mlp", "hiddenSizes": list(hidden)},
        "dataset": {"name": "fashion-mnist"},
        "optimizer": {"name": "sgd", "learningRate": 0.05, "momentum": 0.9},
        "steps": steps,
        "reduction": "exact",
        "seed": 7,
        "elasticity": {"policy": "elastic", "cooldownSeconds": cooldown},
        "template": {
            "spec": {"containers": [{"name": "worker", "image": "virtualflow/agent:e2e"}]}
        },
    }
    if delay_ms:
        env = [{"name": "VF_VNODE_DELAY_MS", "value": str(delay_ms)}]
        spec["template"]["spec"]["containers"][0]["env"] = env
    return {
        "apiVersion": "virtualflow.io/v1alpha1",
        "kind": "VirtualFlowJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def local_sha(manifest, env=None, cwd=None):
    """weights_sha256 of a local static `vf run` of the same job file on one worker, by default
    in the environment the pod runner gives pods (their own env only): OpenBLAS picks its
    kernels from the environment (OPENBLAS_CORETYPE), and bitwise identity needs the same
    kernels. ENV and CWD replace the environment and the directory (a user's program that needs
    the PyTorch environment on PATH and its own files).

    One worker: the weights are the same on any worker count (integration.worker_counts), so a
    test's pods, which train on several, are checked against another count, and one worker is
    the cheapest run: no collective, one process to start. On 2 cores, `vf run` of 900 steps of
    the built-in MLP spent 18.7 CPU-seconds on 4 workers and 3.3 on one (docs/benchmarks.md,
    "Workers sharing few cores")."""
    manifest = copy.deepcopy(manifest)
    spec = manifest["spec"]
    spec["replicas"] = {"min": 1, "max": spec.get("replicas", {}).get("max", 1)}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "job.json")
        with open(path, "w") as f:
            json.dump(manifest, f)
        summary = os.path.join(tmp, "summary.json")
        vf = os.path.join(BIN_DIR, "vf")
        run = subprocess.run(
            [vf, "run", path, "--workers", "1", "--progress-interval", "0"]
            + ["--summary-json", summary],
            capture_output=True,
            text=True,
            timeout=900,
            env=env
            if env is not None
            else {"PATH": BIN_DIR + os.pathsep + "/usr/bin:/bin", "HOSTNAME": "local"},
            cwd=cwd,
        )
        if run.returncode != 0:
            raise AssertionError("local run failed:\n%s\n%s" % (run.stdout, run.stderr))
        with open(summary) as f:
            return json.load(f)["weights_sha256"]


def local_sha_meanwhile(manifest: dict) -> "concurrent.futures.Future[str]":
    """local_sha(MANIFEST) started now in a thread of its own, so that it runs while the job
    trains (its pods mostly sleep at their pace) rather than after it; .result() when the job is
    over."""
    return concurrent.futures.ThreadPoolExecutor(1).submit(local_sha, manifest)


class OperatorTestCase(ControlPlaneTestCase):
    """A control plane with the CRD, the pod runner and an operator; helpers for jobs in the
    namespace `ns`. The tests are in subclasses."""

    ns = NS
    pod_path = [BIN_DIR]  # where the pods' commands are found, first
    http_listen = "127.0.0.1:0"  # the operator's health and metrics port (0: any free one)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cp.create_namespace(cls.ns)
        cls.cp.kubectl("apply", "-f", CRD_FILE, check=True)
        cls.cp.wait_for(
            "virtualflowjobs to be served",
            lambda: cls.cp.kubectl("get", "vfj", "-A").returncode == 0,
        )
        # The pods' logs outlive the control plane under ctest (controlplane.py, work_dir).
        cls.runner_logs = os.path.join(cls.cp.work_dir, "pods")
        cls.cp.start_pod_runner(BIN_DIR, path=cls.pod_path, log_dir=cls.runner_logs)
        cls.coordinator_port = free_port()
        cls.operator = None
        cls.operators = 0

    @classmethod
    def tearDownClass(cls):
        if cls.operator:
            cls.operator.stop()
        super().tearDownClass()

    # ------------------------------------------------------------------ helpers

    @classmethod
    def start_operator(cls, identity="operator-1", extra=(), prefix=()):
        """The operator, with EXTRA flags; PREFIX runs before it (a command that execs it)."""
        cls.operators += 1
        # Pods have network namespaces of their own: they reach the coordinator at the pod
        # network's gateway, the host's address on it.
        gateway = getattr(cls.cp, "pod_gateway", None)
        coordinator = ["--coordinator-listen", "127.0.0.1:%d" % cls.coordinator_port]
        if gateway:
            coordinator = [
                "--coordinator-listen",
                "0.0.0.0:%d" % cls.coordinator_port,
                "--coordinator-url",
                "https://%s:%d" % (gateway, cls.coordinator_port),
            ]
        argv = [
            *prefix,
            os.path.join(BIN_DIR, "virtualflow-operator"),
            "--kubeconfig",
            cls.cp.kubeconfig,
            *coordinator,
            "--http-listen",
            cls.http_listen,
            "--agent-metrics-port",
            "0",
            "--join-batch-seconds",
            "3",
            "--leader-election-namespace",
            "default",
            # A short Lease, so that a successor takes over from a killed operator quickly; a
            # renew deadline that a loaded API server on 2 cores still meets (at 3 s it did not,
            # see check_operator).
            "--leader-election-lease-duration",
            "6",
            "--leader-election-renew-deadline",
            "5",
            "--leader-election-retry-period",
            "1",
            "--identity",
            identity,
            *extra,
        ]
        # Not one of the control plane's components: the tests kill it on purpose, and the
        # control plane's waits fail fast when a component dies.
        cls.operator = Component(
            "operator-%d" % cls.operators,
            argv,
            os.path.join(cls.cp.logs, "operator-%d.log" % cls.operators),
        )
        return cls.operator

    def run(self, result=None):
        result = result if result is not None else self.defaultTestResult()
        before = len(result.failures) + len(result.errors)
        self.runner_log_offset = self.runner_log_size()
        out = super().run(result)
        if len(result.failures) + len(result.errors) > before:
            if self.operator:
                sys.stderr.write(
                    "----- %s -----\n%s\n" % (self.operator.name, self.operator.tail(60))
                )
            sys.stderr.write(
                self.failed_pod_logs(since=self.runner_log_offset)
                or "(no pod of this test failed)\n"
            )
        return out

    def setUp(self):
        if self.operator is None or not self.operator.alive():
            self.start_operator()

    def wait_for(self, what, predicate, timeout=60):
        """The control plane's wait_for, with check_operator() before each try: for what only a
        running operator brings about."""

        def check():
            self.check_operator()
            return predicate()

        return self.cp.wait_for(what, check, timeout=timeout)

    def check_operator(self):
        """Raises if the operator has exited, except when it lost its Lease: then it is started
        again with the same flags and identity, as its Deployment would (restartPolicy Always).

        The suite's Lease is short (renewed within 5 s) so that a successor takes over from a
        killed operator in seconds; on a loaded 2-core machine the API server can answer a
        renewal later than that, and the operator then stops acting and exits 1, as it must. A
        test of leadership itself waits for that exit directly, not through this."""
        op = self.operator
        if op.alive():
            return
        if op.proc.returncode != 1 or "leadership lost" not in op.tail(20):
            op.check_alive()
        cls = type(self)
        cls.operators += 1
        name = "operator-%d" % cls.operators
        sys.stderr.write(
            "%s lost its Lease (%s); started again as %s\n" % (op.name, op.tail(1).strip(), name)
        )
        op.stop()
        cls.operator = Component(name, op.argv, os.path.join(self.cp.logs, name + ".log"))

    # ------------------------------------------------------------------ pods that failed

    def runner_log_size(self) -> int:
        runner = self.cp.pod_runner if self.cp else None
        try:
            return os.path.getsize(runner.log_path) if runner else 0
        except OSError:
            return 0

    def failed_pods(self, name: str = "", since: int = 0) -> list[tuple[str, str]]:
        """(pod, how it ended) for each pod (of job NAME, when given) whose process exited with
        a code other than 0 or was killed by a signal, as the pod runner's log says from byte
        SINCE on: deleted pods included, whose status is gone."""
        runner = self.cp.pod_runner
        if runner is None:
            return []
        try:
            with open(runner.log_path, "rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        prefix = "%s/%s-worker-" % (self.ns, name) if name else "%s/" % self.ns
        out = []
        for m in re.finditer(
            r"pod (\S+) \(pid \d+\) (exited with code (\d+)|was killed by "
            r"signal \d+)",
            text,
        ):
            if m.group(1).startswith(prefix) and m.group(3) != "0":
                out.append((m.group(1), m.group(2)))
        return out

    def failed_pod_logs(self, name: str = "", since: int = 0, lines: int = 40) -> str:
        """The end of the log of each pod failed_pods(NAME, SINCE) finds, under a line saying
        which pod and how it ended; "" when none did."""
        parts = []
        for pod, how in self.failed_pods(name, since):
            ns, pod_name = pod.split("/", 1)
            text = ""
            for f in sorted(os.listdir(self.runner_logs)):
                if f.startswith("%s_%s_" % (ns, pod_name)):
                    with open(os.path.join(self.runner_logs, f), errors="replace") as log:
                        text += log.read()
            tail = "\n".join(text.splitlines()[-lines:]) or "(its log is empty)"
            parts.append(
                "----- pod %s %s; the end of its log (%s) -----\n%s\n"
                % (pod, how, self.runner_logs, tail)
            )
        return "".join(parts)

    def job_failed(self, name: str, status: dict) -> AssertionError:
        """The AssertionError for job NAME found Failed with STATUS: its message and the end of
        the log of each of its pods that failed."""
        logs = self.failed_pod_logs(name)
        return AssertionError(
            "job %s failed: %s%s" % (name, status.get("message"), "\n" + logs if logs else "")
        )

    def apply(self, manifest):
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=True)

    def job(self, name):
        return (
            self.cp.get(
                "/apis/virtualflow.io/v1alpha1/namespaces/%s/virtualflowjobs/%s" % (self.ns, name)
            )
            or {}
        )

    def status(self, name):
        return self.job(name).get("status") or {}

    def pods(self, name):
        return self.cp.request(
            "GET",
            "/api/v1/namespaces/%s/pods?labelSelector=%s"
            % (self.ns, "virtualflow.io/job%3D" + name),
        )["items"]

    def wait_status(self, name, what, predicate, timeout=240):
        """Until the job's status satisfies PREDICATE (then returns it); a Failed job ends the
        wait at once, with its status and its pods' last lines."""

        seen: dict = {}

        def check():
            status = self.status(name)
            seen["status"] = status
            if status.get("phase") == "Failed":
                raise self.job_failed(name, status)
            return status if predicate(status) else None

        try:
            return self.wait_for("job %s: %s" % (name, what), check, timeout=timeout)
        except TimeoutError as e:
            raise TimeoutError("%s\n%s" % (e, self.job_report(name, seen.get("status")))) from None

    def job_report(self, name, status=None):
        """Where job NAME stands, for a wait that timed out: the last status seen (its phase,
        plan and counts), the job's latest events and the last lines of each of its pods' logs,
        deleted pods' included."""
        status = self.status(name) if status is None else status
        keys = (
            "phase",
            "message",
            "epoch",
            "step",
            "workers",
            "desiredWorkers",
            "workerCounts",
            "restarts",
            "lastResize",
            "assignment",
        )
        shown = {k: status[k] for k in keys if k in status}
        lines = ["last status of job %s: %s" % (name, json.dumps(shown, sort_keys=True))]
        try:
            lines += ["  event %s: %s" % e for e in self.events(name)[-12:]]
        except Exception as e:  # noqa: BLE001 - a report must not hide the timeout
            lines.append("  (events not read: %s)" % e)
        prefix = "%s_%s-" % (self.ns, name)
        for f in sorted(os.listdir(self.runner_logs)) if os.path.isdir(self.runner_logs) else []:
            if f.startswith(prefix):
                with open(os.path.join(self.runner_logs, f), errors="replace") as log:
                    tail = log.read().splitlines()[-8:]
                lines += ["  %s: %s" % (f, line) for line in tail]
        return "\n".join(lines)

    def wait_step(self, name, step, timeout=240):
        return self.wait_status(
            name,
            "step >= %d" % step,
            lambda s: s.get("step", 0) >= step and s.get("phase") != "Succeeded",
            timeout,
        )

    def wait_workers(self, name, workers, timeout=240):
        """Until job NAME trains on WORKERS workers. The default leaves room for a recovery on
        the way (a member that fails a collective waits out the agents' 60 s timeout first)."""
        return self.wait_status(
            name,
            "%d workers running" % workers,
            lambda s: s.get("workers") == workers and s.get("phase") == "Running",
            timeout,
        )

    def wait_succeeded(self, name, timeout=600):
        return self.wait_status(name, "Succeeded", lambda s: s.get("phase") == "Succeeded", timeout)

    def network_policy(self, name):
        """The NetworkPolicy the operator keeps for job NAME, or None."""
        return self.cp.get(
            "/apis/networking.k8s.io/v1/namespaces/%s/networkpolicies/%s-vf-workers"
            % (self.ns, name)
        )

    def delete_job(self, name):
        self.cp.kubectl("delete", "vfj", "-n", self.ns, name, "--wait=false")

    def reset_nodes(self, *nodes):
        """Deletes every fake node, then adds NODES as (name, gpus) pairs."""
        for node in self.cp.request("GET", "/api/v1/nodes")["items"]:
            self.cp.delete_node(node["metadata"]["name"])
        for name, gpus in nodes:
            self.cp.add_gpu_node(name, gpus=gpus)

    def condition(self, status, kind):
        return {c["type"]: c for c in status.get("conditions", [])}.get(kind, {})

    def pod_logs(self, name):
        """Every captured log of the job's worker pods, deleted ones included."""
        logs = []
        for f in sorted(os.listdir(self.runner_logs)):
            if f.startswith("%s_%s-worker-" % (self.ns, name)):
                with open(os.path.join(self.runner_logs, f), errors="replace") as log:
                    logs.append(log.read())
        return "\n".join(logs)

    def events(self, name):
        out = self.cp.kubectl(
            "get",
            "events",
            "-n",
            self.ns,
            "--field-selector",
            "involvedObject.name=" + name,
            "-o",
            "json",
            check=True,
        ).stdout
        # One entry per occurrence: a repeated Event is one object with a count.
        return [
            (e["reason"], e["message"])
            for e in json.loads(out)["items"]
            for _ in range(e.get("count") or 1)
        ]


class OperatorTest(OperatorTestCase):
    def test_1_example_job_runs_to_success(self):
        """kubectl apply of the example; printer columns; status with step, loss, assignment."""
        self.reset_nodes(("gpu-a", 2), ("gpu-b", 2))
        self.cp.kubectl("apply", "-n", NS, "-f", EXAMPLE, check=True)
        self.wait_status(
            "fashion-mnist",
            "running on 4 workers",
            lambda s: s.get("workers") == 4 and s.get("phase") == "Running",
        )
        pods = self.pods("fashion-mnist")
        self.assertEqual({p["spec"]["nodeName"] for p in pods}, {"gpu-a", "gpu-b"})
        for p in pods:
            self.assertEqual(p["metadata"]["ownerReferences"][0]["kind"], "VirtualFlowJob")
        status = self.wait_succeeded("fashion-mnist")
        self.assertEqual(status["step"], status["totalSteps"])
        self.assertEqual(status["totalSteps"], 8 * (60000 // 256))
        self.assertGreaterEqual(status["testAccuracy"], 0.85)
        self.assertRegex(status["weightsSha256"], "^[0-9a-f]{64}$")
        self.assertGreater(status["loss"], 0)
        self.assertEqual(len(status["assignment"]), 4)
        held = sorted(v for a in status["assignment"] for v in a["virtualNodes"])
        self.assertEqual(held, list(range(8)))
        self.assertEqual(
            status["observedGeneration"], self.job("fashion-mnist")["metadata"]["generation"]
        )
        conditions = {c["type"]: c["status"] for c in status["conditions"]}
        self.assertEqual(conditions["Succeeded"], "True")
        table = self.cp.kubectl("get", "vfjobs", "-n", NS, check=True).stdout.splitlines()
        self.assertEqual(
            table[0].split()[:6], ["NAME", "VIRTUAL", "NODES", "WORKERS", "STEP", "PHASE"]
        )
        row = table[1].split()
        self.assertEqual(row[:5], ["fashion-mnist", "8", "4", str(status["step"]), "Succeeded"])
        self.check_coordinator_speaks_tls_only()
        self.delete_job("fashion-mnist")

    def check_coordinator_speaks_tls_only(self):
        """The workers above trained over TLS; here the port itself: plain HTTP gets no HTTP
        answer, and HTTPS verified with the CA from the operator's Secret gets the
        coordinator's 401 for a request without a credential."""
        url = "127.0.0.1:%d/v1/jobs/%s/fashion-mnist/plan" % (self.coordinator_port, NS)
        with self.assertRaises((OSError, http.client.HTTPException)):
            urllib.request.urlopen("http://" + url, timeout=30).read()
        secret = self.cp.get("/api/v1/namespaces/default/secrets/virtualflow-coordinator-tls")
        context = ssl.create_default_context(
            cadata=base64.b64decode(secret["data"]["ca.crt"]).decode()
        )
        with self.assertRaises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen("https://" + url, timeout=30, context=context)
        self.assertEqual(refused.exception.code, 401)

    def test_2_grows_shrinks_and_survives_pod_loss_with_static_weights(self):
        name = "elastic"
        manifest = job_manifest(name, steps=900, delay_ms=8)
        self.reset_nodes(("gpu-1", 2))
        self.apply(manifest)
        self.wait_workers(name, 2)
        self.wait_step(name, 40)
        # A node joins: the job grows to 4 workers between two steps.
        self.cp.add_gpu_node("gpu-2", gpus=2)
        self.wait_workers(name, 4)
        # One growth 2 -> 4, or two waves (2 -> 3 -> 4) when one of the new node's workers is
        # slower to start than the other, as on a busy machine.
        grown = self.status(name)["lastResize"]
        self.assertEqual(grown["to"], 4, grown)
        self.assertIn(grown["from"], (2, 3), grown)
        # Draining it takes the GPUs back: its workers leave gracefully.
        self.cp.drain("gpu-2", grace_period_seconds=30, timeout=120)
        self.wait_workers(name, 2)
        # Only now, past the growth to 4 workers (which a busy CPU can starve past its wait).
        static = local_sha_meanwhile(manifest)
        # Preemption of a training pod: its worker leaves, a replacement joins.
        member = self.status(name)["assignment"][1]["worker"]
        self.cp.kubectl("delete", "pod", "-n", NS, member, "--wait=false", check=True)
        self.wait_status(
            name,
            "pod %s replaced" % member,
            lambda s: (
                s.get("workers") == 2
                and s.get("phase") == "Running"
                and member not in [a["worker"] for a in s.get("assignment", [])]
            ),
        )
        # A worker killed outright (force delete, no grace): the others redo the step.
        victim = self.status(name)["assignment"][0]["worker"]
        self.cp.kubectl(
            "delete", "pod", "-n", NS, victim, "--grace-period=0", "--force", check=True
        )
        status = self.wait_succeeded(name)
        self.assertGreaterEqual(status["restarts"].get("preemption", 0), 1, status)
        reasons = [r for r, _ in self.events(name)]
        self.assertIn("Resized", reasons)
        self.assertEqual(status["weightsSha256"], static.result(timeout=900))
        self.delete_job(name)

    def test_3_operator_restart_does_not_restart_workers(self):
        name = "restart"
        # The restart below is over within seconds of step 50 (a kill, 2 s, a new operator that
        # takes the Lease); the remaining ~550 steps (~13 s on 3 workers) are its margin.
        # replicas.min 3: the job's first step waits for its 3 workers, so that a slow start on
        # a busy machine cannot leave it training (and finishing) with fewer.
        manifest = job_manifest(name, steps=600, delay_ms=8, replicas=(3, 4))
        static = local_sha_meanwhile(job_manifest(name, steps=600, delay_ms=8))
        self.reset_nodes(("gpu-r", 3))
        self.apply(manifest)
        self.wait_workers(name, 3, timeout=300)
        self.wait_step(name, 50)
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods(name)}
        epoch = self.status(name)["epoch"]
        os.killpg(self.operator.proc.pid, signal.SIGKILL)
        self.operator.proc.wait(10)
        step_at_kill = self.status(name)["step"]
        time.sleep(2)  # the workers train on with nobody watching
        self.start_operator(identity="operator-2")
        status = self.wait_succeeded(name)
        after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods(name)}
        self.assertEqual(after, before, "workers were replaced")
        # Each worker exits 0 once the job is over (rank 0 after evaluating the test set).
        self.cp.wait_for(
            "the workers to exit 0",
            lambda: all(p["status"].get("phase") == "Succeeded" for p in self.pods(name)),
            timeout=120,
        )
        self.assertEqual(status["epoch"], epoch, "the restart switched membership")
        self.assertGreater(status["step"], step_at_kill)
        self.assertEqual(status["weightsSha256"], static.result(timeout=900))
        self.delete_job(name)

    def test_4_competing_jobs_share_gpus_and_a_third_waits(self):
        self.reset_nodes(("gpu-c1", 2), ("gpu-c2", 2))
        a = job_manifest("share-a", steps=400, delay_ms=8, replicas=(1, 4))
        b = job_manifest("share-b", steps=400, delay_ms=8, replicas=(1, 4))
        c = job_manifest("share-c", steps=100, replicas=(3, 4))
        self.apply(a)
        self.wait_workers("share-a", 4)
        self.apply(b)
        self.apply(c)
        # Fair share: two each; neither below its minimum; the third cannot get its 3.
        self.wait_workers("share-a", 2)
        self.wait_workers("share-b", 2)
        waiting = self.wait_status(
            "share-c",
            "Pending with a reason",
            lambda s: s.get("phase") == "Pending" and s.get("conditions"),
        )
        running = {c["type"]: c for c in waiting["conditions"]}["Running"]
        self.assertEqual(running["status"], "False")
        self.assertEqual(running["reason"], "WaitingForGPUs")
        self.assertIn("waiting", running["message"])
        self.assertEqual(self.pods("share-c"), [])
        # Each job's NetworkPolicy lets in its own worker pods and not the other job's (their
        # real labels); whether a CNI enforces it, this suite's pod network cannot show: it runs
        # no CNI plugin (docs/security.md).
        for own, other in (("share-a", "share-b"), ("share-b", "share-a")):
            policy = self.network_policy(own)["spec"]
            admitted = policy["ingress"][0]["from"][0]["podSelector"]
            for pod in self.pods(own):
                self.assertTrue(selects(policy["podSelector"], pod["metadata"]["labels"]))
                self.assertTrue(selects(admitted, pod["metadata"]["labels"]))
            for pod in self.pods(other):
                self.assertFalse(selects(policy["podSelector"], pod["metadata"]["labels"]))
                self.assertFalse(selects(admitted, pod["metadata"]["labels"]))
        for name in ("share-a", "share-b", "share-c"):
            self.delete_job(name)

    def test_5_deleting_a_job_collects_its_pods_and_secrets(self):
        name = "collected"
        self.reset_nodes(("gpu-g", 2))
        self.apply(job_manifest(name, steps=5000, delay_ms=8))
        self.wait_workers(name, 2)
        # No Secret of the job's holds its secret: the operator derives it from its key (in the
        # Secret virtualflow-job-key of its own namespace, here "default").
        self.assertIsNone(self.cp.get("/api/v1/namespaces/%s/secrets/%s-vf-token" % (NS, name)))
        self.assertIsNotNone(self.cp.get("/api/v1/namespaces/default/secrets/virtualflow-job-key"))
        # Each worker pod has a credential Secret of its own, owned by the pod.
        credentials = [
            "/api/v1/namespaces/%s/secrets/%s-vf-credential" % (NS, pod)
            for pod in (p["metadata"]["name"] for p in self.pods(name))
        ]
        for path in credentials:
            owners = self.cp.get(path)["metadata"]["ownerReferences"]
            self.assertEqual([o["kind"] for o in owners], ["Pod"])
        # The job's NetworkPolicy, owned by the job, written once and left alone since.
        uid = self.job(name)["metadata"]["uid"]
        policy = self.network_policy(name)
        self.assertEqual(
            [(o["kind"], o["uid"]) for o in policy["metadata"]["ownerReferences"]],
            [("VirtualFlowJob", uid)],
        )
        self.assertEqual(policy["metadata"]["generation"], 1)
        built = policy["spec"]
        # Deleted, it is made again; changed, it is written back as it was.
        self.cp.request(
            "DELETE",
            "/apis/networking.k8s.io/v1/namespaces/%s/networkpolicies/%s-vf-workers" % (NS, name),
        )
        policy = self.cp.wait_for(
            "the NetworkPolicy to be made again",
            lambda: (
                lambda p: p if p and p["metadata"]["uid"] != policy["metadata"]["uid"] else None
            )(self.network_policy(name)),
        )
        self.assertEqual(policy["spec"], built)
        self.cp.request(
            "PATCH",
            "/apis/networking.k8s.io/v1/namespaces/%s/networkpolicies/%s-vf-workers" % (NS, name),
            {"spec": {"ingress": [{}]}},
            content_type="application/merge-patch+json",
        )
        self.cp.wait_for(
            "the NetworkPolicy to be restored", lambda: self.network_policy(name)["spec"] == built
        )
        self.delete_job(name)
        # The garbage collector follows the owner references (it may take it a while to learn
        # about a new custom resource type).
        self.cp.wait_for(
            "pods, Secrets and the NetworkPolicy to be collected",
            lambda: (
                not self.pods(name)
                and all(self.cp.get(path) is None for path in credentials)
                and self.network_policy(name) is None
            ),
            timeout=120,
        )

    def test_5a_pods_a_quota_refuses_are_a_condition_and_one_counted_event(self):
        """A real ResourceQuota rejection at pod creation blocks the job: the job says so in a
        condition and in one Warning Event whose count grows with the retries (aggregated, not
        one Event per retry); once the quota is gone, the next pass clears the condition."""
        name = "quota"
        quota = "/api/v1/namespaces/%s/resourcequotas/no-pods" % NS
        self.reset_nodes(("gpu-q", 1))
        self.cp.request(
            "POST",
            "/api/v1/namespaces/%s/resourcequotas" % NS,
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "no-pods", "namespace": NS},
                "spec": {"hard": {"pods": "0"}},
            },
        )
        try:
            # Until the quota controller has counted it, the refusal reads differently ("status
            # unknown for quota"), which would start a second Event series.
            self.cp.wait_for(
                "the quota to be counted",
                lambda: (self.cp.get(quota) or {}).get("status", {}).get("used"),
            )
            self.apply(job_manifest(name, steps=5000, delay_ms=8, replicas=(1, 1)))
            status = self.wait_status(
                name,
                "ReconcileError",
                lambda s: any(
                    c["type"] == "ReconcileError" and c["status"] == "True"
                    for c in s.get("conditions", [])
                ),
            )
            blocked = {c["type"]: c for c in status["conditions"]}["ReconcileError"]
            self.assertEqual(blocked["reason"], "FailedCreatePod")
            self.assertIn("forbidden", blocked["message"])
            self.assertIn("no-pods", blocked["message"])

            def refusals():
                out = self.cp.kubectl(
                    "get",
                    "events",
                    "-n",
                    NS,
                    "--field-selector",
                    "involvedObject.name=" + name,
                    "-o",
                    "json",
                    check=True,
                ).stdout
                return [e for e in json.loads(out)["items"] if e["reason"] == "FailedCreatePod"]

            self.cp.wait_for(
                "the refusal's Event to be counted",
                lambda: any(e.get("count", 1) >= 2 for e in refusals()),
            )
            # One Event per distinct message (the quota's usage may change while older pods
            # go), never two with the same one.
            events = refusals()
            self.assertEqual(len(events), len({e["message"] for e in events}), events)
            self.assertTrue(all(e["type"] == "Warning" for e in events), events)
            self.assertEqual(self.pods(name), [])
        finally:
            self.cp.request("DELETE", quota)
        # Any change to the job queues it at once (a retry after many failures waits long).
        self.cp.kubectl("annotate", "vfj", "-n", NS, name, "test/quota=removed", check=True)
        self.wait_status(
            name,
            "ReconcileError cleared",
            lambda s: any(
                c["type"] == "ReconcileError" and c["status"] == "False"
                for c in s.get("conditions", [])
            ),
        )
        self.cp.wait_for("the worker pod", lambda: self.pods(name))
        self.delete_job(name)

    def test_5b_a_forged_final_report_is_ignored_with_an_event(self):
        """A pod that anyone who may create pods in the namespace could make: the job's label, no
        owner reference, and a final report in its termination message. The operator does not
        end the job with it: the job trains on, and a Warning Event ForgedOutcomeIgnored names
        the pod and why."""
        name = "forged"
        forger = "forged-outcome"
        self.reset_nodes(("gpu-f", 1))
        self.apply(job_manifest(name, steps=5000, delay_ms=8, replicas=(1, 1)))
        self.wait_workers(name, 1)
        report = {
            "epoch": 1,
            "step": 5000,
            "loss": 0.01,
            "samplesPerSecond": 1.0,
            "secondsPerVirtualNode": 1.0,
            "pauseSeconds": 0.0,
            "hasState": True,
            "finished": True,
            "weightsSha256": "f" * 64,
            "testAccuracy": 1.0,
            "totalSteps": 5000,
            "checkpointStep": 0,
            "checkpointError": "",
        }
        message = json.dumps({"kind": "VirtualFlowFinalReport", "worker": forger, "report": report})
        self.cp.request(
            "POST",
            "/api/v1/namespaces/%s/pods" % NS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": forger,
                    "namespace": NS,
                    "labels": {"virtualflow.io/job": name},
                },
                "spec": {
                    "nodeName": "gpu-f",
                    "restartPolicy": "Never",
                    "securityContext": {
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "forger",
                            "image": "virtualflow/agent:e2e",
                            "command": [
                                "sh",
                                "-c",
                                'printf "%s" "$FORGED" > /dev/termination-log',
                            ],
                            "env": [{"name": "FORGED", "value": message}],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        )
        try:
            pod = "/api/v1/namespaces/%s/pods/%s" % (NS, forger)
            self.cp.wait_for(
                "the forged pod to end with its message",
                lambda: (self.cp.get(pod) or {}).get("status", {}).get("phase") == "Succeeded",
            )
            self.cp.wait_for(
                "the forged outcome's Event",
                lambda: [m for r, m in self.events(name) if r == "ForgedOutcomeIgnored"],
            )
            [said] = {m for r, m in self.events(name) if r == "ForgedOutcomeIgnored"}
            self.assertIn("pod " + forger + " is ignored: the job does not control it", said)
            # Looked at again and again, the job trains on, its outcome not the forger's.
            status = self.wait_step(name, self.status(name).get("step", 0) + 20)
            self.assertNotEqual(status.get("phase"), "Succeeded")
            self.assertNotIn("weightsSha256", status)
        finally:
            self.cp.request("DELETE", "/api/v1/namespaces/%s/pods/%s" % (NS, forger))
            self.delete_job(name)

    def test_6_an_operator_that_lost_its_lease_stops_acting(self):
        lease_path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/virtualflow-operator"
        self.cp.wait_for(
            "the operator to hold the Lease",
            lambda: (self.cp.get(lease_path) or {}).get("spec", {}).get("holderIdentity"),
        )
        self.reset_nodes(("gpu-l", 2))
        # Taken over as another candidate would: a read, then a write of that version. The
        # operator renews the Lease every few seconds; a renewal between the two makes the
        # write a 409 Conflict (seen on a busy machine), and the take-over is tried again on
        # the new version.
        for attempt in range(10):
            lease = self.cp.get(lease_path)
            holder = lease["spec"]["holderIdentity"]
            lease["spec"]["holderIdentity"] = "someone-else"
            lease["spec"]["leaseDurationSeconds"] = 3600
            try:
                self.cp.request("PUT", lease_path, lease)
                break
            except ApiError as e:
                if e.status != 409 or attempt == 9:
                    raise
        self.cp.wait_for(
            "the operator %s to exit" % holder, lambda: not self.operator.alive(), timeout=60
        )
        self.assertEqual(self.operator.proc.returncode, 1)
        self.assertIn("leadership lost", self.operator.tail(20))
        # Nobody acts on a new job now.
        self.apply(job_manifest("orphan", steps=50))
        time.sleep(5)
        self.assertEqual(self.pods("orphan"), [])
        self.assertEqual(self.status("orphan"), {})
        self.delete_job("orphan")
        self.cp.request("DELETE", lease_path)

    # ------------------------------------------------------------------ suspend and run policy

    def test_8a_suspend_deletes_the_pods_and_resume_keeps_the_weights(self):
        """spec.suspend as in batch/v1: the pods go (rank 0 checkpoints as it leaves), the job
        says Suspended; resumed, it continues from the checkpoint on its volume and ends with the
        weights of an uninterrupted run."""
        name = "suspend"
        steps = 160
        store = tempfile.mkdtemp(prefix="vf-e2e-suspend-")
        mount = "/tmp/vf-e2e-suspend-mnt-%d" % os.getpid()  # where the pods see the volume
        manifest = job_manifest(name, steps=steps, delay_ms=8, replicas=(1, 2))
        # No periodic checkpoint: the file on the volume is the one written on leaving.
        manifest["spec"]["checkpoint"] = {"path": mount + "/job.ckpt"}
        manifest["spec"]["runPolicy"] = {"activeDeadlineSeconds": 3600}
        manifest["spec"]["template"]["spec"]["volumes"] = [
            {"name": "store", "hostPath": {"path": store}}
        ]
        worker(manifest)["volumeMounts"] = [{"name": "store", "mountPath": mount}]
        self.reset_nodes(("gpu-s", 2))
        try:
            self.apply(manifest)
            self.wait_workers(name, 2)
            # status.workerCounts: both pods train (none pending, joining or leaving).
            self.wait_status(
                name,
                "2 workers counted training",
                lambda s: (
                    s.get("workerCounts")
                    == {"pending": 0, "joining": 0, "training": 2, "leaving": 0, "failed": 0}
                ),
            )
            self.wait_step(name, 20)
            self.cp.kubectl(
                "patch",
                "vfj",
                "-n",
                NS,
                name,
                "--type=merge",
                "-p",
                '{"spec":{"suspend":true}}',
                check=True,
            )
            status = self.wait_status(name, "Suspended", lambda s: s.get("phase") == "Suspended")
            suspended = self.condition(status, "Suspended")
            self.assertEqual((suspended["status"], suspended["reason"]), ("True", "JobSuspended"))
            self.assertEqual(self.condition(status, "Running")["status"], "False")
            self.assertNotIn("startTime", status)  # the deadline counts again from the resume
            self.cp.wait_for("the worker pods to be gone", lambda: not self.pods(name), timeout=120)
            self.wait_status(
                name,
                "no worker counted",
                lambda s: (
                    s.get("workers") == 0
                    and not any(s.get("workerCounts", {"leaving": 1}).values())
                ),
            )
            self.assertTrue(
                os.path.exists(os.path.join(store, "job.ckpt")),
                "no checkpoint written on leaving:\n" + self.pod_logs(name),
            )
            self.assertIn("leaving; checkpoint at step", self.pod_logs(name))
            self.assertIn("Suspended", [r for r, _ in self.events(name)])

            self.cp.kubectl(
                "patch",
                "vfj",
                "-n",
                NS,
                name,
                "--type=merge",
                "-p",
                '{"spec":{"suspend":false}}',
                check=True,
            )
            self.wait_status(
                name,
                "Suspended False",
                lambda s: self.condition(s, "Suspended").get("status") == "False",
            )
            status = self.wait_succeeded(name)
            resumed = self.condition(status, "Suspended")
            self.assertEqual((resumed["status"], resumed["reason"]), ("False", "JobResumed"))
            self.assertIn("startTime", status)
            self.assertIn("Resumed", [r for r, _ in self.events(name)])
            self.assertIn("resuming from checkpoint %s/job.ckpt" % mount, self.pod_logs(name))
            self.assertEqual(status["step"], steps)
            uninterrupted = job_manifest(name, steps=steps, replicas=(1, 2))
            self.assertEqual(status["weightsSha256"], local_sha(uninterrupted))
        finally:
            self.delete_job(name)
            shutil.rmtree(store, ignore_errors=True)

    def test_8b_a_crash_looping_worker_fails_the_job_past_its_backoff_limit(self):
        name = "crashloop"
        manifest = job_manifest(name, steps=50, replicas=(1, 1))
        worker(manifest)["command"] = ["false"]  # every worker exits 1 at once
        manifest["spec"]["runPolicy"] = {"backoffLimit": 1}
        self.reset_nodes(("gpu-b", 1))
        self.apply(manifest)
        status = self.cp.wait_for(
            "job %s to fail" % name,
            lambda: self.status(name) if self.status(name).get("phase") == "Failed" else None,
            timeout=120,
        )
        failed = self.condition(status, "Failed")
        self.assertEqual((failed["status"], failed["reason"]), ("True", "BackoffLimitExceeded"))
        self.assertIn("more than spec.runPolicy.backoffLimit (1)", failed["message"])
        self.assertEqual(status["restarts"]["failure"], 2)
        self.assertEqual(status["failed"], 2)
        # batch/v1: a failed job has no completionTime; its Failed condition says when.
        self.assertNotIn("completionTime", status)
        self.assertIn("BackoffLimitExceeded", [r for r, _ in self.events(name)])
        self.delete_job(name)

    def test_8c_a_finished_job_is_deleted_after_its_ttl(self):
        name = "ttl"
        manifest = job_manifest(name, steps=3, replicas=(1, 1))
        manifest["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 2}
        self.reset_nodes(("gpu-t", 1))
        self.apply(manifest)
        self.wait_succeeded(name, timeout=120)
        self.cp.wait_for(
            "job %s to be deleted" % name,
            lambda: (
                self.cp.get(
                    "/apis/virtualflow.io/v1alpha1/namespaces/%s/virtualflowjobs/%s" % (NS, name)
                )
                is None
            ),
            timeout=60,
        )
        self.cp.wait_for("its pods to be collected", lambda: not self.pods(name), timeout=120)


if __name__ == "__main__":
    unittest.main()
