"""Faults around a running VirtualFlowJob on a real control plane, each ending with the weights
of a local static run: the operator killed (SIGKILL) at every phase of a resize and started
again, and killed during the final report; an operator upgraded (a newer build and default
image) under a running job, whose new pods keep the job's image; an operator upgraded to another
coordinator protocol, which drains the job and resumes it from its checkpoint; a worker pod that
hangs (SIGSTOP), and one cut off the network (its packets dropped), in a 3-worker job; the
PyTorch CNN through an operator killed at a resize, upgraded, upgraded to another protocol and
killed during the final report. One control plane for the class."""

import concurrent.futures
import copy
import json
import os
import shutil
import signal
import subprocess
import tempfile
import unittest
from collections.abc import Callable
from typing import Any

from test_operator import (
    BIN_DIR,
    NS,
    SOURCE_DIR,
    OperatorTestCase,
    job_manifest,
    local_sha,
    worker,
)
from test_torch_job import DATASET, PYTHON, cnn_manifest, torch_env

FAULT_ENV = "VF_FAULT_OPERATOR_EXIT_AT"
BUILD_ENV = "VF_TEST_OPERATOR_BUILD"
PROTOCOL_ENV = "VF_TEST_OPERATOR_PROTOCOL"


def with_timeout(manifest: dict[str, Any], seconds: int) -> dict[str, Any]:
    """A copy of MANIFEST whose workers run the built-in agent with --timeout SECONDS (as a user
    program, with the facts the operator hands it in VF_* variables), so that a hung member's
    peers give up on it in seconds rather than the default minute. Same training, same weights."""
    manifest = copy.deepcopy(manifest)
    worker(manifest)["command"] = [
        "sh",
        "-c",
        (
            'exec virtualflow-agent --coordinator "$VF_COORDINATOR" --job-id "$VF_JOB_ID" '
            '--worker "$VF_WORKER" --token-file "$VF_JOB_TOKEN_FILE" '
            '--metrics-port "$VF_METRICS_PORT" --timeout %d' % seconds
        ),
    ]
    return manifest


