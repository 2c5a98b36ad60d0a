"""The operator's Kubernetes client (operator/kube) against a real API server.

Starts a control plane, sets up two service accounts with narrow RBAC, and runs the
kube_client_e2e_test GoogleTest binary once per way of authenticating:

- a kubeconfig with client certificates (the admin kubeconfig): CRUD of ConfigMaps, Secrets,
  Leases and Node status, Events, error reasons, watches, bookmarks, 410 handling, the reflector,
  the rate limiter, the request observer, and leader election on a Lease (one leader of two,
  hand-over on release, takeover after expiry, a leader whose Lease is taken stops);
- a kubeconfig with a service account's bearer token, inline and from a file;
- in-cluster configuration: a service-account directory (token from `kubectl create token`, the
  CA, the namespace) named by VF_SERVICEACCOUNT_DIR, and KUBERNETES_SERVICE_HOST/PORT.

The binary comes from $VF_KUBE_CLIENT_E2E_TEST (set by ctest), else $VF_BIN_DIR.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from controlplane import ControlPlaneTestCase

SA_NAMESPACE = "kube-client-sa"
WRITER = "configmap-writer"  # may do anything to ConfigMaps in SA_NAMESPACE, nothing else
READER = "configmap-reader"  # may only read ConfigMaps in SA_NAMESPACE

# What the binary reads; cleared from the inherited environment so that each run sees only what
# it is given.
TEST_ENV = (
    "VF_TEST_KUBECONFIG",
    "VF_TEST_TOKEN_KUBECONFIG",
    "VF_TEST_SA_NAMESPACE",
    "VF_TEST_TOKEN_SA",
    "VF_TEST_IN_CLUSTER",
    "VF_TEST_IN_CLUSTER_SA",
    "VF_SERVICEACCOUNT_DIR",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "KUBECONFIG",
)


def gtest_binary():
    path = os.environ.get("VF_KUBE_CLIENT_E2E_TEST")
    if not path and os.environ.get("VF_BIN_DIR"):
        path = os.path.join(os.environ["VF_BIN_DIR"], "kube_client_e2e_test")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError(
            "kube_client_e2e_test not found (%r): build it and set "
            "VF_KUBE_CLIENT_E2E_TEST or VF_BIN_DIR" % path
        )
    return path


class KubeClientTest(ControlPlaneTestCase):
    @classmethod
    def setUpClass(cls):
        cls.binary = gtest_binary()  # before the control plane: no binary, no point starting it
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="vf-kube-client-")
        cp = cls.cp
        cp.create_namespace(SA_NAMESPACE)
        base = "/api/v1/namespaces/%s" % SA_NAMESPACE
        rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/%s" % SA_NAMESPACE
        for account, verbs in (
            (WRITER, ["get", "list", "watch", "create", "update", "patch", "delete"]),
            (READER, ["get", "list", "watch"]),
        ):
            cp.request(
                "POST",
                base + "/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
            )
            cp.request(
                "POST",
                rbac + "/roles",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": account},
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs}],
                },
            )
            cp.request(
                "POST",
                rbac + "/rolebindings",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": account},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": account,
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": account, "namespace": SA_NAMESPACE}
                    ],
                },
            )

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(getattr(cls, "tmp", ""), ignore_errors=True)
        super().tearDownClass()

    def create_token(self, account):
        """A service-account token the way a person gets one."""
        proc = self.cp.kubectl(
            "create", "token", account, "-n", SA_NAMESPACE, "--duration=1h", check=True
        )
        return proc.stdout.strip()

    def run_suite(self, suite, env):
        """Runs the binary's SUITE with ENV added; fails if a test fails or is skipped."""
        full = {k: v for k, v in os.environ.items() if k not in TEST_ENV}
        full.update(env)
        proc = subprocess.run(
            [self.binary, "--gtest_filter=%s.*" % suite, "--gtest_color=no"],
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=600,
        )
        sys.stdout.write(proc.stdout)
        sys.stdout.flush()
        self.assertEqual(
            proc.returncode,
            0,
            "%s failed (exit %d):\n%s" % (suite, proc.returncode, proc.stdout[-6000:]),
        )
        # A skip here means the environment above did not reach the binary.
        self.assertNotIn("[  SKIPPED ]", proc.stdout)
        self.assertIn("[  PASSED  ]", proc.stdout)

    def test_kubeconfig_with_client_certificates(self):
        self.run_suite("KubeconfigE2E", {"VF_TEST_KUBECONFIG": self.cp.kubeconfig})

    def test_kubeconfig_with_bearer_tokens(self):
        token_file = os.path.join(self.tmp, "writer.token")
        with open(token_file, "w") as f:
            f.write(self.create_token(WRITER) + "\n")
        token = self.create_token(WRITER)
        kubeconfig = os.path.join(self.tmp, "token.kubeconfig")
        with open(kubeconfig, "w") as f:
            f.write(
                """apiVersion: v1
kind: Config
current-context: token
clusters:
- name: e2e
  cluster:
    server: %(server)s
    certificate-authority: %(ca)s
users:
- name: inline
  user:
    token: %(token)s
- name: file
  user:
    tokenFile: writer.token
contexts:
- name: token
  context: {cluster: e2e, user: inline, namespace: %(ns)s}
- name: token-file
  context: {cluster: e2e, user: file, namespace: %(ns)s}
"""
                % {
                    "server": self.cp.server,
                    "ca": self.cp.ca_file,
                    "token": token,
                    "ns": SA_NAMESPACE,
                }
            )
        self.run_suite(
            "TokenE2E",
            {
                "VF_TEST_TOKEN_KUBECONFIG": kubeconfig,
                "VF_TEST_SA_NAMESPACE": SA_NAMESPACE,
                "VF_TEST_TOKEN_SA": WRITER,
            },
        )

    def test_in_cluster_configuration(self):
        sa_dir = os.path.join(self.tmp, "serviceaccount")
        os.makedirs(sa_dir, exist_ok=True)
        with open(os.path.join(sa_dir, "token"), "w") as f:
            f.write(self.create_token(READER))
        shutil.copyfile(self.cp.ca_file, os.path.join(sa_dir, "ca.crt"))
        with open(os.path.join(sa_dir, "namespace"), "w") as f:
            f.write(SA_NAMESPACE)
        self.run_suite(
            "InClusterE2E",
            {
                "VF_TEST_IN_CLUSTER": "1",
                "VF_SERVICEACCOUNT_DIR": sa_dir,
                # What a pod sees; the API server's certificate covers 127.0.0.1.
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.cp.ports["apiserver"]),
                "VF_TEST_SA_NAMESPACE": SA_NAMESPACE,
                "VF_TEST_IN_CLUSTER_SA": READER,
            },
        )


if __name__ == "__main__":
    unittest.main()
