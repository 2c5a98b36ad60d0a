"""The Helm chart (charts/virtualflow) with the pinned helm, and installed in a real control plane.

Without a cluster: `helm lint --strict` passes; `helm template` renders for every combination of
values that matters, every object carries the recommended labels, and the operator's flags,
probes and security context are the ones the operator expects; bad values fail with the
schema's message (or the chart's own, for rules across values); the chart's CRD is the
repository's crds/virtualflowjob.yaml; the Grafana dashboard parses and queries only metrics the
project exports (or DCGM's). (The Dockerfiles are checked in tests/images/test_dockerfiles.py.)

With a control plane: `helm install` creates every object (the API server accepts them all, the
CRD is established, the Deployment's pods pass the `restricted` Pod Security Standard), and the
operator's ServiceAccount can do exactly what the operator needs: `kubectl auth can-i --as`
says yes to each needed verb and resource and no to anything else, both cluster-wide and with
watchNamespace. Upgrade and uninstall work. No kubelet runs the Deployment's pods, so
`helm install --wait` is not used: the test checks the objects instead. When the operator is
built (VF_BIN_DIR), the test runs it as those pods would (the Deployment's arguments and
environment, the ServiceAccount's token): two replicas elect one leader, both are ready, the
leader runs a job without a single forbidden request, and the standby takes over when it stops;
the same with watchNamespace.

In a control plane of its own (ChartUpgradeTest): `helm upgrade` from the previous chart, which
kept the CRD in crds/, to this one upgrades the CRD; the test then plays the kubelet for the
Deployment's two pods (the built operator run as each pod, its /readyz as the readiness probe):
both become ready, `kubectl rollout status` and `helm upgrade --wait` return, the
PodDisruptionBudget allows one disruption, and the Service's endpoints are the leader's pod
alone, before and after a change of leader.
"""

import filecmp
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

from controlplane import (
    ApiError,
    ControlPlane,
    ControlPlaneTestCase,
    _die_with_parent,
    bin_dir,
    free_port,
)
from promql import dashboard_queries, metric_names

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("VF_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
CHART = os.path.join(SOURCE_DIR, "charts", "virtualflow")
CRD_FILE = os.path.join(SOURCE_DIR, "crds", "virtualflowjob.yaml")
CHART_CRD_FILE = os.path.join(CHART, "files", "virtualflowjob.yaml")
DASHBOARD = os.path.join(CHART, "dashboards", "virtualflow.json")
EXAMPLE_PATH = "examples/fashion-mnist.yaml"
EXAMPLE = os.path.join(SOURCE_DIR, EXAMPLE_PATH)

APP_VERSION = "0.1.0"
RELEASE = "virtualflow"
NS = "vf-system"
OPERATOR = "virtualflow-operator"  # Deployment, Service, ServiceAccount of release RELEASE
CRD_NAME = "virtualflowjobs.virtualflow.io"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + CRD_NAME
# The label the leader puts on its own pod, which the coordinator's Service selects
# (operator/controller/leader_label.h).
LEADER_LABEL = "virtualflow.io/leader"
# The last commit whose chart kept the CRD in crds/, which Helm never upgrades: the chart an
# installation upgrades from to the one that templates the CRD (ChartUpgradeTest).
PREVIOUS_CHART_COMMIT = "a1d1f3949dc54a6a793a97c3275c28d6b24902b6"

RECOMMENDED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)

# Values that change what is rendered: (name, helm arguments).
VALUE_SETS = [
    ("defaults", []),
    (
        "everything-on",
        [
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "dashboards.enabled=true",
            "--set",
            "serviceMonitor.labels.release=prometheus",
            "--set",
            "dashboards.annotations.grafana_folder=VirtualFlow",
        ],
    ),
    ("one-namespace", ["--set", "watchNamespace=team-a", "--set", "serviceMonitor.enabled=true"]),
    ("single-replica", ["--set", "replicaCount=1", "--set", "leaderElection.enabled=false"]),
    ("plain", ["--set", "coordinator.tls.enabled=false", "--set", "networkPolicy.enabled=false"]),
    (
        "own-account",
        [
            "--set",
            "rbac.create=false",
            "--set",
            "serviceAccount.create=false",
            "--set",
            "serviceAccount.name=ops",
        ],
    ),
    (
        "customised",
        [
            "--set",
            "image.repository=mirror/vf/operator",
            "--set",
            "image.tag=0.2.0-rc1",
            "--set",
            "image.pullPolicy=Always",
            "--set",
            "agent.image.tag=sha256:" + "ab" * 32,
            "--set",
            "policy=autoscale",
            "--set",
            "coordinator.port=9000",
            "--set",
            "metrics.port=9001",
            "--set",
            "agent.metricsPort=9102",
            "--set",
            "kubeApi.qps=40",
            "--set",
            "kubeApi.burst=80",
            "--set",
            "nodeSelector.role=infra",
            "--set",
            "priorityClassName=high",
            "--set",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].key=role",
            "--set",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        ],
    ),
]

SCHEMA_ERROR = "values don't meet the specifications of the schema(s)"
# Values helm must refuse before rendering: (name, helm arguments, what the error must say).
BAD_VALUES = [
    (
        "no operator",
        ["--set", "replicaCount=0"],
        [SCHEMA_ERROR, "at '/replicaCount': minimum: got 0, want 1"],
    ),
    (
        "replica count as text",
        ["--set-string", "replicaCount=two"],
        [SCHEMA_ERROR, "at '/replicaCount': got string, want integer"],
    ),
    (
        "unknown policy",
        ["--set", "policy=fastest"],
        [SCHEMA_ERROR, "at '/policy': value must be one of 'static', 'elastic', 'autoscale'"],
    ),
    (
        "unknown pull policy",
        ["--set", "image.pullPolicy=Sometimes"],
        [
            SCHEMA_ERROR,
            "at '/image/pullPolicy': value must be one of 'IfNotPresent', 'Always', 'Never'",
        ],
    ),
    (
        "port above 65535",
        ["--set", "coordinator.port=70000"],
        [SCHEMA_ERROR, "at '/coordinator/port': maximum: got 70,000, want 65,535"],
    ),
    (
        "port 0",
        ["--set", "metrics.port=0"],
        [SCHEMA_ERROR, "at '/metrics/port': minimum: got 0, want 1"],
    ),
    (
        "agent metrics port above 65535",
        ["--set", "agent.metricsPort=65536"],
        [SCHEMA_ERROR, "at '/agent/metricsPort': maximum: got 65,536, want 65,535"],
    ),
    (
        "no API budget",
        ["--set", "kubeApi.qps=0"],
        [SCHEMA_ERROR, "at '/kubeApi/qps': exclusiveMinimum: got 0, want 0"],
    ),
    (
        "no API burst",
        ["--set", "kubeApi.burst=0"],
        [SCHEMA_ERROR, "at '/kubeApi/burst': minimum: got 0, want 1"],
    ),
    (
        "unknown top-level key",
        ["--set", "replicas=3"],
        [SCHEMA_ERROR, "additional properties 'replicas' not allowed"],
    ),
    (
        "misspelt key",
        ["--set", "leaderElection.leasename=x"],
        [SCHEMA_ERROR, "at '/leaderElection': additional properties 'leasename' not allowed"],
    ),
    (
        "namespace that is not a name",
        ["--set", "watchNamespace=Team_A"],
        [SCHEMA_ERROR, "at '/watchNamespace': 'Team_A' does not match pattern"],
    ),
    (
        "interval that is not a duration",
        ["--set", "serviceMonitor.interval=half a minute"],
        [SCHEMA_ERROR, "at '/serviceMonitor/interval'"],
    ),
    (
        "image tag with a space",
        ["--set", "image.tag=latest version"],
        [SCHEMA_ERROR, "at '/image/tag'"],
    ),
    (
        "boolean as text",
        ["--set-string", "rbac.create=yes"],
        [SCHEMA_ERROR, "at '/rbac/create': got string, want boolean"],
    ),
    # Rules across values, worded by the chart.
    (
        "two operators without leader election",
        ["--set", "leaderElection.enabled=false"],
        [
            "replicaCount is 2 but leaderElection.enabled is false: more than one operator "
            "would act on the same jobs; enable leader election or set replicaCount to 1"
        ],
    ),
    (
        "one port for two endpoints",
        ["--set", "metrics.port=7070"],
        ["coordinator.port and metrics.port are both 7070"],
    ),
    (
        "bindings for the default account",
        ["--set", "serviceAccount.create=false"],
        ["serviceAccount.create is false and serviceAccount.name is empty"],
    ),
]

