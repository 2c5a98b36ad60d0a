"""Kueue admission on the real control plane: a real Kueue controller manager (built from its
upstream source at the pinned version, started by ControlPlane.start_kueue, with
waitForPodsReady on at a short timeout) holds a GPU quota in a ClusterQueue; VirtualFlowJobs
labelled with its LocalQueue get no pods until Kueue admits their Workload, then run on at most
the workers admitted; a job over the remaining quota waits with Kueue's reason in its Admitted
condition and runs once the first job's end releases the quota; a job admitted in part (its
core and fewer units than it could use) gets fewer workers than the free GPUs would; a
higher-priority batch Job makes Kueue preempt units of a running job, which shrinks by exactly
those workers without stopping, its quota released once they left, and grows back when the Job
ends, with the weights of a static run; an eviction of the whole job drains it with a
checkpoint, requeues its Workload and resumes it from the checkpoint once readmitted; a job
that runs past the waitForPodsReady timeout is not evicted; the same shrink through reclaim by
another ClusterQueue of a cohort; under --require-kueue-queue, a job without a queue label
waits, saying so; pods go to the nodes of the admitted flavor; and without Kueue, a pod of
another workload waiting for GPUs makes an elastic job give way; a job another controller
manages (spec.managedBy) is left alone; a job shrunk for another reason gives its unused
quota back."""

import os
import shutil
import tempfile
import threading
import time
import unittest
from typing import Any

from test_operator import OperatorTestCase, job_manifest, local_sha, local_sha_meanwhile

NS = "queued"
QUEUE = "team"
CLUSTER_QUEUE = "gpus"
GPU_QUOTA = 3  # GPUs in the ClusterQueue; the nodes have 4
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
# Seconds an admitted Workload has to report PodsReady before Kueue evicts it: short, so that a
# job that did not keep Kueue's contract would be evicted within every test that runs it.
PODS_READY_TIMEOUT = 30
# A second ClusterQueue where jobs of two priorities compete: it preempts lower priorities.
SHARED_QUEUE = "shared"
SHARED_CLUSTER_QUEUE = "shared-gpus"
SHARED_GPU_QUOTA = 4  # the nodes of those tests have 6: only the quota keeps usage at 4
# Two ClusterQueues of a cohort, 2 GPUs each: a job of the first borrows the second's, and the
# second takes them back (reclaimWithinCohort) when its own workloads need them.
BORROWER_QUEUE, BORROWER_CLUSTER_QUEUE = "research", "research-gpus"
LENDER_QUEUE, LENDER_CLUSTER_QUEUE = "production", "production-gpus"
COHORT = "pool"
# A ClusterQueue whose one flavor names nodes by a label: its jobs' pods go only there.
FLAVORED_QUEUE, FLAVORED_CLUSTER_QUEUE, FLAVOR = "labelled", "labelled-gpus", "pool-a"


def queued_manifest(
    name: str,
    steps: int,
    replicas: tuple[int, int],
    delay_ms: int | None = None,
    queue: str = QUEUE,
) -> dict[str, Any]:
    manifest = job_manifest(name, steps=steps, replicas=replicas, delay_ms=delay_ms)
    manifest["metadata"]["namespace"] = NS
    manifest["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    return manifest


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return {c["type"]: c for c in status.get("conditions", [])}.get(kind)


def cluster_queue(
    name: str,
    gpus: int,
    preempt: str = "Never",
    cohort: str = "",
    reclaim: str = "Never",
    flavor: str = "gpu",
) -> dict[str, Any]:
    """A ClusterQueue of GPUS nvidia.com/gpu (and ample CPU and memory) in FLAVOR, which
    preempts admitted Workloads within it as PREEMPT says (Kueue's withinClusterQueue) and, in
    COHORT, reclaims what others borrowed from it as RECLAIM says (reclaimWithinCohort)."""
    spec: dict[str, Any] = {"cohortName": cohort} if cohort else {}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec
        | {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": preempt, "reclaimWithinCohort": reclaim},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "64"},
                                {"name": "memory", "nominalQuota": "256Gi"},
                                {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
                            ],
                        }
                    ],
                }
            ],
        },
    }


def local_queue(name: str, cluster: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterQueue": cluster},
    }


