"""Smoke test of the end-to-end test bed: the real scheduler binds pods that ask for
nvidia.com/gpu to fake GPU nodes, refuses what does not fit, honours cordon and drain, and the real
garbage collector follows owner references."""

import json
import os
import shutil
import tempfile
import unittest

from controlplane import GPU_PRODUCT_LABEL, GPU_RESOURCE, ControlPlaneTestCase

NS = "smoke"


def gpu_pod(name, gpus, node_selector=None):
    spec = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "worker",
                "image": "virtualflow/agent:e2e",  # never pulled: no kubelet runs
                "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


class ControlPlaneTest(ControlPlaneTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cp.create_namespace(NS)
        # Each test that schedules gets its own pair of nodes (selected by the `pool` label), so
        # a cordon in one test does not change what another sees.
        for pool in ("bind", "cordon"):
            for i in (1, 2):
                cls.cp.add_gpu_node(
                    "%s-gpu-%d" % (pool, i),
                    gpus=8 if i == 1 else 4,
                    labels={"e2e.virtualflow.io/pool": pool},
                )

    def create(self, obj):
        self.cp.kubectl("create", "-f", "-", input=json.dumps(obj), check=True)

    def pod(self, name):
        return self.cp.get("/api/v1/namespaces/%s/pods/%s" % (NS, name))

    def wait_bound(self, name, timeout=60):
        return self.cp.wait_for(
            "pod %s to be bound" % name, lambda: self.pod(name)["spec"].get("nodeName"), timeout
        )

    def unschedulable_condition(self, name):
        for c in (self.pod(name).get("status") or {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return c
        return None

    def test_nodes_advertise_gpus(self):
        self.cp.add_gpu_node(
            "h100-gpu-1",
            gpus=2,
            product="NVIDIA-H100-80GB-HBM3",
            labels={"e2e.virtualflow.io/pool": "h100"},
        )
        out = self.cp.kubectl("get", "nodes", "-L", GPU_PRODUCT_LABEL, check=True).stdout
        lines = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
        for name, product in (
            ("bind-gpu-1", "NVIDIA-A100-SXM4-40GB"),
            ("bind-gpu-2", "NVIDIA-A100-SXM4-40GB"),
            ("h100-gpu-1", "NVIDIA-H100-80GB-HBM3"),
        ):
            self.assertIn(name, lines, out)
            self.assertEqual(lines[name][1], "Ready", out)
            self.assertEqual(lines[name][-1], product, out)
        node = json.loads(
            self.cp.kubectl("get", "node", "bind-gpu-1", "-o", "json", check=True).stdout
        )
        self.assertEqual(node["status"]["capacity"][GPU_RESOURCE], "8")
        self.assertEqual(node["status"]["allocatable"][GPU_RESOURCE], "8")
        self.assertEqual(node["status"]["allocatable"]["cpu"], "64")
        self.assertEqual(node["metadata"]["labels"]["kubernetes.io/hostname"], "bind-gpu-1")
        self.assertFalse(node["spec"].get("taints"))
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        self.assertEqual(ready[0]["status"], "True")

    def test_scheduler_binds_gpu_pod_and_refuses_too_many(self):
        pool = {"e2e.virtualflow.io/pool": "bind"}
        self.create(gpu_pod("one-gpu", 1, pool))
        node = self.wait_bound("one-gpu")
        self.assertIn(node, ("bind-gpu-1", "bind-gpu-2"))
        self.assertEqual([p["metadata"]["name"] for p in self.cp.pods_on(node)], ["one-gpu"])

        self.create(gpu_pod("nine-gpus", 9, pool))
        condition = self.cp.wait_for(
            "nine-gpus to be unschedulable", lambda: self.unschedulable_condition("nine-gpus")
        )
        self.assertEqual(condition["reason"], "Unschedulable")
        self.assertIn("Insufficient %s" % GPU_RESOURCE, condition["message"])
        self.assertFalse(self.pod("nine-gpus")["spec"].get("nodeName"))

    def test_cordon_and_drain(self):
        pool = {"e2e.virtualflow.io/pool": "cordon"}
        self.cp.cordon("cordon-gpu-1")
        try:
            for i in range(3):
                self.create(gpu_pod("cordoned-%d" % i, 1, pool))
            for i in range(3):
                self.assertEqual(self.wait_bound("cordoned-%d" % i), "cordon-gpu-2")
            # Only cordon-gpu-1 fits 5 GPUs, and it is cordoned.
            self.create(gpu_pod("big", 5, pool))
            condition = self.cp.wait_for(
                "big to be unschedulable", lambda: self.unschedulable_condition("big")
            )
            self.assertIn("unschedulable", condition["message"])
        finally:
            self.cp.uncordon("cordon-gpu-1")
        self.assertEqual(self.wait_bound("big"), "cordon-gpu-1")

        self.cp.drain("cordon-gpu-2")
        self.assertEqual(self.cp.pods_on("cordon-gpu-2"), [])
        self.assertIsNone(self.pod("cordoned-0"))
        self.assertTrue(self.cp.get("/api/v1/nodes/cordon-gpu-2")["spec"]["unschedulable"])
        self.cp.delete_node("cordon-gpu-2")
        self.cp.wait_for("node deleted", lambda: self.cp.get("/api/v1/nodes/cordon-gpu-2") is None)
        self.assertNotIn("cordon-gpu-2", self.cp.kubectl("get", "nodes", check=True).stdout)

    def test_garbage_collector_follows_owner_references(self):
        self.cp.kubectl("-n", NS, "create", "configmap", "owner", check=True)
        owner = self.cp.get("/api/v1/namespaces/%s/configmaps/owner" % NS)
        self.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": "dependent",
                    "namespace": NS,
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "name": "owner",
                            "uid": owner["metadata"]["uid"],
                        }
                    ],
                },
            }
        )
        self.cp.kubectl("-n", NS, "delete", "configmap", "owner", check=True)
        self.cp.wait_for(
            "the garbage collector to delete the dependent",
            lambda: self.cp.get("/api/v1/namespaces/%s/configmaps/dependent" % NS) is None,
            timeout=90,
        )

    def test_service_account_token(self):
        # What a pod's process gets from its kubelet: a TokenRequest token that the API server
        # accepts. Checked by asking who the token's bearer is.
        token = self.cp.kubectl("-n", NS, "create", "token", "default", check=True).stdout.strip()
        review = self.cp.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        self.assertIn("system:masters", review["status"]["userInfo"]["groups"])
        out = self.cp.kubectl("auth", "whoami", "-o", "json", token=token, check=True)
        self.assertEqual(
            json.loads(out.stdout)["status"]["userInfo"]["username"],
            "system:serviceaccount:%s:default" % NS,
        )
        # service_account_dir() writes the files a kubelet mounts into a pod; a pod-like process
        # reads them (and KUBERNETES_SERVICE_HOST/PORT) as an in-cluster client does.
        sa_dir = tempfile.mkdtemp(prefix="vf-e2e-sa-")
        self.addCleanup(shutil.rmtree, sa_dir, True)
        env = self.cp.service_account_dir(sa_dir, "default", NS)
        self.assertEqual(
            env,
            {
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.cp.ports["apiserver"]),
            },
        )
        with open(os.path.join(sa_dir, "namespace")) as f:
            self.assertEqual(f.read(), NS)
        with open(os.path.join(sa_dir, "token")) as f:
            out = self.cp.kubectl("auth", "whoami", "-o", "json", token=f.read(), check=True)
        self.assertEqual(
            json.loads(out.stdout)["status"]["userInfo"]["username"],
            "system:serviceaccount:%s:default" % NS,
        )


if __name__ == "__main__":
    unittest.main()