# What the operator may do, as (verb, resource, subresource): exactly this and no more.
JOB_RIGHTS = [
    ("get", "virtualflowjobs.virtualflow.io", ""),
    ("list", "virtualflowjobs.virtualflow.io", ""),
    ("watch", "virtualflowjobs.virtualflow.io", ""),
    ("delete", "virtualflowjobs.virtualflow.io", ""),  # ttlSecondsAfterFinished
    ("get", "virtualflowjobs.virtualflow.io", "status"),
    ("update", "virtualflowjobs.virtualflow.io", "status"),
    ("patch", "virtualflowjobs.virtualflow.io", "status"),
    ("get", "pods", ""),
    ("list", "pods", ""),
    ("watch", "pods", ""),
    ("create", "pods", ""),
    ("delete", "pods", ""),
    # Each worker's credential Secret; a job's secret is derived, never read from its namespace.
    ("create", "secrets", ""),
    ("create", "events", ""),
    ("patch", "events", ""),
    # Each job's NetworkPolicy: mirrored, created, written back when changed.
    ("list", "networkpolicies.networking.k8s.io", ""),
    ("watch", "networkpolicies.networking.k8s.io", ""),
    ("create", "networkpolicies.networking.k8s.io", ""),
    ("update", "networkpolicies.networking.k8s.io", ""),
    # Kueue admission: a job's Workloads (a unit deleted when not needed), and their status.
    ("get", "workloads.kueue.x-k8s.io", ""),
    ("list", "workloads.kueue.x-k8s.io", ""),
    ("watch", "workloads.kueue.x-k8s.io", ""),
    ("create", "workloads.kueue.x-k8s.io", ""),
    ("delete", "workloads.kueue.x-k8s.io", ""),
    ("update", "workloads.kueue.x-k8s.io", "status"),
]
NODE_RIGHTS = [
    ("get", "nodes", ""),
    ("list", "nodes", ""),
    ("watch", "nodes", ""),
    # The priority of a job's Workloads, from the class it names.
    ("get", "workloadpriorityclasses.kueue.x-k8s.io", ""),
    ("get", "priorityclasses.scheduling.k8s.io", ""),
    # The node labels and tolerations of the flavors Kueue admitted a job to.
    ("get", "resourceflavors.kueue.x-k8s.io", ""),
]
# Read cluster-wide even with watchNamespace: the GPU inventory counts what every pod holds.
INVENTORY_RIGHTS = NODE_RIGHTS + [("get", "pods", ""), ("list", "pods", ""), ("watch", "pods", "")]
# Asked with the Lease's name for get and update (the Role names it).
LEASE_RIGHTS = [
    ("get", "leases.coordination.k8s.io", ""),
    ("update", "leases.coordination.k8s.io", ""),
    ("create", "leases.coordination.k8s.io", ""),
]
# What it must not be able to do, in a job namespace.
DENIED = [
    ("create", "virtualflowjobs.virtualflow.io", ""),  # jobs belong to users
    ("update", "virtualflowjobs.virtualflow.io", ""),
    ("patch", "virtualflowjobs.virtualflow.io", ""),
    ("deletecollection", "virtualflowjobs.virtualflow.io", ""),
    ("update", "pods", ""),
    ("patch", "pods", ""),
    ("deletecollection", "pods", ""),
    ("update", "pods", "status"),
    ("create", "pods", "exec"),
    ("create", "pods", "eviction"),
    ("get", "pods", "log"),
    ("get", "secrets", ""),
    ("list", "secrets", ""),
    ("watch", "secrets", ""),
    ("update", "secrets", ""),
    ("delete", "secrets", ""),
    ("get", "events", ""),
    ("list", "events", ""),
    ("delete", "events", ""),
    # A job's NetworkPolicy goes with the job (its owner reference), never by the operator.
    ("delete", "networkpolicies.networking.k8s.io", ""),
    ("patch", "networkpolicies.networking.k8s.io", ""),
    ("create", "nodes", ""),
    ("update", "nodes", ""),
    ("patch", "nodes", ""),
    ("delete", "nodes", ""),
    ("patch", "nodes", "status"),
    ("create", "deployments.apps", ""),
    ("list", "deployments.apps", ""),
    ("get", "configmaps", ""),
    ("create", "services", ""),
    ("list", "services", ""),
    ("create", "serviceaccounts", "token"),
    ("create", "rolebindings.rbac.authorization.k8s.io", ""),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", ""),
    ("list", "leases.coordination.k8s.io", ""),
    ("delete", "leases.coordination.k8s.io", ""),
    ("update", "customresourcedefinitions.apiextensions.k8s.io", ""),
    ("impersonate", "serviceaccounts", ""),
    # Kueue: no Workload changed but through its status, no quota touched.
    ("update", "workloads.kueue.x-k8s.io", ""),
    ("patch", "workloads.kueue.x-k8s.io", ""),
    ("patch", "workloads.kueue.x-k8s.io", "status"),
    ("list", "workloadpriorityclasses.kueue.x-k8s.io", ""),
    ("update", "priorityclasses.scheduling.k8s.io", ""),
    ("get", "clusterqueues.kueue.x-k8s.io", ""),
    ("update", "localqueues.kueue.x-k8s.io", ""),
]
# Rules of Kubernetes' default policy that `kubectl auth can-i --list` also shows: what every
# authenticated user may do (system:basic-user), and reading ClusterTrustBundles, which every
# service account may (for projected volumes).
EVERYONE = {
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
    "selfsubjectreviews.authentication.k8s.io",
    "clustertrustbundles.certificates.k8s.io",
}

# The metrics the project exports (docs/metrics.md); a dashboard query may use these, a
# histogram's _bucket/_sum/_count series, and DCGM exporter's DCGM_* metrics.
OPERATOR_METRICS = {
    "vf_operator_jobs",
    "vf_operator_job_workers",
    "vf_operator_resizes_total",
    "vf_operator_job_step",
    "vf_operator_job_total_steps",
    "vf_operator_job_samples_per_second",
    "vf_operator_reconcile_errors_total",
    "vf_operator_workqueue_depth",
    "vf_operator_api_request_errors_total",
    "vf_operator_gpus",
    "vf_operator_is_leader",
    "vf_build_info",
}
AGENT_METRICS = {
    "vf_agent_steps_total",
    "vf_agent_samples_per_second",
    "vf_agent_loss",
    "vf_agent_virtual_nodes",
    "vf_agent_membership_epoch",
    "vf_agent_allreduce_seconds_total",
    "vf_agent_state_transfer_bytes_total",
    "vf_agent_state_transfer_seconds_total",
    "vf_agent_recoveries_total",
}
HISTOGRAMS = {
    "vf_operator_resize_pause_seconds",
    "vf_operator_reconcile_duration_seconds",
    "vf_operator_api_request_duration_seconds",
    "vf_agent_step_duration_seconds",
    "vf_agent_communicator_rebuild_seconds",
}
KNOWN_METRICS = (
    OPERATOR_METRICS
    | AGENT_METRICS
    | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
)


def selects(selector, labels):
    """Whether a Kubernetes label selector (matchLabels, matchExpressions) selects LABELS."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if not {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]:
            return False
    return True


def operator_binary():
    """The built virtualflow-operator ($VF_BIN_DIR, else build/bin), or None."""
    path = os.path.join(
        os.environ.get("VF_BIN_DIR") or os.path.join(SOURCE_DIR, "build", "bin"),
        "virtualflow-operator",
    )
    return path if os.access(path, os.X_OK) else None


def http_get(url):
    """(status, body) of a GET; (0, reason) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def read(path):
    with open(path) as f:
        return f.read()


def json_stream(text):
    """The JSON values written one after another in TEXT (kubectl -o json of several objects)."""
    decoder = json.JSONDecoder()
    out, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        value, i = decoder.raw_decode(text, i)
        out.append(value)


class Helm:
    """The pinned helm, with its own config, cache and data directories."""

    def __init__(self, tools):
        self.path = os.path.join(tools, "helm")
        self.home = tempfile.mkdtemp(prefix="vf-helm-")
        self.env = dict(os.environ)
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            self.env[var] = os.path.join(self.home, var.lower())
        self.env["KUBECONFIG"] = os.devnull
        self.env["PATH"] = tools + os.pathsep + self.env.get("PATH", "")

    def __call__(self, *args, kubeconfig=None, check=False, timeout=180):
        env = dict(self.env)
        if kubeconfig:
            env["KUBECONFIG"] = kubeconfig
        proc = subprocess.run(
            [self.path, *args], capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                "helm %s failed (exit %d):\n%s%s"
                % (" ".join(args), proc.returncode, proc.stdout, proc.stderr)
            )
        return proc

    def close(self):
        shutil.rmtree(self.home, ignore_errors=True)