def batch_job(name: str, queue: str, priority: str, pods: int, seconds: int) -> dict[str, Any]:
    """A batch/v1 Job for Kueue's own Job integration: PODS pods of one GPU each that sleep
    SECONDS, created suspended (as Kueue's webhook, which this control plane does not call,
    would make it) for Kueue to admit and start."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                "kueue.x-k8s.io/queue-name": queue,
                "kueue.x-k8s.io/priority-class": priority,
            },
        },
        "spec": {
            "suspend": True,
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "sleep",
                            "image": "busybox",
                            "command": ["sleep", str(seconds)],
                            "resources": {
                                "requests": {"cpu": "100m", "nvidia.com/gpu": "1"},
                                "limits": {"nvidia.com/gpu": "1"},
                            },
                        }
                    ],
                }
            },
        },
    }


def pod_gpus(pod: dict[str, Any]) -> int:
    """The GPUs POD holds: its containers' limits, until it has ended (a terminating pod still
    holds them)."""
    if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
        return 0
    return sum(
        int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        for c in pod["spec"]["containers"]
    )


class Watch(threading.Thread):
    """Samples the namespace's GPU pods and job JOB's step every 0.1 s until stopped: the most
    GPUs held at once by pods that have not ended (terminating ones included: they still hold
    their GPU), and every time the step went back. Also times, for each unit Workload of the
    job, its eviction (first seen Evicted) to its quota being free (first seen without a
    reservation). Keeps the job's (seconds, workers, phase, message) at each change, to say
    what the job went through when an assertion about it fails."""

    def __init__(self, test: "KueueTest", job: str):
        super().__init__(daemon=True)
        self.test, self.job = test, job
        self.max_gpus = 0
        self.max_gpu_pods: list[str] = []  # the pods that held max_gpus, first seen
        self.steps_back: list[tuple[int, int]] = []
        self.timeline: list[tuple[float, int, str, str]] = []
        self.evicted_at: dict[str, float] = {}
        self.released_after: dict[str, float] = {}
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        last_step = 0
        started = time.monotonic()
        try:
            while not self._stop_event.is_set():
                held, holders = 0, []
                for pod in self.test.cp.request("GET", "/api/v1/namespaces/%s/pods" % NS)["items"]:
                    gpus = pod_gpus(pod)
                    if gpus:
                        held += gpus
                        holders.append(pod["metadata"]["name"])
                if held > self.max_gpus:
                    self.max_gpus, self.max_gpu_pods = held, holders
                status = self.test.status(self.job)
                state = (
                    status.get("workers", 0),
                    status.get("phase", ""),
                    status.get("message", ""),
                )
                if not self.timeline or self.timeline[-1][1:] != state:
                    self.timeline.append((round(time.monotonic() - started, 2), *state))
                step = status.get("step", 0)
                if step < last_step:
                    self.steps_back.append((last_step, step))
                last_step = max(last_step, step)
                now = time.monotonic()
                for w in self.test.workloads(self.job):
                    name = w["metadata"]["name"]
                    evicted = (condition(w.get("status", {}), "Evicted") or {}).get("status")
                    reserved = (condition(w.get("status", {}), "QuotaReserved") or {}).get("status")
                    if evicted == "True" and name not in self.evicted_at:
                        self.evicted_at[name] = now
                    if (
                        name in self.evicted_at
                        and name not in self.released_after
                        and reserved != "True"
                    ):
                        self.released_after[name] = now - self.evicted_at[name]
                time.sleep(0.1)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
        if self.error is not None:
            raise self.error


class KueueTest(OperatorTestCase):
    ns = NS

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cp.start_kueue(wait_for_pods_ready=PODS_READY_TIMEOUT)
        # No webhook defaults these objects: they are written in full.
        cls.cp.request(
            "POST",
            KUEUE + "/resourceflavors",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": "gpu"},
                "spec": {},
            },
        )
        cls.cp.request(
            "POST",
            KUEUE + "/clusterqueues",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": CLUSTER_QUEUE},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": "gpu",
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "64"},
                                        {"name": "memory", "nominalQuota": "256Gi"},
                                        {"name": "nvidia.com/gpu", "nominalQuota": str(GPU_QUOTA)},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        )
        cls.cp.request(
            "POST",
            KUEUE + "/namespaces/%s/localqueues" % NS,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": QUEUE, "namespace": NS},
                "spec": {"clusterQueue": CLUSTER_QUEUE},
            },
        )
        cls.cp.request(
            "POST",
            KUEUE + "/clusterqueues",
            cluster_queue(SHARED_CLUSTER_QUEUE, SHARED_GPU_QUOTA, preempt="LowerPriority"),
        )
        cls.cp.request(
            "POST",
            KUEUE + "/namespaces/%s/localqueues" % NS,
            local_queue(SHARED_QUEUE, SHARED_CLUSTER_QUEUE),
        )
        cls.cp.request(
            "POST",
            KUEUE + "/clusterqueues",
            cluster_queue(BORROWER_CLUSTER_QUEUE, 2, cohort=COHORT),
        )
        cls.cp.request(
            "POST",
            KUEUE + "/clusterqueues",
            cluster_queue(LENDER_CLUSTER_QUEUE, 2, cohort=COHORT, reclaim="Any"),
        )
        cls.cp.request(
            "POST",
            KUEUE + "/resourceflavors",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": FLAVOR},
                "spec": {"nodeLabels": {"example.com/pool": "a"}},
            },
        )
        cls.cp.request(
            "POST",
            KUEUE + "/clusterqueues",
            cluster_queue(FLAVORED_CLUSTER_QUEUE, 2, flavor=FLAVOR),
        )
        for queue, cluster in (
            (BORROWER_QUEUE, BORROWER_CLUSTER_QUEUE),
            (LENDER_QUEUE, LENDER_CLUSTER_QUEUE),
            (FLAVORED_QUEUE, FLAVORED_CLUSTER_QUEUE),
        ):
            cls.cp.request(
                "POST", KUEUE + "/namespaces/%s/localqueues" % NS, local_queue(queue, cluster)
            )
        for name, value in (("low", 10), ("high", 1000)):
            cls.cp.request(
                "POST",
                KUEUE + "/workloadpriorityclasses",
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                },
            )
        for queue in (
            CLUSTER_QUEUE,
            SHARED_CLUSTER_QUEUE,
            BORROWER_CLUSTER_QUEUE,
            LENDER_CLUSTER_QUEUE,
            FLAVORED_CLUSTER_QUEUE,
        ):
            cls.cp.wait_for(
                "ClusterQueue %s to be active" % queue,
                lambda q=queue: any(
                    c["type"] == "Active" and c["status"] == "True"
                    for c in (cls.cp.get(KUEUE + "/clusterqueues/" + q) or {})
                    .get("status", {})
                    .get("conditions", [])
                ),
            )

    def setUp(self):
        super().setUp()
        # A job an earlier test deleted still running is Kueue's no longer (its Workload went
        # with it) but holds its GPUs until its workers leave: the GPUs a test counts, and the
        # free ones its docstring speaks of, are its own only once those pods have ended.
        started = time.monotonic()
        self.wait_for(
            "the pods of earlier tests to end",
            lambda: (
                not any(
                    pod_gpus(p)
                    for p in self.cp.request("GET", "/api/v1/namespaces/%s/pods" % NS)["items"]
                )
            ),
            timeout=120,
        )
        waited = time.monotonic() - started
        if waited > 1:
            print("waited %.1f s for the pods of earlier tests to end" % waited)

    def workloads(self, name: str) -> list[dict[str, Any]]:
        """Every Workload of job NAME: its core and its units."""
        return self.cp.request(
            "GET",
            KUEUE
            + "/namespaces/%s/workloads?labelSelector=%s" % (NS, "virtualflow.io/job%3D" + name),
        )["items"]

    def workload(self, name: str) -> dict[str, Any] | None:
        """The core Workload of job NAME."""
        cores = [
            w
            for w in self.workloads(name)
            if w["metadata"]["labels"].get("virtualflow.io/workload-role") == "core"
        ]
        return cores[0] if cores else None

    def admitted(self, name: str) -> dict[str, Any]:
        return self.wait_status(
            name, "Admitted", lambda s: (condition(s, "Admitted") or {}).get("status") == "True"
        )

    def test_1_an_admitted_job_runs_and_one_over_the_quota_waits_for_its_release(self):
        self.reset_nodes(("gpu-k1", 2), ("gpu-k2", 2))
        first = queued_manifest("first", steps=300, replicas=(2, 2), delay_ms=8)
        second = queued_manifest("second", steps=40, replicas=(2, 2))
        self.apply(first)
        status = self.admitted("first")
        self.assertIn(
            "Kueue admitted 2 worker(s) in ClusterQueue %s" % CLUSTER_QUEUE,
            condition(status, "Admitted")["message"],
        )
        self.wait_workers("first", 2)
        workload = self.workload("first")
        self.assertEqual(workload["spec"]["queueName"], QUEUE)
        self.assertEqual(workload["metadata"]["ownerReferences"][0]["kind"], "VirtualFlowJob")
        self.assertEqual(workload["status"]["admission"]["clusterQueue"], CLUSTER_QUEUE)

        # 2 of the 3 GPUs are taken: the second job (2 workers, all or nothing) waits, with
        # Kueue's reason, and no pods, although the nodes have 2 GPUs free.
        self.apply(second)
        waiting = self.wait_status(
            "second",
            "Kueue's reason to wait",
            lambda s: (
                (condition(s, "Admitted") or {}).get("reason") not in (None, "WaitingForKueue")
            ),
        )
        self.assertEqual(condition(waiting, "Admitted")["status"], "False")
        self.assertEqual(waiting["phase"], "Pending")
        message = condition(waiting, "Admitted")["message"]
        self.assertIn("waiting for Kueue to admit Workload second-vf-", message)
        self.assertIn("in LocalQueue %s: " % QUEUE, message)
        self.assertIn("insufficient unused quota for nvidia.com/gpu", message)
        self.assertEqual(waiting["message"], message)
        self.assertEqual(self.pods("second"), [])
        self.assertEqual(self.status("first").get("phase"), "Running")

        # The first job ends: its Workload is marked finished, Kueue releases the quota and
        # admits the second, which runs.
        done = self.wait_succeeded("first")
        finished = self.wait_for(
            "the first job's Workload to be finished",
            lambda: condition(self.workload("first").get("status", {}), "Finished"),
        )
        self.assertEqual((finished["status"], finished["reason"]), ("True", "Succeeded"))
        self.wait_succeeded("second")
        workload = self.workload("second")
        self.assertEqual(workload["status"]["admission"]["clusterQueue"], CLUSTER_QUEUE)
        # Its pods came after the quota was released, not before (RFC 3339 times in UTC, as
        # the API server writes them, order as text).
        created = [p["metadata"]["creationTimestamp"] for p in self.pods("second")]
        self.assertEqual(len(created), 2)
        self.assertGreaterEqual(min(created), finished["lastTransitionTime"])
        self.assertEqual(done["weightsSha256"], local_sha(first))
        for name in ("first", "second"):
            self.delete_job(name)

    def test_2_partial_admission_caps_the_workers_below_the_free_gpus(self):
        self.reset_nodes(("gpu-k3", 4))
        holder = queued_manifest("holder", steps=5000, replicas=(2, 2), delay_ms=8)
        partial = queued_manifest("partial", steps=100, replicas=(1, 4), delay_ms=8)
        self.apply(holder)
        self.wait_workers("holder", 2)
        # 1 GPU of the quota is left and the node has 2 free: Kueue admits the job's core (its
        # replicas.min, 1 worker) and none of its 3 units, and the job runs on 1.
        self.apply(partial)
        status = self.admitted("partial")
        self.assertIn("Kueue admitted 1 worker(s)", condition(status, "Admitted")["message"])
        assignment = self.workload("partial")["status"]["admission"]["podSetAssignments"][0]
        self.assertEqual(assignment["count"], 1)
        running = self.wait_workers("partial", 1)
        self.assertEqual(running["desiredWorkers"], 1)
        self.assertEqual(len(self.pods("partial")), 1)
        units = [
            w
            for w in self.workloads("partial")
            if w["metadata"]["name"] != self.workload("partial")["metadata"]["name"]
        ]
        self.assertEqual(len(units), 3)
        self.assertTrue(
            all(
                condition(u.get("status", {}), "Admitted") is None
                or condition(u["status"], "Admitted")["status"] == "False"
                for u in units
            )
        )
        self.wait_succeeded("partial")
        self.delete_job("holder")

    def test_3_a_job_naming_a_queue_that_does_not_exist_waits_saying_so(self):
        self.apply(queued_manifest("lost", steps=10, replicas=(1, 1), queue="nowhere"))
        waiting = self.wait_status(
            "lost",
            "Kueue's reason to wait",
            lambda s: (
                (condition(s, "Admitted") or {}).get("reason") not in (None, "WaitingForKueue")
            ),
        )
        admitted = condition(waiting, "Admitted")
        self.assertEqual(admitted["status"], "False")
        self.assertEqual(admitted["reason"], "Inadmissible")
        self.assertIn(
            "in LocalQueue nowhere: LocalQueue nowhere doesn't exist", admitted["message"]
        )
        self.assertEqual(self.pods("lost"), [])
        self.delete_job("lost")

    def shared_job(self, name: str, steps: int, replicas: tuple[int, int], delay_ms: int):
        manifest = queued_manifest(name, steps, replicas, delay_ms=delay_ms, queue=SHARED_QUEUE)
        manifest["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "low"
        return manifest

    def batch_pods(self, name: str) -> list[dict[str, Any]]:
        return self.cp.request(
            "GET", "/api/v1/namespaces/%s/pods?labelSelector=job-name%%3D%s" % (NS, name)
        )["items"]

    def wait_batch_job_done(self, name: str, timeout: float = 180) -> None:
        self.wait_for(
            "batch Job %s to complete" % name,
            lambda: (
                (self.cp.get("/apis/batch/v1/namespaces/%s/jobs/%s" % (NS, name)) or {})
                .get("status", {})
                .get("succeeded")
                == 2
            ),
            timeout=timeout,
        )

    def shrink_and_grow_back(self, name: str, queue: str, batch_queue: str, quota: int) -> None:
        """A job of 4 workers (replicas 2 to 4) in QUEUE; a higher-priority batch Job of 2 GPUs
        in BATCH_QUEUE makes Kueue preempt 2 of its units: the job shrinks to 2 between two
        steps and trains on, the Job's pods start once the 2 workers left (GPUs held never over
        QUOTA, though the nodes have 6), and when the Job ends the job grows back to 4. No step
        is redone; the weights are those of a static run. The job runs well past
        waitForPodsReady's timeout without an eviction."""
        self.reset_nodes(("gpu-p1", 2), ("gpu-p2", 2), ("gpu-p3", 2))
        # Long enough to hold the batch Job's start, its 8 s and the growth back: on a quiet
        # machine its pods ran 4 s after the shrink, but in a suite run beside the training tests
        # they ran only after 43 s, and 1000 steps had ended meanwhile.
        steps = 2000
        manifest = queued_manifest(name, steps, (2, 4), delay_ms=10, queue=queue)
        manifest["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "low"
        static = local_sha_meanwhile(manifest)
        self.apply(manifest)
        started = time.monotonic()
        self.wait_workers(name, 4)
        core = self.workload(name)
        self.assertEqual(core["spec"]["priority"], 10)  # WorkloadPriorityClass low
        self.assertEqual(core["spec"]["priorityClassRef"]["name"], "low")
        units = [
            w for w in self.workloads(name) if w["metadata"]["name"] != core["metadata"]["name"]
        ]
        self.assertEqual(sorted(u["spec"]["priority"] for u in units), [9, 9])
        # A step's time at 4 workers, from the steps done in 2 s.
        first, t0 = self.status(name).get("step", 0), time.monotonic()
        time.sleep(2)
        step_seconds = (time.monotonic() - t0) / max(1, self.status(name).get("step", 0) - first)
        batch = name + "-urgent"
        watch = Watch(self, name)
        watch.start()
        try:
            self.cp.request(
                "POST",
                "/apis/batch/v1/namespaces/%s/jobs" % NS,
                batch_job(batch, batch_queue, "high", pods=2, seconds=8),
            )
            shrunk = self.wait_status(
                name,
                "2 workers after the preemption",
                lambda s: s.get("workers") == 2 and s.get("phase") == "Running",
                timeout=120,
            )
            self.assertEqual(condition(shrunk, "Admitted")["status"], "True")
            self.wait_for(
                "the batch Job's 2 pods to run",
                lambda: (
                    sum(
                        p.get("status", {}).get("phase") == "Running"
                        for p in self.batch_pods(batch)
                    )
                    == 2
                ),
                timeout=120,
            )
            # Still training, on at most the 2 GPUs left to it. Its phase may be Resizing:
            # a membership switch of its own (a worker replaced, say) is training too.
            during = self.status(name)
            self.assertIn(during.get("phase"), ("Running", "Resizing"), watch.timeline)
            self.assertIn(during.get("workers", 0), (1, 2), watch.timeline)
            self.wait_batch_job_done(batch)
            self.wait_workers(name, 4, timeout=180)
            done = self.wait_succeeded(name)
        finally:
            watch.stop()
            self.cp.request(
                "DELETE",
                "/apis/batch/v1/namespaces/%s/jobs/%s?propagationPolicy=Background" % (NS, batch),
            )
        print("\nthe job's workers and phase (s since the watch began):")
        for t, workers, phase, message in watch.timeline:
            print("  %7.2f %d %-9s %s" % (t, workers, phase, message))
        self.assertEqual(watch.steps_back, [])
        self.assertLessEqual(watch.max_gpus, quota, watch.max_gpu_pods)
        self.assertEqual(len(watch.released_after), 2, watch.evicted_at)
        print(
            "\nKueue eviction of a unit to its quota free: %s s (a step: %.3f s)"
            % (", ".join("%.2f" % t for t in sorted(watch.released_after.values())), step_seconds)
        )
        # Past waitForPodsReady's timeout without an eviction of the core.
        self.assertGreater(time.monotonic() - started, PODS_READY_TIMEOUT)
        core = self.workload(name)
        self.assertIsNone(condition(core["status"], "Evicted"))
        self.assertEqual(condition(core["status"], "PodsReady")["status"], "True")
        self.assertEqual(done["step"], steps)
        self.assertEqual(done["weightsSha256"], static.result())
        self.delete_job(name)

    def test_4_a_preemption_shrinks_the_job_which_grows_back_when_the_quota_frees(self):
        self.shrink_and_grow_back("shrinking", SHARED_QUEUE, SHARED_QUEUE, SHARED_GPU_QUOTA)

    def test_6_a_reclaim_by_another_cluster_queue_shrinks_the_job_as_well(self):
        """As test 4, through the cohort: the job's ClusterQueue lends it 2 GPUs of its
        neighbour's, and the neighbour takes them back for its own Job."""
        self.shrink_and_grow_back("borrowing", BORROWER_QUEUE, LENDER_QUEUE, 4)

    def test_5_an_eviction_of_the_whole_job_drains_requeues_and_resumes_it(self):
        """A job all of whose workers are its core (replicas.min = max) is evicted whole by a
        higher-priority Job: it drains, rank 0 checkpointing as it leaves; its Workload's
        reservation is cleared and it is requeued; once the Job ends Kueue admits it again and
        it resumes from the checkpoint, ending with the weights of an uninterrupted run."""
        self.reset_nodes(("gpu-e1", 2), ("gpu-e2", 2), ("gpu-e3", 2))
        name = "evicted"
        store = tempfile.mkdtemp(prefix="vf-e2e-evicted-")
        mount = "/tmp/vf-e2e-evicted-mnt-%d" % os.getpid()
        manifest = self.shared_job(name, steps=400, replicas=(4, 4), delay_ms=10)
        manifest["spec"]["checkpoint"] = {"path": mount + "/job.ckpt"}
        pod = manifest["spec"]["template"]["spec"]
        pod["volumes"] = [{"name": "store", "hostPath": {"path": store}}]
        pod["containers"][0]["volumeMounts"] = [{"name": "store", "mountPath": mount}]
        try:
            self.apply(manifest)
            self.wait_workers(name, 4)
            self.wait_step(name, 20)
            self.cp.request(
                "POST",
                "/apis/batch/v1/namespaces/%s/jobs" % NS,
                batch_job("urgent2", SHARED_QUEUE, "high", pods=2, seconds=10),
            )
            evicted = self.wait_status(
                name,
                "evicted by Kueue",
                lambda s: (condition(s, "Admitted") or {}).get("reason") == "Preempted",
                timeout=120,
            )
            self.assertEqual(condition(evicted, "Admitted")["status"], "False")
            self.assertEqual(evicted["phase"], "Pending")
            self.wait_for("the worker pods to be gone", lambda: not self.pods(name), timeout=120)
            requeued = self.wait_for(
                "the Workload to be requeued",
                lambda: (
                    lambda w: (
                        w
                        if (condition(w.get("status", {}), "Requeued") or {}).get("status")
                        == "True"
                        else None
                    )
                )(self.workload(name) or {}),
                timeout=60,
            )
            self.assertNotIn("admission", requeued["status"])
            self.assertIn("leaving; checkpoint at step", self.pod_logs(name))
            self.assertIn("EvictedByKueue", [r for r, _ in self.events(name)])
            self.wait_batch_job_done("urgent2")
            done = self.wait_succeeded(name)
            self.assertIn("resuming from checkpoint %s/job.ckpt" % mount, self.pod_logs(name))
            self.assertEqual(done["step"], 400)
            uninterrupted = queued_manifest(name, steps=400, replicas=(4, 4))
            self.assertEqual(done["weightsSha256"], local_sha(uninterrupted))
        finally:
            self.delete_job(name)
            self.cp.request(
                "DELETE",
                "/apis/batch/v1/namespaces/%s/jobs/urgent2?propagationPolicy=Background" % NS,
            )
            shutil.rmtree(store, ignore_errors=True)

    def test_7_with_every_job_through_kueue_a_job_without_a_queue_waits_saying_so(self):
        """An operator started with --require-kueue-queue (the chart's kueue.required) gives a
        job without a queue label no workers, though GPUs are free, and says why; labelled, the
        job is admitted by Kueue and runs."""
        self.operator.stop()
        self.start_operator(extra=["--require-kueue-queue"])
        try:
            self.reset_nodes(("gpu-u", 2))
            manifest = job_manifest("unqueued", steps=30, replicas=(1, 2))
            manifest["metadata"]["namespace"] = NS
            self.apply(manifest)
            waiting = self.wait_status(
                "unqueued",
                "waiting for a queue",
                lambda s: (condition(s, "Admitted") or {}).get("reason") == "QueueNameMissing",
            )
            admitted = condition(waiting, "Admitted")
            self.assertEqual(admitted["status"], "False")
            self.assertIn("label the job kueue.x-k8s.io/queue-name", admitted["message"])
            self.assertEqual(waiting["phase"], "Pending")
            self.assertEqual(waiting["message"], admitted["message"])
            self.assertEqual(waiting.get("desiredWorkers"), 0)
            self.assertEqual(self.pods("unqueued"), [])
            self.cp.kubectl(
                "label",
                "vfj",
                "-n",
                NS,
                "unqueued",
                "kueue.x-k8s.io/queue-name=" + QUEUE,
                check=True,
            )
            self.wait_succeeded("unqueued")
            # It ran as Kueue admitted it: its Workload is there, and finished.
            finished = self.wait_for(
                "its Workload to be finished",
                lambda: condition((self.workload("unqueued") or {}).get("status", {}), "Finished"),
            )
            self.assertEqual(finished["reason"], "Succeeded")
        finally:
            self.delete_job("unqueued")
            self.operator.stop()
            self.start_operator()

    def test_8_pods_of_a_job_admitted_to_a_flavor_run_on_its_nodes_only(self):
        """A job admitted to a ResourceFlavor with node labels gets those labels as its pods'
        nodeSelector, core and unit alike, and its pods run only on the labelled node, though
        another node has GPUs free."""
        self.reset_nodes(("gpu-other", 2))
        self.cp.add_gpu_node("gpu-pool-a", gpus=2, labels={"example.com/pool": "a"})
        manifest = queued_manifest("flavored", steps=60, replicas=(1, 2), queue=FLAVORED_QUEUE)
        self.apply(manifest)
        self.wait_workers("flavored", 2)
        pods = self.pods("flavored")
        self.assertEqual(len(pods), 2)
        for pod in pods:
            self.assertEqual(pod["spec"]["nodeSelector"]["example.com/pool"], "a")
            self.assertEqual(pod["spec"]["nodeName"], "gpu-pool-a")
        for w in self.workloads("flavored"):
            if w["metadata"]["labels"]["virtualflow.io/workload-role"] == "unit":
                template = w["spec"]["podSets"][0]["template"]["spec"]
                self.assertEqual(template["nodeSelector"]["example.com/pool"], "a")
        done = self.wait_succeeded("flavored")
        self.assertEqual(done["weightsSha256"], local_sha(manifest))
        self.delete_job("flavored")

    def test_9_without_kueue_pods_waiting_for_gpus_make_an_elastic_job_give_way(self):
        """A job without a queue label on all 4 GPUs of its node; a plain Pod of another
        workload asks for 2 and waits for the scheduler: the operator counts it as demand, the
        job shrinks to 2, the Pod runs, and when it has ended the job grows back. The weights
        are those of a static run."""
        self.reset_nodes(("gpu-d", 4))
        manifest = job_manifest("beside", steps=700, replicas=(1, 4), delay_ms=10)
        manifest["metadata"]["namespace"] = NS
        static = local_sha_meanwhile(manifest)
        self.apply(manifest)
        self.wait_workers("beside", 4)
        pod = batch_job("other", SHARED_QUEUE, "high", pods=1, seconds=8)["spec"]["template"]
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "other", "namespace": NS},
        } | pod
        self.cp.request("POST", "/api/v1/namespaces/%s/pods" % NS, pod)
        try:
            self.wait_status(
                "beside",
                "2 workers, giving way",
                lambda s: s.get("workers") == 2 and s.get("phase") == "Running",
                timeout=120,
            )
            self.wait_for(
                "the other pod to succeed",
                lambda: (
                    (self.cp.get("/api/v1/namespaces/%s/pods/other" % NS) or {})
                    .get("status", {})
                    .get("phase")
                    == "Succeeded"
                ),
                timeout=120,
            )
            self.wait_workers("beside", 4)
            done = self.wait_succeeded("beside")
        finally:
            self.cp.request("DELETE", "/api/v1/namespaces/%s/pods/other" % NS)
        self.assertEqual(done["weightsSha256"], static.result())
        self.delete_job("beside")

    def test_10_a_job_another_controller_manages_is_left_alone(self):
        """spec.managedBy other than the operator's (MultiKueue's, which runs the job on another
        cluster): no pods, no status and no Workload here, though it names a queue and GPUs are
        free, while a job applied after it runs; and managedBy cannot change."""
        self.reset_nodes(("gpu-m", 2))
        elsewhere = queued_manifest("elsewhere", steps=20, replicas=(1, 1))
        elsewhere["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
        self.apply(elsewhere)
        here = job_manifest("here", steps=20, replicas=(1, 1))
        here["metadata"]["namespace"] = NS
        self.apply(here)
        self.wait_succeeded("here")
        self.assertEqual(self.status("elsewhere"), {})
        self.assertEqual(self.pods("elsewhere"), [])
        self.assertEqual(self.workloads("elsewhere"), [])
        changed = self.cp.kubectl(
            "patch",
            "vfj",
            "-n",
            NS,
            "elsewhere",
            "--type=merge",
            "-p",
            '{"spec":{"managedBy":"virtualflow.io/operator"}}',
        )
        self.assertNotEqual(changed.returncode, 0)
        self.assertIn("spec.managedBy cannot change", changed.stderr)
        for name in ("elsewhere", "here"):
            self.delete_job(name)

    def reserved_gpus(self, cluster_queue: str) -> int:
        """The nvidia.com/gpu Kueue has reserved in CLUSTER_QUEUE (its status)."""
        status = (self.cp.get(KUEUE + "/clusterqueues/" + cluster_queue) or {}).get("status", {})
        return sum(
            int(r.get("total", "0"))
            for f in status.get("flavorsReservation", [])
            for r in f.get("resources", [])
            if r["name"] == "nvidia.com/gpu"
        )

    def wait_reserved_gpus(self, gpus: int) -> None:
        """Until the shared ClusterQueue's status says GPUS reserved. Kueue writes that status
        after it admits or releases a workload, not with it: the workers of an admitted unit
        can be running while it still holds the figure from before (1 where 3 were admitted,
        seen once on a busy machine)."""
        self.wait_for(
            f"the reservation to be {gpus} GPU",
            lambda: self.reserved_gpus(SHARED_CLUSTER_QUEUE) == gpus,
            timeout=60,
        )

    def test_11_a_job_shrunk_for_another_reason_gives_its_quota_back(self):
        """A job of 3 (replicas 1 to 3) scaled down to 1 (the scale subresource, not Kueue):
        once its 2 extra workers left, its unused units go and Kueue's reservation for it falls
        to 1 GPU; scaled up again, the units come back, are admitted and the job grows. The
        weights are those of a static run."""
        self.reset_nodes(("gpu-r", 4))
        name = "scaled"
        manifest = queued_manifest(
            name, steps=700, replicas=(1, 3), delay_ms=10, queue=SHARED_QUEUE
        )
        static = local_sha_meanwhile(manifest)
        self.apply(manifest)
        self.wait_workers(name, 3)
        self.wait_reserved_gpus(3)

        def scale(replicas: int) -> None:
            self.cp.kubectl("scale", "vfj", "-n", NS, name, "--replicas", str(replicas), check=True)

        scale(1)
        self.wait_status(
            name, "1 worker", lambda s: s.get("workers") == 1 and s.get("phase") == "Running"
        )
        self.wait_reserved_gpus(1)
        self.assertEqual(len(self.workloads(name)), 1)  # the core alone
        scale(3)
        self.wait_workers(name, 3)
        self.wait_reserved_gpus(3)
        done = self.wait_succeeded(name)
        self.assertEqual(done["weightsSha256"], static.result())
        self.delete_job(name)


if __name__ == "__main__":
    unittest.main()
