"""spec.runPolicy and the scale subresource against a real control plane (the operator, the
scheduler and the pod runner of test_operator.py): worker failures are counted in the job's
status, so an operator restarted between two of them still fails the job at its backoffLimit
(BackoffLimitExceeded), and each replacement waits out the Job controller's back-off; a failed
job has no completionTime and cleanPodPolicy Running deletes its running pods; a
podFailurePolicy ignores one exit code and fails the job at once on another, cleanPodPolicy All
deletes all its pods, and the failed job is deleted after its ttlSecondsAfterFinished;
`kubectl scale` shrinks a running job between two steps, is refused outside [min, max], and the
job ends with the weights of a static run."""

import calendar
import os
import signal
import time
import unittest
from typing import Any

from test_operator import NS, OperatorTestCase, job_manifest, local_sha_meanwhile

JOBS = "/apis/virtualflow.io/v1alpha1/namespaces/%s/virtualflowjobs/" % NS

# The Job controller's first back-off before a failed pod's replacement (pkg/controller/job).
FIRST_BACKOFF_SECONDS = 10


def unix(timestamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 UTC timestamp as the API server writes them."""
    return float(calendar.timegm(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")))


class RunPolicyTest(OperatorTestCase):
    # -------------------------------------------------------------- helpers

    def worker_pid(self, pod: dict[str, Any]) -> int:
        """The pid of POD's process, which the pod runner reports in its containerID."""
        cid = pod["status"]["containerStatuses"][0]["containerID"]
        return int(cid.rsplit("://", 1)[1])

    def kill_member(self, name: str, sig: int) -> str:
        """Sends SIG to the process of a running member of job NAME's plan; its pod's name."""

        def member() -> dict[str, Any] | None:
            plan = {a["worker"] for a in self.status(name).get("assignment", [])}
            for pod in self.pods(name):
                statuses = pod.get("status", {}).get("containerStatuses") or [{}]
                if (
                    pod["metadata"]["name"] in plan
                    and pod["status"].get("phase") == "Running"
                    and statuses[0].get("containerID")
                ):
                    return pod
            return None

        pod = self.cp.wait_for("a running member of %s" % name, member, timeout=120)
        os.kill(self.worker_pid(pod), sig)
        return pod["metadata"]["name"]

    def wait_phase_failed(self, name: str, timeout: float = 120) -> dict[str, Any]:
        def failed() -> dict[str, Any] | None:
            self.check_operator()
            status = self.status(name)
            return status if status.get("phase") == "Failed" else None

        return self.cp.wait_for("job %s to fail" % name, failed, timeout=timeout)

    def apply_job(self, manifest: dict[str, Any]) -> None:
        """Applies MANIFEST; its job is deleted when the test ends, passed or not, so that a
        failed test's pods do not take the next one's GPUs."""
        self.apply(manifest)
        self.addCleanup(self.delete_job, manifest["metadata"]["name"])

    def restart_operator(self, identity: str) -> None:
        os.killpg(self.operator.proc.pid, signal.SIGKILL)
        self.operator.proc.wait(10)
        self.start_operator(identity=identity)

    # -------------------------------------------------------------- tests

    def test_1_failures_survive_an_operator_restart_and_fail_the_job_at_its_backoff_limit(
        self,
    ) -> None:
        name = "backoff"
        # Never finishes by itself: it ends when its failures are used up.
        manifest = job_manifest(name, steps=100000, replicas=(1, 2), delay_ms=20)
        manifest["spec"]["runPolicy"] = {"backoffLimit": 2, "cleanPodPolicy": "Running"}
        self.reset_nodes(("gpu-f", 2))
        self.apply_job(manifest)
        self.wait_workers(name, 2)
        self.assertEqual(self.status(name)["selector"], "virtualflow.io/job=" + name)
        before = {p["metadata"]["name"] for p in self.pods(name)}

        first = self.kill_member(name, signal.SIGKILL)
        counted = self.wait_status(name, "one failure counted", lambda s: s.get("failed") == 1)
        failed_at = unix(counted["lastFailureTime"])
        # Restarted at once, while the failed pod may still be there: the new operator reads
        # the count (and the pods already counted) from the job's status.
        self.restart_operator("operator-2")

        # The replacement waits out the first back-off, then joins. (Not just "2 workers": until
        # the members report the failure, the plan that counted it may still name the dead pod.)
        status = self.wait_status(
            name,
            "a replacement among 2 workers running",
            lambda s: (
                s.get("workers") == 2
                and s.get("phase") == "Running"
                and any(a["worker"] not in before for a in s.get("assignment", []))
            ),
            timeout=180,
        )
        replacements = [p for p in self.pods(name) if p["metadata"]["name"] not in before]
        self.assertEqual(len(replacements), 1, [p["metadata"]["name"] for p in self.pods(name)])
        created = unix(replacements[0]["metadata"]["creationTimestamp"])
        # Timestamps have whole seconds: at most one is lost to rounding.
        self.assertGreaterEqual(created - failed_at, FIRST_BACKOFF_SECONDS - 1)
        self.assertEqual(status["failed"], 1, "a failure was counted twice: %s" % status)
        # Deleted once counted, and then no longer listed as counted.
        self.cp.wait_for(
            "the failed pod %s to be deleted" % first,
            lambda: (
                first not in {p["metadata"]["name"] for p in self.pods(name)}
                and first not in self.status(name).get("countedFailedPods", [])
            ),
            timeout=60,
        )

        self.kill_member(name, signal.SIGKILL)
        # Two failures: within the limit (wait_status fails on a Failed job).
        self.wait_status(name, "two failures counted", lambda s: s.get("failed") == 2)
        # The third is one more than backoffLimit allows.
        self.kill_member(name, signal.SIGKILL)
        status = self.wait_phase_failed(name)
        failed = self.condition(status, "Failed")
        self.assertEqual((failed["status"], failed["reason"]), ("True", "BackoffLimitExceeded"))
        self.assertIn(
            "3 worker failures, more than spec.runPolicy.backoffLimit (2)", failed["message"]
        )
        self.assertEqual(status["failed"], 3)
        # batch/v1: a failed job has no completionTime; its condition says when.
        self.assertNotIn("completionTime", status)
        self.assertTrue(failed["lastTransitionTime"])
        self.assertIn("BackoffLimitExceeded", [r for r, _ in self.events(name)])
        # cleanPodPolicy Running: no pod of the failed job is left pending or running.
        self.cp.wait_for(
            "the running pods of %s to be deleted" % name,
            lambda: all(
                p["status"].get("phase") in ("Succeeded", "Failed") for p in self.pods(name)
            ),
            timeout=120,
        )

    def test_2_pod_failure_policy_ignores_one_exit_code_and_fails_the_job_on_another(
        self,
    ) -> None:
        name = "podfailure"
        manifest = job_manifest(name, steps=100000, replicas=(1, 2), delay_ms=20)
        manifest["spec"]["runPolicy"] = {
            # Not one failure may count...
            "backoffLimit": 0,
            "cleanPodPolicy": "All",
            "ttlSecondsAfterFinished": 20,
            "podFailurePolicy": {
                "rules": [
                    # ...but a worker killed by SIGUSR1 (128 + 10, the agent does not catch it)
                    # is not counted, and one killed by SIGKILL fails the job at once.
                    {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [138]}},
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "worker",
                            "operator": "In",
                            "values": [137],
                        },
                    },
                ]
            },
        }
        self.reset_nodes(("gpu-p", 2))
        self.apply_job(manifest)
        self.wait_workers(name, 2)
        self.kill_member(name, signal.SIGUSR1)
        status = self.wait_status(
            name, "the failure seen", lambda s: s.get("restarts", {}).get("failure", 0) == 1
        )
        self.assertEqual(status.get("failed", 0), 0, status)
        # Ignored: replaced without a back-off, and the job trains on.
        self.wait_workers(name, 2, timeout=60)

        victim = self.kill_member(name, signal.SIGKILL)
        status = self.wait_phase_failed(name)
        failed = self.condition(status, "Failed")
        self.assertEqual((failed["status"], failed["reason"]), ("True", "PodFailurePolicy"))
        self.assertIn(victim, failed["message"])
        self.assertIn("container worker exited 137", failed["message"])
        self.assertNotIn("completionTime", status)
        # cleanPodPolicy All: every pod of the failed job is deleted (gracefully: each is
        # terminating or gone), while the job itself waits for its TTL.
        self.cp.wait_for(
            "the pods of %s to be deleted" % name,
            lambda: all(p["metadata"].get("deletionTimestamp") for p in self.pods(name)),
        )
        self.assertIsNotNone(self.cp.get(JOBS + name))
        # ttlSecondsAfterFinished counts from the Failed condition of a job without
        # completionTime.
        self.cp.wait_for(
            "job %s to be deleted after its TTL" % name,
            lambda: self.cp.get(JOBS + name) is None,
            timeout=90,
        )

    def test_3_kubectl_scale_shrinks_a_running_job_with_static_weights(self) -> None:
        name = "scaled"
        manifest = job_manifest(name, steps=900, replicas=(1, 4), delay_ms=8)
        static = local_sha_meanwhile(manifest)
        self.reset_nodes(("gpu-s1", 2), ("gpu-s2", 2))
        self.apply_job(manifest)
        self.wait_workers(name, 4)
        self.wait_step(name, 40)

        # Outside [min, max]: the API server refuses the scale update with the CEL rule's words.
        refused = self.cp.kubectl("scale", "vfjob", "-n", NS, name, "--replicas", "5")
        self.assertNotEqual(refused.returncode, 0, refused.stdout)
        self.assertIn(
            "spec.replicas.desired (5) must be between spec.replicas.min (1) and "
            "spec.replicas.max (4)",
            refused.stderr,
        )
        self.assertNotIn("desired", self.job(name)["spec"]["replicas"])

        self.cp.kubectl("scale", "vfjob", "-n", NS, name, "--replicas", "2", check=True)
        self.assertEqual(self.job(name)["spec"]["replicas"]["desired"], 2)
        status = self.wait_status(
            name,
            "2 workers running, 2 desired",
            lambda s: (
                s.get("workers") == 2
                and s.get("desiredWorkers") == 2
                and s.get("phase") == "Running"
            ),
        )
        shrunk = status["lastResize"]
        self.assertEqual((shrunk["from"], shrunk["to"]), (4, 2), shrunk)
        step_at_shrink = status["step"]
        # The scale subresource reads the size back, with the pods' selector.
        scale = self.cp.get(
            "/apis/virtualflow.io/v1alpha1/namespaces/%s/virtualflowjobs/%s/scale" % (NS, name)
        )
        self.assertEqual(scale["spec"]["replicas"], 2)
        self.assertEqual(scale["status"]["replicas"], 2)
        self.assertEqual(scale["status"]["selector"], "virtualflow.io/job=" + name)

        status = self.wait_succeeded(name)
        self.assertLess(step_at_shrink, status["step"], "the job ended before it shrank")
        self.assertEqual(status["weightsSha256"], static.result(timeout=900))
        self.assertIn("completionTime", status)


if __name__ == "__main__":
    unittest.main()