class ChartFilesTest(unittest.TestCase):
    """The chart, its dashboard and the Dockerfiles, with helm but no cluster."""

    @classmethod
    def setUpClass(cls):
        cls.tools = bin_dir()
        cls.helm = Helm(cls.tools)

    @classmethod
    def tearDownClass(cls):
        cls.helm.close()

    def template(self, *args, check=True, release=RELEASE, namespace=NS):
        return self.helm("template", release, CHART, "-n", namespace, *args, check=check)

    def objects(self, *args, release=RELEASE, namespace=NS):
        """The objects `helm template` renders, as JSON (kubectl reads the YAML offline)."""
        manifest = self.template(*args, release=release, namespace=namespace).stdout
        proc = subprocess.run(
            [
                os.path.join(self.tools, "kubectl"),
                "annotate",
                "--local",
                "-f",
                "-",
                "vf-test-unused-",
                "-o",
                "json",
            ],
            input=manifest,
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, KUBECONFIG=os.devnull),
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        objs = json_stream(proc.stdout)
        self.assertEqual(len(objs), manifest.count("\n# Source: "), "objects lost in parsing")
        return objs

    @staticmethod
    def find(objs, kind, name=None):
        found = [
            o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
        ]
        return found[0] if len(found) == 1 else found

    # ------------------------------------------------------------------ chart metadata

    def test_chart_metadata(self):
        text = read(os.path.join(CHART, "Chart.yaml"))
        self.assertRegex(text, r"(?m)^apiVersion: v2$")
        self.assertRegex(text, r"(?m)^name: virtualflow$")
        self.assertRegex(text, r'(?m)^appVersion: "?%s"?$' % re.escape(APP_VERSION))
        self.assertIn(
            "http://json-schema.org/draft-07/schema#",
            json.loads(read(os.path.join(CHART, "values.schema.json")))["$schema"],
        )

    # ------------------------------------------------------------------ notes

    def notes(self, *args):
        """NOTES.txt as helm renders it with these values. `helm template` prints no notes and
        `helm install --dry-run` needs a cluster, so a copy of the chart renders the notes' text
        with tpl into a ConfigMap, the same engine and values."""
        with tempfile.TemporaryDirectory(prefix="vf-notes-") as tmp:
            chart = shutil.copytree(CHART, os.path.join(tmp, "virtualflow"))
            shutil.copy(
                os.path.join(chart, "templates", "NOTES.txt"),
                os.path.join(chart, "files", "notes-under-test.txt"),
            )
            with open(os.path.join(chart, "templates", "notes-under-test.yaml"), "w") as f:
                f.write(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
                    '  notes: {{ tpl (.Files.Get "files/notes-under-test.txt") . | toJson }}\n'
                )
            out = self.helm(
                "template", RELEASE, chart, "-n", NS,
                "--show-only", "templates/notes-under-test.yaml", *args, check=True,
            ).stdout  # fmt: skip
        line = [x for x in out.splitlines() if x.startswith("  notes: ")]
        self.assertEqual(len(line), 1, out)
        return json.loads(line[0][len("  notes: ") :])

    def test_notes_need_nothing_but_the_chart(self):
        """Every command the notes print works for a user who installed the chart from a chart
        repository: no path into the source repository (examples/, crds/, docs/), and the job
        they apply inline is the repository's example job (less its policy and image), in the
        namespace the operator watches."""
        value_sets = {
            "defaults": (),
            "one namespace": ("--set", "watchNamespace=team-b"),
            "no CRD": ("--set", "crds.install=false"),
            "one replica": (
                "--set", "replicaCount=1", "--set", "leaderElection.enabled=false",
                "--set", "podDisruptionBudget.enabled=false",
            ),
            "kueue and monitors": (
                "--set", "kueue.required=true", "--set", "serviceMonitor.enabled=true",
                "--set", "dashboards.enabled=true",
            ),
        }  # fmt: skip
        with open(EXAMPLE) as f:
            example = self.local_json(f.read())
        for name, args in value_sets.items():
            with self.subTest(values=name):
                notes = self.notes(*args)
                self.assertIsNone(re.search(r"\b(examples|crds|docs)/", notes), notes)
                self.assertNotIn("<no value>", notes)
                job_ns = "team-b" if "watchNamespace=team-b" in args else "default"
                self.assertIn("kubectl apply -n %s -f - <<'EOF'\n" % job_ns, notes)
                manifest = notes.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
                job = self.local_json(manifest)
                self.assertEqual(job["kind"], example["kind"])
                self.assertEqual(job["apiVersion"], example["apiVersion"])
                self.assertEqual(job["metadata"]["name"], example["metadata"]["name"])
                # Less the example's policy and image: the chart's --policy and agent image
                # serve the job, as the notes say.
                expected = {
                    k: v for k, v in example["spec"].items() if k not in ("elasticity", "template")
                }
                self.assertEqual(job["spec"], expected)
                queue = job["metadata"].get("labels", {}).get("kueue.x-k8s.io/queue-name")
                self.assertEqual(queue is not None, "kueue.required=true" in args)
                self.assertIn("kubectl get virtualflowjobs -n %s" % job_ns, notes)
                self.assertIn("/metrics", notes)
                self.assertEqual(
                    "crds.install=false" in args, "kubectl get crd " + CRD_NAME in notes
                )

    def local_json(self, manifest):
        """One object of YAML as JSON, parsed offline by kubectl (no YAML module here)."""
        proc = subprocess.run(
            [os.path.join(self.tools, "kubectl"), "annotate", "--local", "-f", "-",
             "vf-test-unused-", "-o", "json"],
            input=manifest, capture_output=True, text=True, timeout=60,
            env=dict(os.environ, KUBECONFIG=os.devnull),
        )  # fmt: skip
        self.assertEqual(proc.returncode, 0, proc.stderr + manifest)
        obj = json.loads(proc.stdout)
        obj["metadata"].pop("annotations", None)
        return obj

    def test_crd_in_chart_is_the_repositorys_crd(self):
        # The template renders files/virtualflowjob.yaml, a copy of the repository's CRD.
        self.assertTrue(
            filecmp.cmp(CRD_FILE, CHART_CRD_FILE, shallow=False),
            "%s differs from %s: copy it (cp %s %s)"
            % (
                os.path.relpath(CHART_CRD_FILE, SOURCE_DIR),
                os.path.relpath(CRD_FILE, SOURCE_DIR),
                os.path.relpath(CRD_FILE, SOURCE_DIR),
                os.path.relpath(CHART_CRD_FILE, SOURCE_DIR),
            ),
        )
        # No crds/ directory: Helm would install it before the template, which would then find
        # the CRD taken, and would never upgrade it.
        self.assertFalse(os.path.exists(os.path.join(CHART, "crds")))
        # What is rendered is that CRD, field for field, with the chart's labels and the keep
        # policy added.
        proc = subprocess.run(
            [os.path.join(self.tools, "kubectl"), "annotate", "--local", "-f", CRD_FILE]
            + ["vf-test-unused-", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, KUBECONFIG=os.devnull),
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        repository = json.loads(proc.stdout)
        rendered = self.find(self.objects(), "CustomResourceDefinition", CRD_NAME)
        labels = rendered["metadata"].pop("labels")
        self.assertEqual(labels["app.kubernetes.io/component"], "crd")
        self.assertEqual(
            rendered["metadata"].pop("annotations"), {"helm.sh/resource-policy": "keep"}
        )
        self.assertFalse(repository["metadata"].pop("labels", None))
        self.assertFalse(repository["metadata"].pop("annotations", None))
        self.assertEqual(rendered, repository)
        # Off: no CRD at all (a second release in the cluster, or CRDs applied separately).
        self.assertEqual(
            self.find(self.objects("--set", "crds.install=false"), "CustomResourceDefinition"), []
        )

    def test_every_value_is_documented_and_in_the_schema(self):
        schema = json.loads(read(os.path.join(CHART, "values.schema.json")))
        values = read(os.path.join(CHART, "values.yaml"))
        top = re.findall(r"(?m)^([A-Za-z]\w*):", values)
        self.assertEqual(sorted(set(top)), sorted(set(schema["properties"]) - {"global"}))
        self.assertFalse(schema["additionalProperties"])
        # Each top-level key has a comment above it or above its block's first key.
        lines = values.splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"([A-Za-z]\w*):", line)
            if m:
                above = lines[i - 1] if i else ""
                below = lines[i + 1] if i + 1 < len(lines) else ""
                self.assertTrue(
                    above.startswith("#") or below.strip().startswith("#"),
                    "values.yaml: %s has no comment" % m.group(1),
                )

    # ------------------------------------------------------------------ lint and render

    def test_lint_strict(self):
        for name, args in VALUE_SETS:
            with self.subTest(name):
                proc = self.helm("lint", "--strict", CHART, "-n", NS, *args)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertIn("1 chart(s) linted, 0 chart(s) failed", proc.stdout)
                self.assertNotIn("[WARNING]", proc.stdout)
                self.assertNotIn("[ERROR]", proc.stdout)

    def test_every_rendered_object_has_the_recommended_labels(self):
        for name, args in VALUE_SETS:
            with self.subTest(name):
                objs = self.objects(*args)
                self.assertTrue(objs)
                for obj in objs:
                    where = "%s %s" % (obj["kind"], obj["metadata"]["name"])
                    labels = obj["metadata"].get("labels") or {}
                    for key in RECOMMENDED_LABELS:
                        self.assertIn(key, labels, where)
                    self.assertEqual(labels["app.kubernetes.io/name"], "virtualflow", where)
                    self.assertEqual(labels["app.kubernetes.io/instance"], RELEASE, where)
                    self.assertEqual(labels["app.kubernetes.io/version"], APP_VERSION, where)
                    self.assertEqual(labels["app.kubernetes.io/part-of"], "virtualflow", where)
                    self.assertEqual(labels["app.kubernetes.io/managed-by"], "Helm", where)
                    self.assertEqual(labels["helm.sh/chart"], "virtualflow-" + APP_VERSION, where)
                    if obj["kind"] == "Deployment":
                        pod_labels = obj["spec"]["template"]["metadata"]["labels"]
                        for key in RECOMMENDED_LABELS:
                            self.assertIn(key, pod_labels, where + " pod template")
                        selector = obj["spec"]["selector"]["matchLabels"]
                        self.assertLessEqual(selector.items(), pod_labels.items())
                        self.assertNotIn("app.kubernetes.io/version", selector)
                    namespaced = obj["kind"] not in (
                        "ClusterRole",
                        "ClusterRoleBinding",
                        "CustomResourceDefinition",
                    )
                    self.assertEqual("namespace" in obj["metadata"], namespaced, where)

    def test_objects_per_value_set(self):
        def kinds(objs):
            return sorted(o["kind"] for o in objs)

        defaults = [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Role",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
        self.assertEqual(kinds(self.objects()), defaults)
        self.assertEqual(
            kinds(self.objects(*dict(VALUE_SETS)["everything-on"])),
            sorted(defaults + ["ConfigMap", "PodMonitor", "ServiceMonitor"]),
        )
        # The operator's Secrets' Role and the leader label's stay; the Lease's goes, and so
        # does the disruption budget (one pod).
        self.assertEqual(
            kinds(self.objects(*dict(VALUE_SETS)["single-replica"])),
            [
                "ClusterRole",
                "ClusterRoleBinding",
                "CustomResourceDefinition",
                "Deployment",
                "NetworkPolicy",
                "Role",
                "Role",
                "RoleBinding",
                "RoleBinding",
                "Service",
                "ServiceAccount",
            ],
        )
        self.assertEqual(
            kinds(self.objects(*dict(VALUE_SETS)["own-account"])),
            [
                "CustomResourceDefinition",
                "Deployment",
                "NetworkPolicy",
                "PodDisruptionBudget",
                "Service",
            ],
        )
        # The job key's Role stays without TLS.
        self.assertEqual(
            kinds(self.objects(*dict(VALUE_SETS)["plain"])),
            [k for k in defaults if k != "NetworkPolicy"],
        )
        self.assertEqual(
            kinds(
                self.objects(
                    "--set", "crds.install=false", "--set", "podDisruptionBudget.enabled=false"
                )
            ),
            [k for k in defaults if k not in ("CustomResourceDefinition", "PodDisruptionBudget")],
        )

    def test_operator_deployment(self):
        objs = self.objects()
        deployment = self.find(objs, "Deployment", OPERATOR)
        self.assertEqual(deployment["metadata"]["namespace"], NS)
        self.assertEqual(deployment["spec"]["replicas"], 2)
        # Every healthy replica is ready, so a rolling update waits for a new one before it
        # stops an old one.
        self.assertEqual(
            deployment["spec"]["strategy"],
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        )
        pod = deployment["spec"]["template"]["spec"]
        self.assertEqual(pod["serviceAccountName"], OPERATOR)
        [container] = pod["containers"]
        self.assertEqual(container["image"], "virtualflow/operator:" + APP_VERSION)
        self.assertEqual(container["imagePullPolicy"], "IfNotPresent")
        self.assertEqual(
            container["args"],
            [
                "--leader-elect=true",
                "--leader-election-namespace=" + NS,
                "--leader-election-id=virtualflow-operator",
                "--coordinator-listen=0.0.0.0:7070",
                "--coordinator-url=https://virtualflow-operator.%s.svc:7070" % NS,
                "--coordinator-tls=true",
                "--coordinator-tls-secret=virtualflow-coordinator-tls",
                # Half the default memory limit, 512Mi.
                "--coordinator-memory-budget=268435456",
                "--job-key-secret=virtualflow-job-key",
                "--http-listen=0.0.0.0:8080",
                "--agent-image=virtualflow/agent:" + APP_VERSION,
                "--agent-metrics-port=9090",
                "--policy=elastic",
                "--require-kueue-queue=false",
                "--kube-api-qps=150",
                "--kube-api-burst=300",
                "--network-policy=true",
                "--network-policy-metrics-from="
                + json.dumps(
                    [
                        {
                            "namespaceSelector": {},
                            "podSelector": {
                                "matchLabels": {"app.kubernetes.io/name": "prometheus"}
                            },
                        }
                    ],
                    separators=(",", ":"),
                    sort_keys=True,
                ),
            ],
        )
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
        self.assertEqual(env, {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"})
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        self.assertEqual(ports, {"coordinator": 7070, "metrics": 8080})
        self.assertEqual(
            container["livenessProbe"]["httpGet"], {"path": "/healthz", "port": "metrics"}
        )
        self.assertEqual(
            container["readinessProbe"]["httpGet"], {"path": "/readyz", "port": "metrics"}
        )
        sc = container["securityContext"]
        self.assertIs(sc["runAsNonRoot"], True)
        self.assertIs(sc["readOnlyRootFilesystem"], True)
        self.assertIs(sc["allowPrivilegeEscalation"], False)
        self.assertEqual(sc["capabilities"], {"drop": ["ALL"]})
        self.assertEqual(sc["seccompProfile"], {"type": "RuntimeDefault"})
        self.assertEqual(pod["securityContext"]["runAsUser"], 65532)
        self.assertIn("requests", container["resources"])
        self.assertIn("limits", container["resources"])

        service = self.find(objs, "Service", OPERATOR)
        ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
        self.assertEqual(
            ports, {"coordinator": (7070, "coordinator"), "metrics": (8080, "metrics")}
        )
        # The operator's pods, and of them the leader's alone.
        self.assertEqual(
            service["spec"]["selector"],
            dict(deployment["spec"]["selector"]["matchLabels"], **{LEADER_LABEL: "true"}),
        )
        budget = self.find(objs, "PodDisruptionBudget", OPERATOR)
        self.assertEqual(budget["metadata"]["namespace"], NS)
        self.assertEqual(
            budget["spec"],
            {"minAvailable": 1, "selector": deployment["spec"]["selector"]},
        )
        # One pod: no budget (it would block every drain of its node), and no rolling update
        # with two operators at once (no leader election to keep one of them idle).
        objs = self.objects(*dict(VALUE_SETS)["single-replica"])
        self.assertEqual(self.find(objs, "PodDisruptionBudget"), [])
        self.assertEqual(self.find(objs, "Deployment")["spec"]["strategy"], {"type": "Recreate"})
        self.assertEqual(
            self.find(self.objects("--set", "replicaCount=1"), "PodDisruptionBudget"), []
        )

    def test_operator_flags_follow_the_values(self):
        objs = self.objects(*dict(VALUE_SETS)["customised"], release="vf", namespace="ops")
        [container] = self.find(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
        self.assertEqual(container["image"], "mirror/vf/operator:0.2.0-rc1")
        self.assertEqual(container["imagePullPolicy"], "Always")
        args = container["args"]
        self.assertIn("--coordinator-url=https://vf-virtualflow-operator.ops.svc:9000", args)
        self.assertIn("--coordinator-tls-secret=vf-virtualflow-coordinator-tls", args)
        self.assertIn("--job-key-secret=vf-virtualflow-job-key", args)
        self.assertIn("--coordinator-listen=0.0.0.0:9000", args)
        self.assertIn("--http-listen=0.0.0.0:9001", args)
        self.assertIn("--agent-image=virtualflow/agent@sha256:" + "ab" * 32, args)
        self.assertIn("--policy=autoscale", args)
        self.assertIn("--agent-metrics-port=9102", args)
        self.assertIn("--kube-api-qps=40", args)
        self.assertIn("--kube-api-burst=80", args)
        self.assertIn("--leader-election-namespace=ops", args)
        self.assertEqual(self.find(objs, "Service")["metadata"]["name"], "vf-virtualflow-operator")

        objs = self.objects(*dict(VALUE_SETS)["one-namespace"])
        args = self.find(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        self.assertEqual(args[0], "--namespace=team-a")
        pod_monitor = self.find(objs, "PodMonitor")
        self.assertEqual(pod_monitor["spec"]["namespaceSelector"], {"matchNames": ["team-a"]})

        objs = self.objects(*dict(VALUE_SETS)["plain"])
        args = self.find(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        self.assertIn("--coordinator-url=http://virtualflow-operator.%s.svc:7070" % NS, args)
        self.assertIn("--coordinator-tls=false", args)
        self.assertFalse([a for a in args if a.startswith("--coordinator-tls-secret")])
        self.assertIn("--job-key-secret=virtualflow-job-key", args)  # with or without TLS
        # No NetworkPolicies: none per job either.
        self.assertIn("--network-policy=false", args)
        self.assertFalse([a for a in args if a.startswith("--network-policy-metrics-from")])
        args = self.find(self.objects("--set", "networkPolicy.perJob=false"), "Deployment")["spec"][
            "template"
        ]["spec"]["containers"][0]["args"]
        self.assertIn("--network-policy=false", args)

        # The coordinator's memory budget: half the memory limit, or as given, or (no limit) the
        # operator's own rule.
        def budget_args(*values):
            container = self.find(self.objects(*values), "Deployment")["spec"]["template"]["spec"][
                "containers"
            ][0]
            return [a for a in container["args"] if a.startswith("--coordinator-memory-budget")]

        self.assertEqual(
            budget_args("--set", "resources.limits.memory=3Gi"),
            ["--coordinator-memory-budget=1610612736"],
        )
        self.assertEqual(
            budget_args("--set", "resources.limits.memory=1000M"),
            ["--coordinator-memory-budget=500000000"],
        )
        self.assertEqual(
            budget_args("--set", "coordinator.memoryBudget=300Mi"),
            ["--coordinator-memory-budget=300Mi"],
        )
        self.assertEqual(budget_args("--set", "resources.limits=null"), [])

        objs = self.objects(*dict(VALUE_SETS)["single-replica"])
        args = self.find(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        self.assertIn("--leader-elect=false", args)
        self.assertFalse([a for a in args if a.startswith("--leader-election-")])

    def test_monitors_and_dashboard_objects(self):
        objs = self.objects(*dict(VALUE_SETS)["everything-on"])
        monitor = self.find(objs, "ServiceMonitor")
        self.assertEqual(monitor["apiVersion"], "monitoring.coreos.com/v1")
        self.assertEqual(monitor["metadata"]["labels"]["release"], "prometheus")
        self.assertTrue(
            selects(monitor["spec"]["selector"], self.find(objs, "Service")["metadata"]["labels"])
        )
        [endpoint] = monitor["spec"]["endpoints"]
        self.assertEqual(
            (endpoint["port"], endpoint["path"], endpoint["interval"]),
            ("metrics", "/metrics", "30s"),
        )
        # Prometheus' defaults: the metrics' job_namespace/job_name collide with no target label.
        self.assertNotIn("honorLabels", endpoint)
        pods = self.find(objs, "PodMonitor")
        self.assertEqual(pods["apiVersion"], "monitoring.coreos.com/v1")
        self.assertEqual(
            pods["spec"]["selector"],
            {"matchLabels": {"app.kubernetes.io/managed-by": "virtualflow-operator"}},
        )
        self.assertEqual(pods["spec"]["namespaceSelector"], {"any": True})
        [endpoint] = pods["spec"]["podMetricsEndpoints"]
        self.assertEqual(endpoint["port"], "metrics")
        self.assertNotIn("honorLabels", endpoint)

        config_map = self.find(objs, "ConfigMap")
        self.assertEqual(config_map["metadata"]["labels"]["grafana_dashboard"], "1")
        self.assertEqual(config_map["metadata"]["annotations"], {"grafana_folder": "VirtualFlow"})
        self.assertEqual(config_map["data"]["virtualflow.json"].strip(), read(DASHBOARD).strip())

        objs = self.objects(
            "--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.workers=false"
        )
        self.assertEqual(
            [o["kind"] for o in objs if "monitoring" in o["apiVersion"]], ["ServiceMonitor"]
        )

    def test_network_policies_follow_the_values_and_the_operators_labels(self):
        # The labels the operator puts on every worker pod, as its source says
        # (operator/controller/worker_pod.h); the install test checks real pods too.
        header = read(os.path.join(SOURCE_DIR, "operator", "controller", "worker_pod.h"))

        def constant(name):
            return re.search(r'inline constexpr char %s\[\] = "([^"]+)";' % name, header).group(1)

        worker = {
            constant("kJobLabel"): "mnist",
            constant("kManagedByLabel"): constant("kManagedBy"),
        }

        policy = self.find(self.objects(), "NetworkPolicy")  # one: no job namespace is known
        self.assertEqual(policy["metadata"]["namespace"], NS)
        rule = policy["spec"]["ingress"][0]
        self.assertEqual(rule["ports"], [{"port": "coordinator", "protocol": "TCP"}])
        self.assertTrue(selects(rule["from"][0]["podSelector"], worker))
        self.assertFalse(selects(rule["from"][0]["podSelector"], {constant("kJobLabel"): "x"}))

        objs = self.objects(*dict(VALUE_SETS)["one-namespace"], "--set", "agent.metricsPort=9102")
        policies = {
            (p["metadata"]["namespace"], p["metadata"]["name"]): p
            for p in self.find(objs, "NetworkPolicy")
        }
        self.assertEqual(set(policies), {(NS, OPERATOR), ("team-a", OPERATOR + "-workers")})
        peer = policies[(NS, OPERATOR)]["spec"]["ingress"][0]["from"][0]
        self.assertEqual(
            peer["namespaceSelector"], {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}
        )
        # The namespace's base isolates every worker pod and admits only the scrapers, on the
        # metrics port: each job's own policy, which the operator makes, admits the job's pods.
        workers = policies[("team-a", OPERATOR + "-workers")]["spec"]
        self.assertTrue(selects(workers["podSelector"], worker))
        [metrics_rule] = workers["ingress"]
        self.assertEqual(metrics_rule["ports"], [{"port": 9102, "protocol": "TCP"}])
        self.assertFalse(selects(metrics_rule["from"][0]["podSelector"], worker))
        # Without policies per job, the base admits the namespace's worker pods on every port.
        objs = self.objects(
            *dict(VALUE_SETS)["one-namespace"], "--set", "networkPolicy.perJob=false"
        )
        workers = [
            p for p in self.find(objs, "NetworkPolicy") if p["metadata"]["namespace"] == "team-a"
        ][0]["spec"]
        self.assertEqual(len(workers["ingress"]), 2)
        self.assertNotIn("ports", workers["ingress"][0])
        self.assertTrue(selects(workers["ingress"][0]["from"][0]["podSelector"], worker))
        self.assertEqual(workers["ingress"][1]["ports"], [{"port": 9090, "protocol": "TCP"}])
        # Nor the rights to make them.
        rules = self.find(objs, "Role")
        self.assertFalse(
            [r for role in rules for r in role["rules"] if "networkpolicies" in r["resources"]]
        )

        objs = self.objects("--set", "networkPolicy.jobNamespaces={a,b}")
        self.assertEqual(
            sorted(p["metadata"]["namespace"] for p in self.find(objs, "NetworkPolicy")),
            ["a", "b", NS],
        )
        self.assertEqual(
            self.find(self.objects("--set", "networkPolicy.enabled=false"), "NetworkPolicy"), []
        )

    def test_rbac_rules_are_exactly_the_operators_needs(self):
        def rights(rules):
            out = set()
            for r in rules:
                for group in r["apiGroups"]:
                    for resource in r["resources"]:
                        for verb in r["verbs"]:
                            out.add((group, resource, verb, tuple(r.get("resourceNames", []))))
            return out

        def expected(entries):
            out = set()
            for verb, resource, sub in entries:
                name, _, group = resource.partition(".")
                out.add((group, name + ("/" + sub if sub else ""), verb, ()))
            return out

        jobs, nodes = expected(JOB_RIGHTS), expected(NODE_RIGHTS)
        lease = {
            ("coordination.k8s.io", "leases", "create", ()),
            ("coordination.k8s.io", "leases", "get", ("virtualflow-operator",)),
            ("coordination.k8s.io", "leases", "update", ("virtualflow-operator",)),
        }
        own = {
            ("", "secrets", "create", ()),
            ("", "secrets", "get", ("virtualflow-job-key",)),
            ("", "secrets", "get", ("virtualflow-coordinator-tls",)),
            ("", "secrets", "update", ("virtualflow-coordinator-tls",)),
        }

        # The leader label on its own pod: patch, of pods in the release namespace only.
        label = {("", "pods", "patch", ())}

        objs = self.objects()
        self.assertEqual(rights(self.find(objs, "ClusterRole")["rules"]), jobs | nodes)
        roles = {r["metadata"]["name"]: r for r in self.find(objs, "Role")}
        self.assertEqual({r["metadata"]["namespace"] for r in roles.values()}, {NS})
        self.assertEqual(rights(roles[OPERATOR + "-leader-election"]["rules"]), lease)
        self.assertEqual(rights(roles[OPERATOR + "-secrets"]["rules"]), own)
        self.assertEqual(rights(roles[OPERATOR + "-leader-label"]["rules"]), label)
        for binding in [self.find(objs, "ClusterRoleBinding")] + self.find(objs, "RoleBinding"):
            self.assertEqual(
                binding["subjects"], [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NS}]
            )

        objs = self.objects(*dict(VALUE_SETS)["one-namespace"])
        self.assertEqual(
            rights(self.find(objs, "ClusterRole")["rules"]), expected(INVENTORY_RIGHTS)
        )
        roles = {}
        for r in self.find(objs, "Role"):
            roles.setdefault(r["metadata"]["namespace"], set()).update(rights(r["rules"]))
        self.assertEqual(roles, {"team-a": jobs, NS: lease | own | label})
        # Without TLS, only the job key.
        roles = {
            r["metadata"]["name"]: r
            for r in self.find(self.objects("--set", "coordinator.tls.enabled=false"), "Role")
        }
        self.assertEqual(
            rights(roles[OPERATOR + "-secrets"]["rules"]),
            {("", "secrets", "create", ()), ("", "secrets", "get", ("virtualflow-job-key",))},
        )

    def test_bad_values_fail_with_a_message_naming_the_value(self):
        for name, args, expected in BAD_VALUES:
            with self.subTest(name):
                proc = self.template(*args, check=False)
                self.assertNotEqual(proc.returncode, 0, "rendered with %s" % " ".join(args))
                self.assertNotIn("kind: Deployment", proc.stdout)
                for s in expected:
                    self.assertIn(s, proc.stderr)

    # ------------------------------------------------------------------ dashboard

    def test_dashboard_queries_only_exported_metrics(self):
        dashboard = json.loads(read(DASHBOARD))
        self.assertEqual(dashboard["uid"], "virtualflow")
        queries = dashboard_queries(dashboard)
        self.assertGreaterEqual(len(queries), 10)
        used = set()
        for where, expr in queries:
            with self.subTest(where, expr=expr):
                names = metric_names(expr)
                self.assertTrue(names, "no metric found in %s" % expr)
                unknown = {n for n in names if n not in KNOWN_METRICS and not n.startswith("DCGM_")}
                self.assertEqual(unknown, set(), "not a VirtualFlow or DCGM metric")
                self.assertEqual(expr.count("("), expr.count(")"))
                self.assertEqual(expr.count("{"), expr.count("}"))
                used |= names
        # The panels the dashboard is for.
        for name in (
            "vf_operator_job_step",
            "vf_operator_job_workers",
            "vf_operator_resizes_total",
            "vf_operator_job_samples_per_second",
            "vf_agent_loss",
            "vf_operator_resize_pause_seconds_bucket",
            "vf_operator_gpus",
            "DCGM_FI_DEV_GPU_UTIL",
        ):
            self.assertIn(name, used)
        annotations = [a for a in dashboard["annotations"]["list"] if a.get("expr")]
        self.assertTrue(any("vf_operator_resizes_total" in a["expr"] for a in annotations))
        # GPU utilisation is joined with the workers by pod.
        dcgm = [e for _, e in queries if "DCGM_FI_DEV_GPU_UTIL" in e]
        self.assertTrue(all(re.search(r"on \(namespace, pod\)", e) for e in dcgm), dcgm)
        ids = [p["id"] for p in dashboard["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids repeat")

    def test_metric_name_extraction(self):
        self.assertEqual(
            metric_names(
                "histogram_quantile(0.95, sum by (le, job) "
                "(rate(vf_agent_step_duration_seconds_bucket"
                '{job_namespace=~"$namespace", job_name=~"$job"}[$__rate_interval])))'
            ),
            {"vf_agent_step_duration_seconds_bucket"},
        )
        self.assertEqual(
            metric_names(
                "avg by (pod) (DCGM_FI_DEV_GPU_UTIL * on (namespace, pod) group_left (job_name) "
                'count by (namespace, pod, job_name) (vf_agent_steps_total{job_name="a b"}))'
            ),
            {"DCGM_FI_DEV_GPU_UTIL", "vf_agent_steps_total"},
        )
        self.assertEqual(metric_names("up + node_load1 offset 5m"), {"up", "node_load1"})


# Stand-ins for the Prometheus Operator's CRDs (not part of this project), so that the chart's
# ServiceMonitor and PodMonitor can be installed; they check group, version, kind and scope only.
MONITOR_CRDS = "".join(
    """---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %(plural)s.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: %(kind)s, listKind: %(kind)sList, plural: %(plural)s, singular: %(singular)s}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"""
    % {"kind": kind, "plural": kind.lower() + "s", "singular": kind.lower()}
    for kind in ("ServiceMonitor", "PodMonitor")
)


class OperatorProcesses:
    """For test cases with a control plane (self.cp): the built operator run as the chart's pods
    would run it, and checks on those processes."""

    def setUp(self):
        super().setUp()
        self.operators = {}  # operator processes this test started: pod name -> (process, URL)
        self.stopped = set()  # those it stopped on purpose

    def start_operator(self, namespace, deployment, pod, pod_spec=None):
        """Starts the built operator as pod POD of DEPLOYMENT would run: the Deployment's
        arguments (or those of POD_SPEC, a real pod's), listening on free loopback ports
        instead, POD_NAME and POD_NAMESPACE, and a token of the ServiceAccount (in a
        kubeconfig, for the token a kubelet would mount). Returns (process, base URL of its
        HTTP endpoint); stopped at the test's end."""
        if pod_spec is None:
            obj = self.cp.get(
                "/apis/apps/v1/namespaces/%s/deployments/%s" % (namespace, deployment)
            )
            pod_spec = obj["spec"]["template"]["spec"]
        container = pod_spec["containers"][0]
        self.assertEqual({e["name"] for e in container["env"]}, {"POD_NAME", "POD_NAMESPACE"})
        kubeconfig = os.path.join(self.cp.dir, pod + ".kubeconfig")
        token = self.cp.token(pod_spec["serviceAccountName"], namespace)
        with open(kubeconfig, "w") as f:
            json.dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "e2e",
                            "cluster": {
                                "server": self.cp.server,
                                "certificate-authority": self.cp.ca_file,
                            },
                        }
                    ],
                    "users": [{"name": "sa", "user": {"token": token}}],
                    "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "sa"}}],
                    "current-context": "e2e",
                },
                f,
            )
        http, coordinator = free_port(), free_port()
        args = [
            a.replace("0.0.0.0:8080", "127.0.0.1:%d" % http).replace(
                "0.0.0.0:7070", "127.0.0.1:%d" % coordinator
            )
            for a in container["args"]
        ]
        log = open(os.path.join(self.cp.logs, pod + ".log"), "wb")
        proc = subprocess.Popen(
            [operator_binary(), "--kubeconfig", kubeconfig, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            env=dict(os.environ, POD_NAME=pod, POD_NAMESPACE=namespace),
        )

        def stop():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()

        self.addCleanup(stop)
        self.operators[pod] = (proc, "http://127.0.0.1:%d" % http)
        return proc, "http://127.0.0.1:%d" % http

    def operator_log(self, pod):
        try:
            with open(os.path.join(self.cp.logs, pod + ".log"), errors="replace") as f:
                return f.read()[-3000:]
        except OSError as e:
            return "(no log: %s)" % e

    def check_operators(self):
        """Fails at once when a started operator died or was refused a request by RBAC."""
        for pod, (proc, url) in self.operators.items():
            if pod in self.stopped:
                continue
            self.assertIsNone(proc.poll(), "%s exited:\n%s" % (pod, self.operator_log(pod)))
            metrics = http_get(url + "/metrics")[1]
            self.assertFalse(
                'code="403"' in metrics,
                "%s was forbidden a request:\n%s" % (pod, self.operator_log(pod)),
            )

    def until(self, what, predicate, timeout=60):
        """Polls PREDICATE until it is truthy (returned), checking the operators meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_operators()
            self.cp.check_alive()
            value = predicate()
            if value:
                return value
            self.assertLess(time.monotonic(), deadline, "timed out waiting for " + what)
            time.sleep(0.25)


class ChartInstallTest(OperatorProcesses, ControlPlaneTestCase):
    """helm install into a real control plane, and the installed operator's permissions."""

    @classmethod
    def setUpClass(cls):
        # Other suites start control planes on this machine too: a start that fails for want of
        # a port or under load is tried again.
        for attempt in range(3):
            try:
                cls.cp = ControlPlane().start()
                break
            except (RuntimeError, TimeoutError, OSError):
                if attempt == 2:
                    raise
                time.sleep(5)
        cls.helm = Helm(cls.cp.bin)
        # kubectl's discovery cache of this server only: a cache left by an earlier control
        # plane on the same port would not know the CRDs.
        cls.cache = os.path.join(cls.cp.dir, "kubectl-cache")
        # Kueue's API, so that the operator's rights on Workloads (and the absence of others)
        # are asked about resources the server knows.
        cls.cp.install_kueue_crds(
            (
                "workloads",
                "clusterqueues",
                "localqueues",
                "workloadpriorityclasses",
                "resourceflavors",
            )
        )
        cls.run_kubectl("apply", "-f", "-", input=MONITOR_CRDS, check=True)
        cls.run_kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/podmonitors.monitoring.coreos.com",
            check=True,
        )
        for ns in (NS, "team-a", "team-b", "vf-team-system"):
            cls.cp.create_namespace(ns)
        # The operator's pods must pass the strictest Pod Security Standard.
        for ns in (NS, "vf-team-system"):
            cls.run_kubectl(
                "label",
                "namespace",
                ns,
                "pod-security.kubernetes.io/enforce=restricted",
                check=True,
            )
        cls.install = cls.helm(
            "install",
            RELEASE,
            CHART,
            "-n",
            NS,
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "dashboards.enabled=true",
            "--set",
            "networkPolicy.jobNamespaces={team-b}",
            kubeconfig=cls.cp.kubeconfig,
        )

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "helm", None):
            cls.helm.close()
        super().tearDownClass()

    @classmethod
    def run_kubectl(cls, *args, input=None, check=False):
        return cls.cp.kubectl("--cache-dir", cls.cache, *args, input=input, check=check)

    def kubectl(self, *args, input=None, check=False):
        return self.run_kubectl(*args, input=input, check=check)

    def run_helm(self, *args, check=True):
        return self.helm(*args, kubeconfig=self.cp.kubeconfig, check=check)

    def can_i(
        self, verb, resource, subresource="", namespace=NS, name=None, account=(NS, OPERATOR)
    ):
        args = ["auth", "can-i", verb, resource + ("/" + name if name else "")]
        args += ["-n", namespace, "--as=system:serviceaccount:%s:%s" % account]
        if subresource:
            args.append("--subresource=" + subresource)
        proc = self.kubectl(*args)
        answer = proc.stdout.strip()
        self.assertIn(answer, ("yes", "no"), proc.stderr)
        return answer == "yes"

    def rights_list(self, namespace, account=(NS, OPERATOR)):
        """`kubectl auth can-i --list` for ACCOUNT in NAMESPACE, less what everyone may do, as
        {(resource, resource names): verbs}."""
        out = self.kubectl(
            "auth",
            "can-i",
            "--list",
            "-n",
            namespace,
            "--as=system:serviceaccount:%s:%s" % account,
            check=True,
        ).stdout
        rights = {}
        for line in out.splitlines()[1:]:
            m = re.match(r"(\S+)\s+\[\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$", line)
            if not m or m.group(1) in EVERYONE:
                continue
            key = (m.group(1), tuple(m.group(2).split()))
            rights.setdefault(key, set()).update(m.group(3).split())
        return rights

    @staticmethod
    def expected_list(entries):
        out = {}
        for verb, resource, sub in entries:
            out.setdefault((resource + ("/" + sub if sub else ""), ()), set()).add(verb)
        return out

    # ------------------------------------------------------------------ install

    def test_install_creates_every_object(self):
        self.assertEqual(self.install.returncode, 0, self.install.stdout + self.install.stderr)
        self.assertIn("STATUS: deployed", self.install.stdout)
        self.assertNotIn("PodSecurity", self.install.stderr)  # helm shows admission warnings
        self.assertIn("https://virtualflow-operator.%s.svc:7070" % NS, self.install.stdout)  # NOTES
        crd = self.cp.get(CRD_PATH)
        self.assertIsNotNone(crd, "the chart's CRD was not installed")
        # Part of the release, and kept when it is uninstalled.
        self.assertEqual(crd["metadata"]["annotations"]["meta.helm.sh/release-name"], RELEASE)
        self.assertEqual(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep")
        self.cp.wait_for(
            "the CRD to be Established",
            lambda: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (
                    self.cp.get(
                        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + CRD_NAME
                    )["status"].get("conditions")
                    or []
                )
            ),
        )

        # Every object of the release's manifest exists, as Helm rendered it.
        manifest = self.run_helm("get", "manifest", RELEASE, "-n", NS).stdout
        objs = json_stream(
            self.kubectl("get", "-f", "-", "-o", "json", input=manifest, check=True).stdout
        )
        objs = objs[0]["items"] if objs and objs[0]["kind"] == "List" else objs
        self.assertEqual(
            sorted(o["kind"] for o in objs),
            [
                "ClusterRole",
                "ClusterRoleBinding",
                "ConfigMap",
                "CustomResourceDefinition",
                "Deployment",
                "NetworkPolicy",
                "NetworkPolicy",
                "PodDisruptionBudget",
                "PodMonitor",
                "Role",
                "Role",
                "Role",
                "RoleBinding",
                "RoleBinding",
                "RoleBinding",
                "Service",
                "ServiceAccount",
                "ServiceMonitor",
            ],
        )
        for obj in objs:
            self.assertEqual(obj["metadata"]["labels"]["app.kubernetes.io/instance"], RELEASE)
            self.assertEqual(obj["metadata"]["annotations"]["meta.helm.sh/release-name"], RELEASE)

        service = self.cp.get("/api/v1/namespaces/%s/services/%s" % (NS, OPERATOR))
        self.assertTrue(service["spec"]["clusterIP"])
        self.assertEqual(
            sorted(p["name"] for p in service["spec"]["ports"]), ["coordinator", "metrics"]
        )

        # The Deployment controller creates the operator's pods, so the API server (and the
        # `restricted` Pod Security admission) accepted the pod template. No kubelet runs them.
        selector = "app.kubernetes.io/instance=%s,app.kubernetes.io/component=operator" % RELEASE
        pods = self.cp.wait_for(
            "the operator's 2 pods",
            lambda: (lambda items: len(items) == 2 and items)(
                self.cp.request(
                    "GET", "/api/v1/namespaces/%s/pods?labelSelector=%s" % (NS, selector)
                )["items"]
            ),
        )
        for pod in pods:
            spec = pod["spec"]
            self.assertEqual(spec["serviceAccountName"], OPERATOR)
            container = spec["containers"][0]
            self.assertIn(
                "--coordinator-url=https://virtualflow-operator.%s.svc:7070" % NS, container["args"]
            )
            self.assertEqual(container["securityContext"]["capabilities"], {"drop": ["ALL"]})
        deployment = self.cp.get("/apis/apps/v1/namespaces/%s/deployments/%s" % (NS, OPERATOR))
        failures = [
            c for c in deployment["status"].get("conditions") or [] if c["type"] == "ReplicaFailure"
        ]
        self.assertEqual(failures, [])

    # ------------------------------------------------------------------ the real operator

    def run_job(self, namespace):
        """Applies the example job to NAMESPACE and waits for the operator to create its worker
        pods (returned) and write its status."""
        self.kubectl("apply", "-n", namespace, "-f", EXAMPLE, check=True)
        self.addCleanup(
            self.kubectl, "delete", "vfjob", "fashion-mnist", "-n", namespace, "--wait=false"
        )
        pods = self.until(
            "the job's worker pods",
            lambda: self.cp.request(
                "GET",
                "/api/v1/namespaces/%s/pods?labelSelector=app.kubernetes.io%%2F"
                "managed-by%%3Dvirtualflow-operator" % namespace,
            )["items"],
        )
        self.until(
            "the job's status",
            lambda: (
                self.cp.get(
                    "/apis/virtualflow.io/v1alpha1/namespaces/%s/virtualflowjobs/fashion-mnist"
                    % namespace
                )
                .get("status", {})
                .get("phase")
            ),
        )
        return pods

    def test_operator_runs_with_the_charts_flags_and_rights(self):
        """The real operator, run as the Deployment would run it, elects a leader, every replica
        becomes ready, and the leader runs a job without one forbidden request; a standby takes
        over when the leader stops. (These processes pose as pods that do not exist, so the
        leader label has no pod to go on: ChartUpgradeTest runs the Deployment's real pods.)"""
        if operator_binary() is None:
            self.skipTest("virtualflow-operator is not built (set VF_BIN_DIR)")
        self.assertEqual(self.install.returncode, 0, self.install.stderr)
        self.cp.add_gpu_node("chart-gpu-1", gpus=4)
        for pod in ("virtualflow-operator-a", "virtualflow-operator-b"):
            self.start_operator(NS, OPERATOR, pod)

        def leader():
            lease = self.cp.get(
                "/apis/coordination.k8s.io/v1/namespaces/%s/leases/virtualflow-operator" % NS
            )
            holder = (lease or {}).get("spec", {}).get("holderIdentity")
            codes = {
                pod: http_get(url + "/readyz")[0]
                for pod, (_, url) in self.operators.items()
                if pod not in self.stopped
            }
            # Every replica is ready (a standby is still starting until it is: it reads the TLS
            # Secret first), the leader once its caches have synced.
            ready = all(code == 200 for code in codes.values())
            return holder if ready and holder in codes else None

        first = self.until("one ready leader", leader)
        [standby] = [p for p in self.operators if p != first]
        standby_url = self.operators[standby][1]
        # A standby is ready: it can take over.
        status, body = http_get(standby_url + "/readyz")
        self.assertEqual(status, 200, body)
        self.assertEqual(http_get(standby_url + "/healthz")[0], 200)
        self.assertIn("vf_operator_is_leader 0", http_get(standby_url + "/metrics")[1])
        self.assertIn("vf_operator_is_leader 1", http_get(self.operators[first][1] + "/metrics")[1])

        # A job: the leader creates its NetworkPolicy, worker pods and their credential Secrets
        # and writes its status.
        pods = self.run_job("team-b")
        container = pods[0]["spec"]["containers"][0]
        self.assertIs(pods[0]["spec"]["automountServiceAccountToken"], False)
        self.assertEqual(container["image"], "virtualflow/agent:" + APP_VERSION)
        self.assertIn(
            {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}, container["ports"]
        )
        self.check_coordinator_tls(pods)
        self.check_network_policies(pods, "team-b")
        # The job's secret is derived from the key in the operator's namespace: nothing of the
        # job's holds it.
        key = self.cp.get("/api/v1/namespaces/%s/secrets/virtualflow-job-key" % NS)
        self.assertIsNotNone(key, "no job key Secret")
        self.assertEqual(sorted(key["data"]), ["key"])
        self.assertIsNone(self.cp.get("/api/v1/namespaces/team-b/secrets/fashion-mnist-vf-token"))

        # The leader stops (a rolling update, a drained node): it gives the Lease up and the
        # standby leads.
        proc = self.operators[first][0]
        proc.terminate()
        self.assertEqual(proc.wait(30), 0, self.operator_log(first))
        self.stopped.add(first)
        self.assertEqual(self.until("the standby to lead", leader), standby)
        self.check_operators()
        for pod in self.operators:
            self.assertNotIn("forbidden", self.operator_log(pod).lower())

    def check_coordinator_tls(self, pods):
        """The leader made the TLS Secret in its namespace, and each worker pod gets the CA's
        certificate (never its key) in its own credential Secret, mounted for --ca-file."""
        tls = self.cp.get("/api/v1/namespaces/%s/secrets/virtualflow-coordinator-tls" % NS)
        self.assertIsNotNone(tls, "no coordinator TLS Secret")
        self.assertEqual(tls["type"], "kubernetes.io/tls")
        self.assertEqual(sorted(tls["data"]), ["ca.crt", "ca.key", "tls.crt", "tls.key"])
        for pod in pods:
            name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
            secret = self.until(
                "%s's credential Secret" % name,
                lambda namespace=namespace, name=name: self.cp.get(
                    "/api/v1/namespaces/%s/secrets/%s-vf-credential" % (namespace, name)
                ),
            )
            self.assertEqual(sorted(secret["data"]), ["ca.crt", "token"])
            self.assertEqual(secret["data"]["ca.crt"], tls["data"]["ca.crt"])
            args = pod["spec"]["containers"][0]["args"]
            self.assertEqual(args[args.index("--ca-file") + 1], "/var/run/virtualflow/ca.crt")
            self.assertTrue(args[args.index("--coordinator") + 1].startswith("https://"))

    def check_network_policies(self, pods, namespace):
        """The installed NetworkPolicies, and the job's own that the operator made with the
        chart's rights, select the labels the operator really put on its worker pods. Whether a
        CNI enforces them is not tested: this suite's pod network (the pod runner's network
        namespaces on one bridge) has no NetworkPolicy enforcement, and no CNI plugin runs here
        (docs/security.md)."""
        path = "/apis/networking.k8s.io/v1/namespaces/%s/networkpolicies/%s"
        operator = self.cp.get(path % (NS, OPERATOR))
        workers = self.cp.get(path % (namespace, OPERATOR + "-workers"))
        self.assertIsNotNone(operator)
        self.assertIsNotNone(workers)
        operator_pod = self.cp.request(
            "GET",
            "/api/v1/namespaces/%s/pods?labelSelector=app.kubernetes.io/component=operator" % NS,
        )["items"][0]
        self.assertTrue(
            selects(operator["spec"]["podSelector"], operator_pod["metadata"]["labels"])
        )
        [coordinator_rule] = [
            r for r in operator["spec"]["ingress"] if r["ports"][0]["port"] == "coordinator"
        ]
        [peer] = coordinator_rule["from"]
        self.assertEqual(peer["namespaceSelector"], {})
        stranger = {"app": "curl", "app.kubernetes.io/managed-by": "Helm"}
        # The job's own policy: made before its pods, owned by the job.
        job = self.cp.get(
            "/apis/virtualflow.io/v1alpha1/namespaces/%s/virtualflowjobs/fashion-mnist" % namespace
        )
        own = self.cp.get(path % (namespace, "fashion-mnist-vf-workers"))
        self.assertIsNotNone(own, "the operator made no NetworkPolicy for the job")
        self.assertEqual(
            [(o["kind"], o["uid"]) for o in own["metadata"]["ownerReferences"]],
            [("VirtualFlowJob", job["metadata"]["uid"])],
        )
        [own_peers, own_metrics] = own["spec"]["ingress"]
        self.assertNotIn("namespaceSelector", own_peers["from"][0])
        self.assertNotIn("ports", own_peers)
        # Another job's worker pods carry the same labels but for the job's name.
        another = dict(pods[0]["metadata"]["labels"], **{"virtualflow.io/job": "another"})
        for pod in pods:
            labels = pod["metadata"]["labels"]
            self.assertTrue(selects(peer["podSelector"], labels), labels)
            self.assertTrue(selects(workers["spec"]["podSelector"], labels), labels)
            self.assertTrue(selects(own["spec"]["podSelector"], labels), labels)
            self.assertTrue(selects(own_peers["from"][0]["podSelector"], labels), labels)
        for other in (stranger, operator_pod["metadata"]["labels"], another):
            self.assertFalse(selects(own["spec"]["podSelector"], other), other)
            self.assertFalse(selects(own_peers["from"][0]["podSelector"], other), other)
        for other in (stranger, operator_pod["metadata"]["labels"]):
            self.assertFalse(selects(peer["podSelector"], other), other)
        # The namespace's base admits no worker pod, only the scrapers on the workers' metrics
        # port (the one the pods name "metrics"); so does the job's policy.
        [metrics_rule] = workers["spec"]["ingress"]
        for rule in (metrics_rule, own_metrics):
            self.assertEqual(rule["ports"], [{"port": 9090, "protocol": "TCP"}])
            self.assertTrue(
                selects(rule["from"][0]["podSelector"], {"app.kubernetes.io/name": "prometheus"})
            )
            self.assertFalse(selects(rule["from"][0]["podSelector"], another))

    def test_service_account_can_do_exactly_what_the_operator_needs(self):
        self.assertEqual(self.install.returncode, 0, self.install.stderr)
        for namespace in ("team-a", NS, "default"):
            for verb, resource, sub in JOB_RIGHTS + NODE_RIGHTS:
                with self.subTest("yes: %s %s/%s in %s" % (verb, resource, sub, namespace)):
                    self.assertTrue(self.can_i(verb, resource, sub, namespace))
            for verb, resource, sub in DENIED:
                with self.subTest("no: %s %s/%s in %s" % (verb, resource, sub, namespace)):
                    # The leader label: its own pod, in the release namespace.
                    label = (verb, resource, sub, namespace) == ("patch", "pods", "", NS)
                    self.assertEqual(self.can_i(verb, resource, sub, namespace), label)
        # The Lease: its own name, in its own namespace.
        for verb, resource, _ in LEASE_RIGHTS:
            with self.subTest("lease: " + verb):
                name = None if verb == "create" else "virtualflow-operator"
                self.assertTrue(self.can_i(verb, resource, name=name))
                self.assertFalse(self.can_i(verb, resource, name=name, namespace="team-a"))
        self.assertFalse(self.can_i("get", "leases.coordination.k8s.io", name="kube-scheduler"))
        self.assertFalse(self.can_i("update", "leases.coordination.k8s.io", name="other"))
        # The coordinator's TLS Secret: rewritten by name, in the release namespace only.
        tls = "virtualflow-coordinator-tls"
        self.assertTrue(self.can_i("update", "secrets", name=tls))
        self.assertFalse(self.can_i("update", "secrets", name="other"))
        self.assertFalse(self.can_i("update", "secrets", name=tls, namespace="kube-system"))
        self.assertFalse(self.can_i("delete", "secrets", name=tls))
        self.assertFalse(self.can_i("list", "secrets", namespace="kube-system"))
        # The job key: read by name in the release namespace, never rewritten; no Secret of any
        # other namespace can be read, a job's included.
        self.assertTrue(self.can_i("get", "secrets", name="virtualflow-job-key"))
        self.assertFalse(self.can_i("update", "secrets", name="virtualflow-job-key"))
        for namespace in ("team-a", "kube-system"):
            self.assertFalse(
                self.can_i("get", "secrets", namespace=namespace, name="virtualflow-job-key")
            )
            self.assertFalse(
                self.can_i("get", "secrets", namespace=namespace, name="fashion-mnist-vf-token")
            )
        self.assertFalse(self.can_i("delete", "nodes"))

        # Nothing else: the complete list of what the account may do.
        everywhere = self.expected_list(JOB_RIGHTS + NODE_RIGHTS)
        self.assertEqual(self.rights_list("team-a"), everywhere)
        in_release = dict(everywhere)
        in_release[("pods", ())] = everywhere[("pods", ())] | {"patch"}
        in_release[("leases.coordination.k8s.io", ())] = {"create"}
        in_release[("leases.coordination.k8s.io", ("virtualflow-operator",))] = {"get", "update"}
        in_release[("secrets", ("virtualflow-coordinator-tls",))] = {"get", "update"}
        in_release[("secrets", ("virtualflow-job-key",))] = {"get"}
        self.assertEqual(self.rights_list(NS), in_release)

    def test_watch_namespace_limits_the_rights_to_that_namespace(self):
        account = ("vf-team-system", "vf-team-virtualflow-operator")
        self.run_helm(
            "install",
            "vf-team",
            CHART,
            "-n",
            "vf-team-system",
            "--set",
            "watchNamespace=team-a",
            "--set",
            "replicaCount=1",
            # The CRD belongs to the first release.
            "--set",
            "crds.install=false",
        )
        try:
            for verb, resource, sub in JOB_RIGHTS:
                everywhere = (verb, resource, sub) in INVENTORY_RIGHTS
                with self.subTest("%s %s/%s" % (verb, resource, sub)):
                    self.assertTrue(self.can_i(verb, resource, sub, "team-a", account=account))
                    self.assertEqual(
                        self.can_i(verb, resource, sub, "team-b", account=account), everywhere
                    )
                    # The operator's own Secrets are created in its own namespace.
                    tls = (verb, resource) == ("create", "secrets")
                    self.assertEqual(
                        self.can_i(verb, resource, sub, "vf-team-system", account=account),
                        everywhere or tls,
                    )
            for verb, resource, sub in INVENTORY_RIGHTS:
                self.assertTrue(self.can_i(verb, resource, sub, "team-b", account=account))
            self.assertTrue(
                self.can_i(
                    "update",
                    "leases.coordination.k8s.io",
                    "",
                    "vf-team-system",
                    "virtualflow-operator",
                    account=account,
                )
            )
            self.assertEqual(
                self.rights_list("team-b", account), self.expected_list(INVENTORY_RIGHTS)
            )
            # No Secret read anywhere but its own two by name, not even in team-a; no pods
            # outside team-a.
            for namespace in ("kube-system", "team-a", "team-b", "default"):
                self.assertFalse(self.can_i("get", "secrets", namespace=namespace, account=account))
                self.assertEqual(
                    self.can_i("create", "pods", namespace=namespace, account=account),
                    namespace == "team-a",
                )
            for own in ("vf-team-virtualflow-coordinator-tls", "vf-team-virtualflow-job-key"):
                self.assertTrue(
                    self.can_i(
                        "get", "secrets", namespace="vf-team-system", name=own, account=account
                    )
                )
            self.assertEqual(
                self.rights_list("team-a", account), self.expected_list(JOB_RIGHTS + NODE_RIGHTS)
            )
            # The operator's own pod passes Pod Security there too.
            deployment = "vf-team-virtualflow-operator"
            self.cp.wait_for(
                "vf-team's operator pod",
                lambda: self.cp.request(
                    "GET",
                    "/api/v1/namespaces/vf-team-system/pods?labelSelector="
                    "app.kubernetes.io/instance=vf-team",
                )["items"],
            )
            args = self.cp.get("/apis/apps/v1/namespaces/vf-team-system/deployments/" + deployment)[
                "spec"
            ]["template"]["spec"]["containers"][0]["args"]
            self.assertIn("--namespace=team-a", args)

            # The operator itself runs a job in its namespace with only these rights.
            if operator_binary() is not None:
                self.cp.add_gpu_node("chart-gpu-2", gpus=4)
                _, url = self.start_operator("vf-team-system", deployment, "vf-team-operator")
                self.until("the operator to lead", lambda: http_get(url + "/readyz")[0] == 200)
                self.run_job("team-a")
                self.check_operators()
                self.assertNotIn("forbidden", self.operator_log("vf-team-operator").lower())
        finally:
            self.run_helm("uninstall", "vf-team", "-n", "vf-team-system", check=False)

    def test_upgrade_and_uninstall(self):
        self.run_helm(
            "install",
            "vf-upgrade",
            CHART,
            "-n",
            "team-b",
            "--set",
            "replicaCount=1",
            "--set",
            "leaderElection.leaseName=vf-upgrade",
            # The CRD belongs to the first release.
            "--set",
            "crds.install=false",
        )
        path = "/apis/apps/v1/namespaces/team-b/deployments/vf-upgrade-virtualflow-operator"

        def args():
            return self.cp.get(path)["spec"]["template"]["spec"]["containers"][0]["args"]

        self.assertIn("--policy=elastic", args())
        self.run_helm(
            "upgrade",
            "vf-upgrade",
            CHART,
            "-n",
            "team-b",
            "--reuse-values",
            "--set",
            "policy=static",
        )
        self.assertIn("--policy=static", args())
        self.assertIn("--leader-election-id=vf-upgrade", args())
        self.assertIn("REVISION", self.run_helm("history", "vf-upgrade", "-n", "team-b").stdout)
        # A bad value on upgrade changes nothing.
        bad = self.run_helm(
            "upgrade",
            "vf-upgrade",
            CHART,
            "-n",
            "team-b",
            "--reuse-values",
            "--set",
            "policy=fastest",
            check=False,
        )
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("value must be one of 'static', 'elastic', 'autoscale'", bad.stderr)
        self.assertIn("--policy=static", args())

        self.run_helm("uninstall", "vf-upgrade", "-n", "team-b")
        self.assertIsNone(self.cp.get(path))
        self.assertIsNone(
            self.cp.get(
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/"
                "team-b-vf-upgrade-virtualflow-operator"
            )
        )
        # Another release's CRD is not this one's to take: the jobs outlive the operator.
        self.assertIsNotNone(self.cp.get(CRD_PATH))


def previous_chart(dest):
    """The chart of PREVIOUS_CHART_COMMIT, extracted into DEST (its path), with one field taken
    out of its CRD, status.workerProtocol, as a CRD from before that field would lack it: the
    upgrade must add it. None when the source is not a git checkout holding that commit."""
    archive = subprocess.run(
        ["git", "-C", SOURCE_DIR, "archive", PREVIOUS_CHART_COMMIT, "charts/virtualflow"],
        capture_output=True,
        timeout=60,
    )
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True, timeout=60)
    chart = os.path.join(dest, "charts", "virtualflow")
    crd_file = os.path.join(chart, "crds", "virtualflowjob.yaml")
    text = read(crd_file)
    older = re.sub(r"(?m)^( {16})workerProtocol:\n(?:\1 .*\n)+", "", text)
    assert older != text, "status.workerProtocol not found in the previous chart's CRD"
    with open(crd_file, "w") as f:
        f.write(older)
    return chart


class OperatorKubelet:
    """Plays the kubelet for the operator's pods, which the pod runner cannot (it ignores
    readiness probes): runs the built operator as each pod bound to a node (start_operator),
    reports the pod Running with an address of its own and Ready as the operator's /readyz
    answers, as the kubelet's readiness probe would, and carries out a graceful deletion (the
    process stopped with SIGTERM, then the pod deleted). sync() does one round; the test calls it
    from its polling loops. Not thread-safe."""

    def __init__(self, test, namespace, deployment):
        self.test, self.ns, self.deployment = test, namespace, deployment
        self.ips = {}  # pod name -> the address reported for it
        self.reported = {}  # pod name -> the readiness last reported

    def pods(self):
        selector = "app.kubernetes.io/component%3Doperator"
        return self.test.cp.request(
            "GET", "/api/v1/namespaces/%s/pods?labelSelector=%s" % (self.ns, selector)
        )["items"]

    def sync(self):
        for pod in self.pods():
            name = pod["metadata"]["name"]
            if pod["metadata"].get("deletionTimestamp"):
                self.delete(name)
            elif pod["spec"].get("nodeName"):
                if name not in self.ips:
                    self.ips[name] = "10.244.0.%d" % (len(self.ips) + 10)
                    self.test.start_operator(self.ns, self.deployment, name, pod["spec"])
                proc, url = self.test.operators[name]
                ready = proc.poll() is None and http_get(url + "/readyz")[0] == 200
                if self.reported.get(name) != ready:
                    self.report(name, ready)
        return True

    def report(self, name, ready):
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = "True" if ready else "False"
        conditions = [
            {"type": t, "status": v, "lastTransitionTime": now}
            for t, v in (
                ("PodScheduled", "True"),
                ("Initialized", "True"),
                ("ContainersReady", status),
                ("Ready", status),
            )
        ]
        ip = self.ips[name]
        self.test.cp.patch(
            "/api/v1/namespaces/%s/pods/%s/status" % (self.ns, name),
            {
                "status": {
                    "phase": "Running",
                    "hostIP": "127.0.0.1",
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                    "startTime": now,
                    "conditions": conditions,
                    "containerStatuses": [
                        {
                            "name": "operator",
                            "image": "virtualflow/operator:" + APP_VERSION,
                            "imageID": "",
                            "ready": ready,
                            "started": True,
                            "restartCount": 0,
                            "state": {"running": {"startedAt": now}},
                        }
                    ],
                }
            },
        )
        self.reported[name] = ready

    def delete(self, name):
        if name in self.test.operators and name not in self.test.stopped:
            proc = self.test.operators[name][0]
            proc.terminate()
            self.test.assertEqual(proc.wait(30), 0, self.test.operator_log(name))
            self.test.stopped.add(name)
        try:
            self.test.cp.request(
                "DELETE",
                "/api/v1/namespaces/%s/pods/%s" % (self.ns, name),
                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )
        except ApiError as e:
            if e.status != 404:
                raise


class ChartUpgradeTest(OperatorProcesses, ControlPlaneTestCase):
    """The chart upgraded from the previous one, and its two operator pods run, in a control
    plane of its own (the CRD's owner changes here)."""

    def helm_run(self, *args, check=True):
        return self.helm(*args, kubeconfig=self.cp.kubeconfig, check=check)

    def background(self, *argv):
        """Starts ARGV (helm or kubectl, with this control plane's kubeconfig); returns the
        process, which a polling loop waits for while the kubelet stand-in runs the pods."""
        env = dict(self.helm.env, KUBECONFIG=self.cp.kubeconfig)
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )

        def stop():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()

        self.addCleanup(stop)
        return proc

    def finished(self, proc, kubelet):
        kubelet.sync()
        return proc.poll() is not None

    def serving(self):
        """The addresses the coordinator's Service sends traffic to (its ready endpoints)."""
        slices = self.cp.request(
            "GET",
            "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices?labelSelector="
            "kubernetes.io%%2Fservice-name%%3D%s" % (NS, OPERATOR),
        )["items"]
        return sorted(
            address
            for s in slices
            for e in s.get("endpoints") or []
            if (e.get("conditions") or {}).get("ready")
            for address in e["addresses"]
        )

    def leader_alone_is_served(self, kubelet):
        """The Lease's holder, once it is ready, alone carries the leader label, and alone is
        behind the Service; else None."""
        kubelet.sync()
        lease = self.cp.get("/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s" % (NS, OPERATOR))
        holder = (lease or {}).get("spec", {}).get("holderIdentity")
        live = [p for p in kubelet.pods() if not p["metadata"].get("deletionTimestamp")]
        labelled = [
            p["metadata"]["name"]
            for p in live
            if p["metadata"].get("labels", {}).get(LEADER_LABEL) == "true"
        ]
        if not holder or labelled != [holder] or holder not in kubelet.ips:
            return None
        return holder if self.serving() == [kubelet.ips[holder]] else None

    def all_ready(self, kubelet, count):
        pods = [p for p in kubelet.pods() if not p["metadata"].get("deletionTimestamp")]
        return len(pods) == count and all(
            any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions") or []
            )
            for p in pods
        )

    def test_upgrade_from_the_previous_chart_and_two_ready_replicas(self):
        if operator_binary() is None:
            self.skipTest("virtualflow-operator is not built (set VF_BIN_DIR)")
        self.helm = Helm(self.cp.bin)
        self.addCleanup(self.helm.close)
        tmp = tempfile.mkdtemp(prefix="vf-previous-chart-")
        self.addCleanup(shutil.rmtree, tmp, True)
        old_chart = previous_chart(tmp)
        if old_chart is None:
            self.skipTest(
                "%s is not a git checkout holding %s" % (SOURCE_DIR, PREVIOUS_CHART_COMMIT)
            )
        self.cp.create_namespace(NS)
        self.cp.create_namespace("team")
        for node in ("ops-a", "ops-b"):
            self.cp.add_gpu_node(node, gpus=0, pod_runner=False)

        # The previous chart installs its older CRD from crds/, and a job is submitted.
        self.helm_run("install", RELEASE, old_chart, "-n", NS)

        def served():
            schema = self.cp.get(CRD_PATH)["spec"]["versions"][0]["schema"]
            return schema["openAPIV3Schema"]["properties"]["status"]["properties"]

        self.assertNotIn("workerProtocol", served())
        self.cp.wait_for(
            "virtualflowjobs to be served",
            lambda: self.cp.kubectl("get", "vfjobs", "-A").returncode == 0,
        )
        # A job as that version wrote it (its flattened spec.template, which the previous CRD
        # knows and the new one refuses): the upgrade keeps it stored.
        old_example = subprocess.run(
            ["git", "-C", SOURCE_DIR, "show", PREVIOUS_CHART_COMMIT + ":" + EXAMPLE_PATH],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        self.cp.kubectl("apply", "-n", "team", "-f", "-", input=old_example, check=True)

        # The upgrade takes the CRD over (Helm did not make it: crds/ are installed bare) and
        # upgrades it.
        self.helm_run("upgrade", RELEASE, CHART, "-n", NS, "--take-ownership")
        self.assertIn("workerProtocol", served())
        crd = self.cp.get(CRD_PATH)
        self.assertEqual(crd["metadata"]["annotations"]["meta.helm.sh/release-name"], RELEASE)
        self.assertEqual(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep")
        job = "/apis/virtualflow.io/v1alpha1/namespaces/team/virtualflowjobs/fashion-mnist"
        self.assertIsNotNone(self.cp.get(job))

        # Both pods become ready, the Deployment Available, and only the leader is served.
        kubelet = OperatorKubelet(self, NS, OPERATOR)
        rollout = self.background(
            os.path.join(self.cp.bin, "kubectl"),
            "rollout",
            "status",
            "deployment/" + OPERATOR,
            "-n",
            NS,
            "--timeout=120s",
        )
        self.until("kubectl rollout status", lambda: self.finished(rollout, kubelet), timeout=150)
        self.assertEqual(rollout.returncode, 0, rollout.stdout.read())
        self.assertTrue(self.all_ready(kubelet, 2))
        first = self.until(
            "the leader alone behind the Service", lambda: self.leader_alone_is_served(kubelet)
        )
        self.until(
            "the disruption budget to allow one eviction",
            lambda: (
                kubelet.sync()
                and (
                    lambda b: (
                        b.get("status", {}).get("currentHealthy") == 2
                        and b["status"].get("disruptionsAllowed") == 1
                    )
                )(
                    self.cp.get(
                        "/apis/policy/v1/namespaces/%s/poddisruptionbudgets/%s" % (NS, OPERATOR)
                    )
                )
            ),
        )

        # A rolling update: helm upgrade --wait returns once new pods are ready, and the Service
        # still reaches the leader alone.
        upgrade = self.background(
            self.helm.path,
            "upgrade",
            RELEASE,
            CHART,
            "-n",
            NS,
            "--reuse-values",
            "--set",
            "policy=static",
            "--wait",
            "--timeout=180s",
        )
        self.until("helm upgrade --wait", lambda: self.finished(upgrade, kubelet), timeout=200)
        self.assertEqual(upgrade.returncode, 0, upgrade.stdout.read())
        self.until("2 new ready pods", lambda: kubelet.sync() and self.all_ready(kubelet, 2))
        live = [p for p in kubelet.pods() if not p["metadata"].get("deletionTimestamp")]
        for pod in live:
            self.assertIn("--policy=static", pod["spec"]["containers"][0]["args"])
        leader = self.until(
            "the leader alone behind the Service", lambda: self.leader_alone_is_served(kubelet)
        )
        self.assertNotIn(first, [p["metadata"]["name"] for p in live])

        # The leader stops: it takes its label off, and the Service follows the new leader.
        proc = self.operators[leader][0]
        proc.terminate()
        self.assertEqual(proc.wait(30), 0, self.operator_log(leader))
        self.stopped.add(leader)
        successor = self.until(
            "the new leader alone behind the Service",
            lambda: (lambda h: h if h and h != leader else None)(
                self.leader_alone_is_served(kubelet)
            ),
        )
        self.assertNotIn(
            LEADER_LABEL,
            self.cp.get("/api/v1/namespaces/%s/pods/%s" % (NS, leader))["metadata"].get(
                "labels", {}
            ),
        )
        self.check_operators()
        for pod in self.operators:
            self.assertNotIn("forbidden", self.operator_log(pod).lower(), pod)
        self.assertNotEqual(successor, leader)

        # Uninstalled, the release keeps the CRD, and so the job.
        self.helm_run("uninstall", RELEASE, "-n", NS)
        self.assertIsNotNone(self.cp.get(CRD_PATH))
        self.assertIsNotNone(self.cp.get(job))


if __name__ == "__main__":
    unittest.main()