def partition(pid: int, cut: bool) -> None:
    """Cuts (CUT) or restores the network of the pod whose process is PID: iptables rules in the
    pod's own network namespace drop every packet in and out but loopback's. Dropped, not
    refused: the pod's peers and the coordinator see silence, and so does the pod. A pod whose
    process has ended has no namespace left to restore."""
    netns = "/proc/%d/ns/net" % pid
    if not cut and not os.path.exists(netns):
        return
    if os.readlink(netns) == os.readlink("/proc/self/ns/net"):
        raise AssertionError("pod process %d runs in the host's network namespace" % pid)
    for chain, interface in (("INPUT", "-i"), ("OUTPUT", "-o")):
        subprocess.run(
            [
                "nsenter",
                "--net=" + netns,
                "iptables",
                "-w",
                "-I" if cut else "-D",
                chain,
                "!",
                interface,
                "lo",
                "-j",
                "DROP",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )


# Long enough for the longest series of faults to land mid-run with room to spare: test 3's
# last one came at step 186 (e2e.operator_faults, 2 cores); every step past it is only waited
# for. 1500 steps made this the suite's longest test (303 s, now 152 s).
STEPS = 600


def faults_manifest(name: str, delay_ms: int) -> dict[str, Any]:
    """Every test's job: the same training (so one static run serves all), paced by DELAY_MS
    per virtual node so that the faults land mid-run (the pace changes no weight)."""
    return job_manifest(name, steps=STEPS, delay_ms=delay_ms)


# The CNN's job: a small batch (8 virtual nodes of 8 samples), so that a step's time is mostly
# its pace, and paced so that its first worker alone trains for well over the time a joiner (a
# Python process importing PyTorch) takes to be ready; its workers give up on a lost rendezvous
# after 30 s (VF_TIMEOUT: also how long a pod waits for a restarted operator to know it; see
# test 3).
CNN_STEPS = 30
CNN_BATCH = 64
CNN_DELAY_MS = 150


def cnn_faults_manifest(name: str, checkpoint_dir: str, delay_ms: int) -> dict[str, Any]:
    """The CNN example (examples/torch/cnn.py) as a job of CNN_STEPS steps of CNN_BATCH samples
    reading the host's Fashion-MNIST, checkpointing into CHECKPOINT_DIR."""
    manifest = cnn_manifest(
        name, NS, DATASET, os.path.join(checkpoint_dir, name + ".ckpt"), delay_ms=delay_ms
    )
    manifest["spec"]["steps"] = CNN_STEPS
    manifest["spec"]["globalBatchSize"] = CNN_BATCH
    worker(manifest)["env"].append({"name": "VF_TIMEOUT", "value": "30"})
    return manifest


def cnn_local_sha(manifest: dict[str, Any]) -> str:
    """weights_sha256 of a static, unpaced `vf run` of MANIFEST's training on one worker (the
    checkpoint in a directory of its own: not part of the training math)."""
    with tempfile.TemporaryDirectory() as tmp:
        manifest = copy.deepcopy(manifest)
        manifest["spec"]["checkpoint"]["path"] = os.path.join(tmp, "cnn.ckpt")
        worker(manifest)["env"] = [
            e for e in worker(manifest)["env"] if e["name"] != "VF_VNODE_DELAY_MS"
        ]
        return str(local_sha(manifest, env=torch_env(), cwd=SOURCE_DIR))


class OperatorFaultsTest(OperatorTestCase):
    # The PyTorch environment's python3 for the CNN's pods, after the agent.
    pod_path = [BIN_DIR] + ([os.path.dirname(PYTHON)] if PYTHON else [])

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        # The static run the jobs must match, computed once, beside the first test.
        cls.static = concurrent.futures.ThreadPoolExecutor(1).submit(
            local_sha, faults_manifest("static", 0)
        )

    def static_sha(self) -> str:
        return self.static.result(timeout=900)

    # -------------------------------------------------------------- helpers

    def start_operator_with(
        self, identity: str, env: dict[str, str], extra: tuple[str, ...] = ()
    ) -> Any:
        """An operator whose environment adds ENV (the test-only settings), with the flags
        EXTRA."""
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return self.start_operator(identity=identity, extra=extra)
        finally:
            for k, v in saved.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v

    def start_faulted(self, phase: str) -> Any:
        return self.start_operator_with("operator-at-" + phase, {FAULT_ENV: phase})

    def wait_killed_at(self, phase: str, timeout: float = 120, name: str = "") -> None:
        """Waits for the operator armed for PHASE to kill itself there; fails at once, with its
        failed pods' logs, if job NAME (when given) fails meanwhile."""
        op = self.operator

        def killed() -> bool:
            if name:
                self.status_quiet(name)
            return not op.alive()

        self.cp.wait_for("the operator to be killed at " + phase, killed, timeout=timeout)
        self.assertEqual(op.proc.returncode, -signal.SIGKILL, op.tail(20))
        self.assertIn("killing the operator at " + phase, op.tail(20))

    def status_quiet(self, name: str) -> dict[str, Any]:
        """The job's status, failing on a Failed job, while no operator may be running."""
        status = self.status(name)
        if status.get("phase") == "Failed":
            raise self.job_failed(name, status)
        return status

    def stop_operator(self) -> None:
        if self.operator and self.operator.alive():
            self.operator.stop()

    def worker_pid(self, pod: dict[str, Any]) -> int:
        """The pid of POD's process, which the pod runner reports in its containerID."""
        cid = pod["status"]["containerStatuses"][0]["containerID"]
        return int(cid.rsplit("://", 1)[1])

    # -------------------------------------------------------------- tests

    def test_1_operator_upgraded_under_a_running_job_keeps_its_workers(self) -> None:
        """A newer operator build with the same protocol and a new default agent image, under a
        job that runs on the old default: it restores the plan of the workers of the older build
        and keeps them; the pod it creates when a node is added runs the image the job started
        on (status.workerImage), not the new default, and joins; the job says why (ImageKept)
        and ends with the weights of a static run."""
        name = "upgrade"
        new_image = "virtualflow/agent:99.0.0-test"
        manifest = faults_manifest(name, delay_ms=12)
        del worker(manifest)["image"]  # the operator's default
        self.reset_nodes(("gpu-u", 2))
        self.apply(manifest)
        self.wait_workers(name, 2)
        self.wait_step(name, 30)
        started_on = self.status(name).get("workerImage")
        self.assertTrue(started_on)
        self.assertNotEqual(started_on, new_image)
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods(name)}
        self.stop_operator()
        self.start_operator_with(
            "operator-upgraded",
            {BUILD_ENV: "virtualflow 99.0.0-test"},
            extra=("--agent-image", new_image),
        )

        def image_kept(status: dict[str, Any]) -> bool:
            return any(
                c["type"] == "ImageKept" and c["status"] == "True"
                for c in status.get("conditions", [])
            )

        kept = self.wait_status(name, "condition ImageKept", image_kept)
        self.assertEqual(kept["workerImage"], started_on)
        self.cp.add_gpu_node("gpu-u2", gpus=1)
        self.wait_workers(name, 3)
        joiners = [p for p in self.pods(name) if p["metadata"]["name"] not in before]
        self.assertEqual([p["spec"]["containers"][0]["image"] for p in joiners], [started_on])
        status = self.wait_succeeded(name)
        self.assertIn("posing as build virtualflow 99.0.0-test", self.operator.tail(400))
        after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods(name)}
        self.assertLessEqual(before.items(), after.items(), "workers were replaced")
        self.assertNotIn("WorkerRefused", [reason for reason, _ in self.events(name)])
        self.assertEqual(status["workerImage"], started_on)
        self.assertEqual(status["weightsSha256"], self.static_sha())
        self.delete_job(name)
        self.stop_operator()

    def test_1b_operator_of_another_protocol_drains_the_job_and_resumes_it(self) -> None:
        """An operator upgrade that changed the coordinator protocol, under a job that trains:
        the new operator (posing as the next protocol) cannot talk to the job's workers, so it
        drains the job rather than fail it. Their pods are deleted and exit 0, rank 0 writing a
        checkpoint of its last step as it leaves; the job says why (an Event and the condition
        Draining, naming both protocols) and starts again with pods of the new protocol, which
        resume from that checkpoint and end with the weights of a static run."""
        name = "protocol"
        store = tempfile.mkdtemp(prefix="vf-e2e-protocol-")
        mount = "/tmp/vf-e2e-protocol-mnt-%d" % os.getpid()  # where the pods see the volume
        manifest = faults_manifest(name, delay_ms=8)
        # No periodic checkpoint: the job resumes from the one rank 0 writes as it leaves.
        manifest["spec"]["checkpoint"] = {"path": mount + "/job.ckpt"}
        manifest["spec"]["template"]["spec"]["volumes"] = [
            {"name": "store", "hostPath": {"path": store}}
        ]
        worker(manifest)["volumeMounts"] = [{"name": "store", "mountPath": mount}]
        self.reset_nodes(("gpu-v", 2))
        since = self.runner_log_size()
        try:
            self.apply(manifest)
            self.wait_workers(name, 2)
            theirs = self.wait_step(name, 30)["workerProtocol"]  # this build's
            ours = theirs + 1
            old = {p["metadata"]["name"] for p in self.pods(name)}
            self.stop_operator()
            self.start_operator_with("operator-protocol", {PROTOCOL_ENV: str(ours)})
            self.wait_status(
                name,
                "restarted after the drain",
                lambda s: self.condition(s, "Draining").get("reason") == "RestartedFromCheckpoint",
            )
            status = self.wait_succeeded(name)
            self.assertIn("posing as coordinator protocol %d" % ours, self.operator.tail(400))
            self.assertEqual(status["workerProtocol"], ours)
            drained = self.condition(status, "Draining")
            self.assertEqual(drained["status"], "False")
            why = (
                "the job's workers speak coordinator protocol %d and this operator speaks "
                "protocol %d" % (theirs, ours)
            )
            self.assertIn(why, drained["message"])
            events = self.events(name)
            self.assertTrue([m for r, m in events if r == "Draining" and why in m], events)
            self.assertIn("Restarted", [r for r, _ in events])
            self.assertNotIn("Failed", [r for r, _ in events])
            self.assertFalse(old & {p["metadata"]["name"] for p in self.pods(name)})
            logs = self.pod_logs(name)
            self.assertIn("leaving; checkpoint at step", logs)
            self.assertIn("resuming from checkpoint %s/job.ckpt" % mount, logs)
            self.assertIn("testing: speaking coordinator protocol %d" % ours, logs)
            # The old workers left cleanly (exit 0), none of the new ones failed.
            self.assertEqual(self.failed_pods(name, since), [], self.failed_pod_logs(name, since))
            self.assertEqual(status["weightsSha256"], self.static_sha())
        finally:
            self.delete_job(name)
            self.stop_operator()
            shutil.rmtree(store, ignore_errors=True)

    def test_2_a_hung_worker_is_left_out_then_fenced_and_replaced_when_woken(self) -> None:
        """kill -STOP of one of 3 workers: its peers' collective times out, the coordinator hears
        nothing from it, and the next plan goes on without it; its pod keeps its GPU, so no
        replacement can take its place meanwhile. Woken (kill -CONT), it is fenced by its stale
        epoch: it exits 0 and the operator replaces its pod."""
        self.left_out_then_fenced(
            "hung",
            "gpu-h",
            "stopped",
            lambda pid: os.kill(pid, signal.SIGSTOP),
            lambda pid: os.kill(pid, signal.SIGCONT),
        )

    def test_2a_a_partitioned_worker_is_left_out_then_fenced_when_the_network_heals(self) -> None:
        """One of 3 worker pods cut off the network (every packet in and out of its network
        namespace dropped, as a failed switch port does: no reset, no error, only silence) while
        its process runs on: its peers' collective times out, the coordinator hears nothing from
        it, and the next plan goes on without it. Back on the network, it learns that its epoch
        is stale: it exits 0 and the operator replaces its pod."""
        self.left_out_then_fenced(
            "partitioned",
            "gpu-p",
            "partitioned",
            lambda pid: partition(pid, True),
            lambda pid: partition(pid, False),
        )

    def left_out_then_fenced(
        self,
        name: str,
        node: str,
        what: str,
        fault: Callable[[int], None],
        undo: Callable[[int], None],
    ) -> None:
        """Tests 2 and 2a: a 3-worker job on 3 one-GPU nodes NODE-0..2, FAULT(pid) on its last
        member's process at step 30, a plan without it, 20 more steps, UNDO(pid); the member
        exits 0 on its stale epoch, its pod is replaced without a WorkerFailed Event, and the
        job ends with the weights of a static run."""
        manifest = faults_manifest(name, delay_ms=8)
        self.reset_nodes((node, 3))
        self.apply(with_timeout(manifest, 15))
        self.wait_workers(name, 3)
        self.wait_step(name, 30)
        status = self.status(name)
        victim = status["assignment"][-1]["worker"]
        pod = next(p for p in self.pods(name) if p["metadata"]["name"] == victim)
        pid = self.worker_pid(pod)
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            self.assertIn(b"virtualflow-agent", f.read())
        fault(pid)
        try:
            left_out = self.wait_status(
                name,
                "a plan without the %s %s" % (what, victim),
                lambda s: (
                    s.get("phase") == "Running"
                    and s.get("workers") == 2
                    and victim not in [a["worker"] for a in s.get("assignment", [])]
                ),
                timeout=180,
            )
            self.assertGreater(left_out["epoch"], status["epoch"])
            step = left_out.get("step", 0)
            self.wait_step(name, step + 20)
            # Not replaced: its pod runs and holds its GPU, so no other pod fits.
            uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods(name)}
            self.assertEqual(len(uids), 3, uids)
            self.assertEqual(uids.get(victim), pod["metadata"]["uid"])
        finally:
            undo(pid)
        # Back, it finds itself out of the current plan (its epoch is stale): it acknowledges
        # that plan and exits 0, and the operator replaces its pod.
        path = "/api/v1/namespaces/%s/pods/%s" % (NS, victim)

        def exited_0() -> bool:
            back = self.cp.get(path)  # the operator deletes a pod that succeeded early
            return back is None or back["status"].get("phase") == "Succeeded"

        self.cp.wait_for("the %s %s to exit 0" % (what, victim), exited_0, timeout=120)
        self.assertEqual([m for r, m in self.events(name) if r == "WorkerFailed"], [])
        self.wait_status(
            name,
            "a replacement of %s in the plan" % victim,
            lambda s: (
                s.get("phase") == "Succeeded"
                or (
                    s.get("workers") == 3
                    and victim not in [a["worker"] for a in s.get("assignment", [])]
                )
            ),
            timeout=180,
        )
        status = self.wait_succeeded(name)
        self.assertEqual(status["weightsSha256"], self.static_sha())
        self.delete_job(name)

    def test_3_operator_killed_at_every_phase_of_a_resize(self) -> None:
        """One job, the operator killed (SIGKILL, by its test-only fault injection) and started
        again at each phase in turn: a joiner warming up, the plan just published, the joiners
        receiving the state, a leaver's acknowledgement pending. The job never fails, no worker
        fails, and it ends with the weights of a static run."""
        name = "phases"
        # The members of a plan whose rendezvous keys a killed coordinator held write them again
        # to the next one and meet; should one still lose a peer, it gives up on it after 30 s
        # rather than the default minute. Not less: the same timeout bounds how long a pod
        # created just before a kill waits for the next operator to know it, and the next one
        # first waits out the killed one's Lease (6 s). At 15 s a joiner gave up (exit 1) on an
        # idle machine.
        manifest = with_timeout(faults_manifest(name, delay_ms=12), 30)
        self.reset_nodes(("gpu-p1", 1))
        self.stop_operator()
        self.start_faulted("joiners-warming")
        self.apply(manifest)
        self.wait_workers(name, 1)
        self.wait_step(name, 20)
        # A node joins: its pod registers and warms up.
        self.cp.add_gpu_node("gpu-p2", gpus=1)
        self.wait_killed_at("joiners-warming")
        epoch = self.status_quiet(name)["epoch"]
        # The next operator takes the joiner in, and is killed as it publishes that plan.
        self.start_faulted("plan-published")
        self.wait_killed_at("plan-published")
        grown = self.status_quiet(name)
        self.assertEqual((grown["epoch"], grown["workers"]), (epoch + 1, 2), grown)
        # Another node: killed as the members of the next grown plan meet to send its joiner the
        # state.
        self.start_faulted("state-transfer")
        self.cp.add_gpu_node("gpu-p3", gpus=1)
        self.wait_killed_at("state-transfer")
        # A member asked to leave (its pod deleted): killed before it acknowledged its plan.
        self.start_faulted("acks-pending")
        self.wait_workers(name, 3)
        leaver = self.status(name)["assignment"][-1]["worker"]
        self.cp.kubectl("delete", "pod", "-n", NS, leaver, "--wait=false", check=True)
        self.wait_killed_at("acks-pending")
        self.start_operator(identity="operator-plain")
        status = self.wait_succeeded(name)
        self.assertEqual(status["weightsSha256"], self.static_sha())
        # No worker exited with a code other than 0 (the leaver exits 0): the members whose
        # rendezvous keys a killed coordinator held wrote them again to the next one and met,
        # rather than waiting out their timeout and exiting 1.
        self.assertEqual(self.failed_pods(name), [], self.failed_pod_logs(name))
        self.delete_job(name)

    def wait_pods_ended(self, name: str, timeout: float = 120) -> list[dict[str, Any]]:
        """Waits, with no operator running, for every pod of job NAME to end."""

        def ended() -> Any:
            pods = self.pods(name)
            done = pods and all(p["status"].get("phase") in ("Succeeded", "Failed") for p in pods)
            return pods if done else None

        return self.cp.wait_for("the pods of %s to succeed" % name, ended, timeout=timeout)

    def rank_0_message(self, pods: list[dict[str, Any]]) -> dict[str, Any]:
        """The final report a pod left in its termination message (the only one that did)."""
        reports = []
        for pod in pods:
            terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
            if "VirtualFlowFinalReport" in terminated.get("message", ""):
                reports.append(json.loads(terminated["message"]))
        self.assertEqual(len(reports), 1, [p["status"] for p in pods])
        return reports[0]

    def finish_after_a_final_report_kill(
        self, name: str, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """With the operator armed at final-report for job NAME: waits for it to die there (the
        coordinator holds rank 0's report, the status does not say Succeeded), then for the
        workers to end (rank 0 exits once its report is accepted), then starts an operator
        (with the test-only settings ENV), which reads the outcome from rank 0's pod. No pod is
        started again. Returns the job's final status."""
        self.wait_killed_at("final-report", timeout=600, name=name)
        self.assertNotEqual(self.status_quiet(name).get("phase"), "Succeeded")
        pods = self.wait_pods_ended(name)
        message = self.rank_0_message(pods)
        report = message["report"]
        self.assertTrue(report["finished"])
        # Rank 0 exits cleanly once its report is accepted, its coordinator gone or not (a
        # Python rank 0 was once killed by SIGSEGV on its way out here).
        rank_0 = message["worker"]
        for pod in pods:
            if pod["metadata"]["name"] == rank_0:
                terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
                self.assertEqual(
                    (terminated.get("exitCode"), terminated.get("signal")),
                    (0, None),
                    "rank 0 %s did not exit cleanly: %s\n%s"
                    % (rank_0, terminated, self.failed_pod_logs(name)),
                )
        uids = sorted(p["metadata"]["uid"] for p in pods)
        self.start_operator_with("operator-after-final-report", env or {})
        status = self.wait_succeeded(name, timeout=120)
        self.assertEqual(status["weightsSha256"], report["weightsSha256"])
        self.assertIn("the outcome is read from pod", self.operator.tail(100))
        self.assertEqual(
            sorted(p["metadata"]["uid"] for p in self.pods(name)),
            uids,
            "workers were started again",
        )
        return status

    def test_4_operator_killed_during_the_final_report(self) -> None:
        """The operator killed after rank 0's final report reached its coordinator and before
        the job's status said Succeeded (rank 0 exits once its report is accepted): the report
        rank 0 left in its pod's termination message ends the job under the next operator,
        with the weights of a static run."""
        name = "final"
        self.reset_nodes(("gpu-f", 2))
        self.stop_operator()
        self.start_faulted("final-report")
        # Unpaced: nothing happens before the end. The workers give up on a coordinator that
        # went mid-answer after 15 s rather than a minute.
        self.apply(with_timeout(faults_manifest(name, delay_ms=0), 15))
        status = self.finish_after_a_final_report_kill(name)
        self.assertEqual(status["step"], STEPS)
        self.assertEqual(status["weightsSha256"], self.static_sha())
        self.delete_job(name)

    @unittest.skipUnless(PYTHON, "no Python environment with PyTorch (scripts/setup-python.sh)")
    def test_5_cnn_survives_operator_kills_an_upgrade_and_a_protocol_drain(self) -> None:
        """The PyTorch CNN as the job, through every operator fault of the tests above in turn:
        the operator killed as it publishes the plan that takes a joiner in; an upgrade of the
        same protocol, which keeps the workers; an upgrade to another protocol, which drains the
        job (rank 0 of the PyTorch library checkpoints its last step as it leaves) and starts it
        again from that checkpoint; that operator killed during the final report. The job ends
        with the weights of a static `vf run`, read by the last operator from rank 0's pod."""
        name = "cnn-faults"
        checkpoints = tempfile.mkdtemp(prefix="vf-e2e-cnn-")
        self.addCleanup(shutil.rmtree, checkpoints, True)
        manifest = cnn_faults_manifest(name, checkpoints, CNN_DELAY_MS)
        # No periodic checkpoint: the job resumes from the one rank 0 writes as it leaves.
        manifest["spec"]["checkpoint"].pop("everySteps", None)
        static = concurrent.futures.ThreadPoolExecutor(1).submit(cnn_local_sha, manifest)
        self.reset_nodes(("gpu-c1", 1))
        self.stop_operator()
        self.start_faulted("plan-published")
        since = self.runner_log_size()
        self.apply(manifest)
        self.wait_workers(name, 1, timeout=240)
        self.wait_step(name, 3)
        # A node joins: its worker warms up and the next plan takes it in.
        self.cp.add_gpu_node("gpu-c2", gpus=1)
        self.wait_killed_at("plan-published", timeout=240, name=name)
        grown = self.status_quiet(name)
        self.assertEqual(grown["workers"], 2, grown)
        # A newer build of the same protocol keeps the workers and their plan.
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods(name)}
        self.start_operator_with("operator-upgraded", {BUILD_ENV: "virtualflow 99.0.0-test"})
        self.wait_step(name, self.status(name).get("step", 0) + 2)
        self.assertIn("posing as build virtualflow 99.0.0-test", self.operator.tail(400))
        kept = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods(name)}
        self.assertEqual(kept, before, "the upgrade replaced workers")
        self.assertNotIn("WorkerRefused", [reason for reason, _ in self.events(name)])
        self.stop_operator()
        # Another protocol: the job is drained and started again, then the final report is cut.
        ours = str(self.status(name)["workerProtocol"] + 1)
        self.start_operator_with(
            "operator-protocol", {PROTOCOL_ENV: ours, FAULT_ENV: "final-report"}
        )
        status = self.finish_after_a_final_report_kill(name, {PROTOCOL_ENV: ours})
        self.assertEqual(status["step"], CNN_STEPS)
        self.assertEqual(
            self.condition(status, "Draining").get("reason"), "RestartedFromCheckpoint", status
        )
        self.assertFalse(set(before) & {p["metadata"]["name"] for p in self.pods(name)})
        logs = self.pod_logs(name)
        self.assertIn("leaving; checkpoint at step", logs)
        self.assertIn("resuming from checkpoint", logs)
        self.assertEqual(status["weightsSha256"], static.result(timeout=600))
        # The joiner and the member met again under the next coordinator, and the drained
        # workers left cleanly: no worker exited other than 0.
        self.assertEqual(self.failed_pods(name, since), [], self.failed_pod_logs(name, since))
        self.delete_job(name)


if __name__ == "__main__":
    unittest.main()
