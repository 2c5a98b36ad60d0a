"""Kueue admission on the real control plane: a real Kueue controller manager (built from its
upstream source at the pinned version, started by ControlPlane.start_kueue) holds a GPU quota
in a ClusterQueue; VirtualFlowJobs labelled with its LocalQueue get no pods until Kueue admits
their Workload, then run on at most the workers admitted; a job over the remaining quota waits
with Kueue's reason in its Admitted condition and runs once the first job's end releases the
quota; partial admission gives a job fewer workers than the free GPUs would."""

import unittest
from typing import Any

from test_operator import OperatorTestCase, job_manifest, local_sha

NS = "queued"
QUEUE = "team"
CLUSTER_QUEUE = "gpus"
GPU_QUOTA = 3  # GPUs in the ClusterQueue; the nodes have 4
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"


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


class KueueTest(OperatorTestCase):
    ns = NS

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cp.start_kueue()
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
        cls.cp.wait_for(
            "the ClusterQueue to be active",
            lambda: any(
                c["type"] == "Active" and c["status"] == "True"
                for c in (cls.cp.get(KUEUE + "/clusterqueues/" + CLUSTER_QUEUE) or {})
                .get("status", {})
                .get("conditions", [])
            ),
        )

    def workload(self, name: str) -> dict[str, Any] | None:
        items = self.cp.request(
            "GET",
            KUEUE
            + "/namespaces/%s/workloads?labelSelector=%s" % (NS, "virtualflow.io/job%3D" + name),
        )["items"]
        return items[0] if items else None

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
        finished = self.cp.wait_for(
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
        self.assertEqual(done["weightsSha256"], local_sha(first, 2))
        for name in ("first", "second"):
            self.delete_job(name)

    def test_2_partial_admission_caps_the_workers_below_the_free_gpus(self):
        self.reset_nodes(("gpu-k3", 4))
        holder = queued_manifest("holder", steps=5000, replicas=(2, 2), delay_ms=8)
        partial = queued_manifest("partial", steps=100, replicas=(1, 4), delay_ms=8)
        self.apply(holder)
        self.wait_workers("holder", 2)
        # 1 GPU of the quota is left and the node has 2 free: Kueue admits 1 of the 4 workers
        # asked for (down to replicas.min), and the job runs on 1.
        self.apply(partial)
        status = self.admitted("partial")
        self.assertIn("Kueue admitted 1 worker(s)", condition(status, "Admitted")["message"])
        assignment = self.workload("partial")["status"]["admission"]["podSetAssignments"][0]
        self.assertEqual(assignment["count"], 1)
        running = self.wait_workers("partial", 1)
        self.assertEqual(running["desiredWorkers"], 1)
        self.assertEqual(len(self.pods("partial")), 1)
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


if __name__ == "__main__":
    unittest.main()
