"""spec.template as a whole pod template on a real control plane: the operator keeps what the
template writes (init containers, a sidecar, topology spread constraints, the pod's fsGroup)
around what it owns, the real scheduler honours it, and the job ends with the weights of a
local static run; a job whose worker container asks for a MIG profile gets pods that request
exactly that resource, on the node that advertises it.

The pod runner plays the kubelet: it runs a pod's first container only (the worker, which the
operator puts first) and neither init containers nor sidecars, so what the test asserts of those
is that the pods the operator created carry them exactly as written."""

import copy
import unittest

from test_operator import OperatorTestCase, job_manifest, local_sha, worker

MIG = "nvidia.com/mig-1g.10gb"


def spread_job(name: str) -> dict:
    """Two workers with an init container, a sidecar (an init container that keeps running, as
    Kubernetes writes one), a spread of one per node and the volume group 2000."""
    manifest = job_manifest(name, steps=40, replicas=(2, 2))
    pod = manifest["spec"]["template"]["spec"]
    pod["initContainers"] = [
        {"name": "fetch", "image": "busybox:1.36", "command": ["true"]},
        {
            "name": "log-shipper",
            "image": "busybox:1.36",
            "restartPolicy": "Always",
            "command": ["sleep", "infinity"],
        },
    ]
    pod["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"virtualflow.io/job": name}},
        }
    ]
    pod["securityContext"] = {"fsGroup": 2000}
    worker(manifest)["ports"] = [{"name": "debug", "containerPort": 5678}]
    return manifest


class PodTemplateTest(OperatorTestCase):
    def test_init_containers_sidecar_spread_and_fs_group_run_to_the_static_weights(self):
        name = "spread"
        manifest = spread_job(name)
        written = copy.deepcopy(manifest["spec"]["template"]["spec"])
        # Two nodes of two GPUs: only the spread keeps the two workers off one node.
        self.reset_nodes(("gpu-p", 2), ("gpu-q", 2))
        self.apply(manifest)
        # A short job may end before a poll sees it running: its pods stay once it has
        # (cleanPodPolicy None), and say how they were made and where they ran.
        status = self.wait_succeeded(name)
        pods = self.pods(name)
        self.assertEqual(len(pods), 2)
        self.assertEqual(sorted(p["spec"]["nodeName"] for p in pods), ["gpu-p", "gpu-q"])
        for pod in pods:
            spec = pod["spec"]
            # As written, plus what the API server defaults (terminationMessagePath, ...).
            self.assertEqual(
                [
                    {k: c.get(k) for k in w}
                    for c, w in zip(spec["initContainers"], written["initContainers"], strict=True)
                ],
                written["initContainers"],
            )
            self.assertEqual(len(spec["initContainers"]), 2)
            self.assertEqual(
                spec["topologySpreadConstraints"], written["topologySpreadConstraints"]
            )
            self.assertEqual(spec["securityContext"]["fsGroup"], 2000)
            self.assertTrue(spec["securityContext"]["runAsNonRoot"])  # the operator's default
            self.assertEqual(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault")
            self.assertEqual(spec["restartPolicy"], "Never")
            [container] = spec["containers"]
            self.assertEqual(container["name"], "worker")
            # The template's port, kept (the operator adds its metrics port when it has one).
            self.assertEqual(container["ports"][0]["name"], "debug")
            self.assertEqual(container["ports"][0]["containerPort"], 5678)
            self.assertEqual(
                pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"],
                "worker",
            )
        self.assertEqual(status["weightsSha256"], local_sha(manifest))
        self.delete_job(name)

    def test_a_mig_profile_is_requested_exactly_on_the_node_that_has_it(self):
        name = "mig"
        manifest = job_manifest(name, steps=20, replicas=(2, 2))
        del manifest["spec"]["gpusPerWorker"]  # the container's resources say it
        worker(manifest)["resources"] = {"limits": {MIG: 1}}
        # gpu-w has whole GPUs only; mig-a has no whole GPU and seven slices of the profile.
        self.reset_nodes(("gpu-w", 4))
        self.cp.add_gpu_node("mig-a", gpus=0)
        self.cp.patch(
            "/api/v1/nodes/mig-a/status",
            {"status": {"capacity": {MIG: "7"}, "allocatable": {MIG: "7"}}},
        )
        self.apply(manifest)
        # A short job may end before a poll sees it running: its pods stay once it has
        # (cleanPodPolicy None), and say where they ran and what they asked for.
        status = self.wait_succeeded(name)
        pods = self.pods(name)
        self.assertEqual(len(pods), 2)
        for pod in pods:
            self.assertEqual(pod["spec"]["nodeName"], "mig-a")
            resources = pod["spec"]["containers"][0]["resources"]
            for part in ("limits", "requests"):  # the API server copies limits to requests
                self.assertEqual(resources[part][MIG], "1")
                self.assertNotIn("nvidia.com/gpu", resources[part])
            # A slice is no product of whole GPUs: no product pin.
            self.assertNotIn("nvidia.com/gpu.product", pod["spec"].get("nodeSelector", {}))
        self.assertEqual(status["weightsSha256"], local_sha(manifest))
        self.delete_job(name)


if __name__ == "__main__":
    unittest.main()
