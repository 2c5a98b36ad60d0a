"""The VirtualFlowJob CustomResourceDefinition (crds/virtualflowjob.yaml) on a real API server.

The CRD installs and is served; the example job is accepted unchanged; bad jobs are rejected by
the API server itself with messages that name the field and the rule; status is written through
the status subresource and shown by the printer columns. The CRD and `vf run`'s validator
(runtime/job/spec.cc) accept and reject the same manifests, and docs/crd-reference.md documents
exactly the fields the schema has.
"""

import copy
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

from controlplane import ApiError, ControlPlaneTestCase

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("VF_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE_DIR, "scripts"))
import crd_pod_template  # noqa: E402 (the generator of spec.template's schema, in scripts/)

CRD_FILE = os.path.join(SOURCE_DIR, "crds", "virtualflowjob.yaml")
EXAMPLE = os.path.join(SOURCE_DIR, "examples", "fashion-mnist.yaml")
REFERENCE = os.path.join(SOURCE_DIR, "docs", "crd-reference.md")

CRD_NAME = "virtualflowjobs.virtualflow.io"
API = "/apis/virtualflow.io/v1alpha1"
NS = "vf-crd"
NS_DRY_RUN = "vf-crd-dry-run"  # nothing is ever created here, so every dry run is a create

# `vf run JOB --workers 5000` validates the job first, then refuses the worker count (more than
# the 4096 virtual nodes any job may have) before it starts anything. So this message, and only
# this one, means "the local validator accepted the job".
LOCAL_WORKERS = "5000"
LOCAL_ACCEPTED = "--workers %s exceeds spec.virtualNodes" % LOCAL_WORKERS

BASE_SPEC = {"virtualNodes": 8, "globalBatchSize": 256, "steps": 10}

# Manifests the API server must reject: (name, spec edits, metadata name or None, what the
# rejection must say, what `vf run` must say). An edit of None removes the field. Every message
# names the field and the rule.
INVALID = [
    (
        "batch-not-divisible",
        {"globalBatchSize": 250},
        None,
        [
            "spec.globalBatchSize",
            "spec.globalBatchSize (250) must be divisible by spec.virtualNodes (8)",
        ],
        ["spec.globalBatchSize (250) must be divisible by spec.virtualNodes (8)"],
    ),
    (
        "max-above-virtual-nodes",
        {"replicas": {"min": 1, "max": 9}},
        None,
        [
            "spec.replicas.max",
            "spec.replicas.max (9) must not exceed spec.virtualNodes (8): "
            "a worker holds at least one virtual node",
        ],
        ["spec.replicas.max (9) must not exceed spec.virtualNodes (8)"],
    ),
    (
        "lone-min-above-virtual-nodes",
        {"replicas": {"min": 9}},
        None,
        ["spec.replicas.max (9) must not exceed spec.virtualNodes (8)"],
        ["spec.replicas.max (9) must not exceed spec.virtualNodes (8)"],
    ),
    (
        "min-above-max",
        {"replicas": {"min": 5, "max": 2}},
        None,
        ["spec.replicas.min", "spec.replicas.min (5) must not exceed spec.replicas.max (2)"],
        ["spec.replicas.min (5) must not exceed spec.replicas.max (2)"],
    ),
    (
        "both-steps-and-epochs",
        {"epochs": 3},
        None,
        ["set exactly one of spec.steps and spec.epochs (both are set)"],
        ["set exactly one of spec.steps and spec.epochs (both are set)"],
    ),
    (
        "neither-steps-nor-epochs",
        {"steps": None},
        None,
        ["set exactly one of spec.steps and spec.epochs (neither is set)"],
        ["set exactly one of spec.steps and spec.epochs (neither is set)"],
    ),
    (
        "zero-steps",
        {"steps": 0},
        None,
        ["spec.steps", "should be greater than or equal to 1"],
        ["spec.steps: must be a positive integer"],
    ),
    (
        "unknown-reduction",
        {"reduction": "approx"},
        None,
        ["spec.reduction", 'Unsupported value: "approx"', '"exact", "fast"'],
        ["spec.reduction: unknown reduction 'approx'"],
    ),
    (
        "unknown-optimizer",
        {"optimizer": {"name": "adam"}},
        None,
        ["spec.optimizer.name", 'Unsupported value: "adam"', '"sgd", "adamw"'],
        ["spec.optimizer.name: unknown optimizer 'adam'"],
    ),
    (
        "negative-learning-rate",
        {"optimizer": {"name": "sgd", "learningRate": -0.1}},
        None,
        ["spec.optimizer.learningRate", "should be greater than 0"],
        ["spec.optimizer.learningRate: must be a finite number greater than 0"],
    ),
    (
        "momentum-one",
        {"optimizer": {"momentum": 1}},
        None,
        ["spec.optimizer.momentum", "should be less than 1"],
        ["spec.optimizer.momentum: must be in [0, 1)"],
    ),
    (
        "zero-epsilon",
        {"optimizer": {"name": "adamw", "epsilon": 0}},
        None,
        ["spec.optimizer.epsilon", "should be greater than 0"],
        ["spec.optimizer.epsilon: must be a finite number greater than 0"],
    ),
    (
        "negative-weight-decay",
        {"optimizer": {"weightDecay": -0.5}},
        None,
        ["spec.optimizer.weightDecay", "should be greater than or equal to 0"],
        ["spec.optimizer.weightDecay: must be a finite number of at least 0"],
    ),
    (
        "unknown-model",
        {"model": {"name": "resnet50"}},
        None,
        ["spec.model.name", 'Unsupported value: "resnet50"', '"mlp"'],
        ["spec.model.name: unknown model 'resnet50'"],
    ),
    (
        "no-hidden-layers",
        {"model": {"name": "mlp", "hiddenSizes": []}},
        None,
        ["spec.model.hiddenSizes", "should have at least 1 items"],
        ["spec.model.hiddenSizes: must list at least one hidden layer size"],
    ),
    (
        "hidden-layer-too-wide",
        {"model": {"hiddenSizes": [512, 70000]}},
        None,
        ["spec.model.hiddenSizes[1]", "should be less than or equal to 65536"],
        ["spec.model.hiddenSizes[1]: must be between 1 and 65536"],
    ),
    (
        "zero-virtual-nodes",
        {"virtualNodes": 0},
        None,
        ["spec.virtualNodes", "should be greater than or equal to 1"],
        ["spec.virtualNodes: must be between 1 and 4096 (got 0)"],
    ),
    (
        "too-many-virtual-nodes",
        {"virtualNodes": 5000, "globalBatchSize": 5000},
        None,
        ["spec.virtualNodes", "should be less than or equal to 4096"],
        ["spec.virtualNodes: must be between 1 and 4096 (got 5000)"],
    ),
    (
        "quoted-virtual-nodes",
        {"virtualNodes": "8"},
        None,
        ["spec.virtualNodes", "must be of type integer"],
        ["spec.virtualNodes: expected an integer"],
    ),
    (
        "fashion-mnist-empty-path",
        {"dataset": {"name": "fashion-mnist", "path": ""}},
        None,
        ["spec.dataset.path", "spec.dataset.path: required for dataset 'fashion-mnist'"],
        ["spec.dataset.path: required for dataset 'fashion-mnist'"],
    ),
    (
        "unknown-dataset",
        {"dataset": {"name": "mnist", "path": "/data"}},
        None,
        ["spec.dataset.name", 'Unsupported value: "mnist"', '"fashion-mnist", "synthetic"'],
        ["spec.dataset.name: unknown dataset 'mnist'"],
    ),
    (
        "synthetic-smaller-than-batch",
        {"dataset": {"name": "synthetic", "trainSamples": 100}},
        None,
        [
            "spec.dataset.trainSamples",
            "spec.dataset.trainSamples (100) must be at least "
            "spec.globalBatchSize (256): one step takes that many samples",
        ],
        ["spec.dataset.trainSamples (100) must be at least spec.globalBatchSize (256)"],
    ),
    (
        "synthetic-no-test-samples",
        {"dataset": {"name": "synthetic", "testSamples": 0}},
        None,
        ["spec.dataset.testSamples", "must be at least 1 for dataset 'synthetic' (got 0)"],
        ["spec.dataset.testSamples: must be at least 1 (got 0)"],
    ),
    (
        "checkpoints-without-path",
        {"checkpoint": {"everySteps": 10}},
        None,
        ["spec.checkpoint.path", "spec.checkpoint.everySteps (10) requires spec.checkpoint.path"],
        ["spec.checkpoint.everySteps (10) requires spec.checkpoint.path"],
    ),
    (
        "negative-checkpoint-interval",
        {"checkpoint": {"path": "/c", "everySteps": -1}},
        None,
        ["spec.checkpoint.everySteps", "should be greater than or equal to 0"],
        ["spec.checkpoint.everySteps: must be at least 0 (got -1)"],
    ),
    (
        "unknown-policy",
        {"elasticity": {"policy": "greedy"}},
        None,
        [
            "spec.elasticity.policy",
            'Unsupported value: "greedy"',
            '"static", "elastic", "autoscale"',
        ],
        ["spec.elasticity.policy: unknown policy 'greedy'"],
    ),
    (
        "negative-cooldown",
        {"elasticity": {"cooldownSeconds": -1}},
        None,
        ["spec.elasticity.cooldownSeconds", "should be greater than or equal to 0"],
        ["spec.elasticity.cooldownSeconds: must be at least 0 (got -1)"],
    ),
    (
        "negative-gpus",
        {"gpusPerWorker": -1},
        None,
        ["spec.gpusPerWorker", "should be greater than or equal to 0"],
        ["spec.gpusPerWorker: must be at least 0"],
    ),
    (
        "negative-seed",
        {"seed": -1},
        None,
        ["spec.seed", "should be greater than or equal to 0"],
        ["spec.seed: -1 is out of range"],
    ),
    (
        "missing-batch",
        {"globalBatchSize": None},
        None,
        ["spec.globalBatchSize", "Required value"],
        ["spec.globalBatchSize: required field is missing"],
    ),
    (
        "name-not-a-label",
        {},
        "job.v2",
        ["metadata.name", "'job.v2' is not a valid name", "(a DNS-1123 label)"],
        ["metadata.name: 'job.v2' is not a valid name"],
    ),
    (
        "flattened-template",
        {"template": {"image": "virtualflow/agent:0.1.0", "command": ["python3", "a.py"]}},
        None,
        ["spec.template", crd_pod_template.OLD_FORM_MESSAGE],
        ["spec.template.image: " + crd_pod_template.OLD_FORM_MESSAGE],
    ),
]

# Manifests both must accept, besides the examples.
VALID = [
    ("minimal", {}),
    ("lone-min", {"replicas": {"min": 8}}),
    ("lone-max", {"replicas": {"max": 8}}),
    ("cpu-workers", {"gpusPerWorker": 0}),
    (
        "epochs-and-checkpoints",
        {"steps": None, "epochs": 2, "checkpoint": {"path": "/ckpt/job.ckpt", "everySteps": 100}},
    ),
    ("checkpoint-at-end-only", {"checkpoint": {"path": "/ckpt/job.ckpt"}}),
    (
        "synthetic-adamw-fast",
        {
            "dataset": {"name": "synthetic", "trainSamples": 256, "testSamples": 1},
            "optimizer": {
                "name": "adamw",
                "learningRate": 0.001,
                "beta1": 0.0,
                "beta2": 0.99,
                "epsilon": 1e-6,
                "weightDecay": 0.01,
            },
            "reduction": "fast",
            "seed": 9223372036854775807,
        },
    ),
    (
        "unused-fields-ignored",
        {  # the dataset's sample counts only matter for `synthetic`
            "dataset": {"name": "fashion-mnist", "path": "/data", "trainSamples": -1}
        },
    ),
    ("default-dataset-path", {"dataset": {"name": "fashion-mnist"}}),
    (
        "nesterov-static",
        {
            "optimizer": {"name": "sgd", "momentum": 0.0, "nesterov": True},
            "elasticity": {"policy": "static", "cooldownSeconds": 0},
        },
    ),
    (
        "autoscale-one-virtual-node",
        {"virtualNodes": 1, "globalBatchSize": 1, "elasticity": {"policy": "autoscale"}},
    ),
    (
        "max-virtual-nodes",
        {"virtualNodes": 4096, "globalBatchSize": 8192, "replicas": {"min": 2, "max": 4096}},
    ),
    (
        "full-template",
        {
            "template": {
                "metadata": {"labels": {"team": "vision"}},
                "spec": {
                    "initContainers": [{"name": "fetch", "image": "busybox"}],
                    "containers": [
                        {
                            "name": "worker",
                            "image": "virtualflow/agent:0.1.0",
                            "resources": {
                                "requests": {"cpu": "4", "memory": "16Gi"},
                                "limits": {"memory": "16Gi", "nvidia.com/mig-1g.10gb": 1},
                            },
                            "ports": [{"name": "dash", "containerPort": 8265}],
                            "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                        },
                        {"name": "proxy", "image": "envoy"},
                    ],
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "securityContext": {"fsGroup": 1000},
                    "topologySpreadConstraints": [
                        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
                    ],
                },
            }
        },
    ),
]


def manifest(name, edits=None, metadata_name=None):
    spec = copy.deepcopy(BASE_SPEC)
    for key, value in (edits or {}).items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return {
        "apiVersion": "virtualflow.io/v1alpha1",
        "kind": "VirtualFlowJob",
        "metadata": {"name": metadata_name or name},
        "spec": spec,
    }


def read(path):
    with open(path) as f:
        return f.read()


def vf_binary():
    """The built `vf`, or None when it is not built (and VF_BIN_DIR does not name a build)."""
    bin_dir = os.environ.get("VF_BIN_DIR")
    candidates = [bin_dir] if bin_dir else [os.path.join(SOURCE_DIR, "build", "bin")]
    for d in candidates:
        path = os.path.join(d, "vf")
        if os.access(path, os.X_OK):
            return path
    if bin_dir:
        raise AssertionError("VF_BIN_DIR=%s has no vf: build the project first" % bin_dir)
    return None


def schema_paths(schema, prefix):
    """{dotted path: sub-schema} for every declared property under SCHEMA; items of a list of
    objects are written path[].field. Maps and preserved objects are leaves."""
    out = {}
    for name, sub in (schema.get("properties") or {}).items():
        path = prefix + "." + name
        out[path] = sub
        if sub.get("type") == "object" and sub.get("properties"):
            out.update(schema_paths(sub, path))
        elif sub.get("type") == "array" and (sub.get("items") or {}).get("properties"):
            out.update(schema_paths(sub["items"], path + "[]"))
    return out


def validations(schema, path="<root>"):
    """[(path, rule)] for every x-kubernetes-validations rule under SCHEMA."""
    out = [(path, r) for r in schema.get("x-kubernetes-validations") or []]
    for name, sub in (schema.get("properties") or {}).items():
        out += validations(sub, path + "." + name)
    if isinstance(schema.get("items"), dict):
        out += validations(schema["items"], path + "[]")
    return out


def reference_rows(text, section):
    """The rows of the first table after the heading SECTION in docs/crd-reference.md, as lists
    of cells (header and separator left out)."""
    lines = text.splitlines()
    start = lines.index(section)
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def render_default(value):
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(", ", ": "))


def table(text):
    """`kubectl get` output as a list of {HEADER: value}; columns split on 2+ spaces."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = re.split(r"\s{2,}", lines[0].strip())
    # A row with empty last columns has fewer cells than the header: those keys are left out.
    return header, [
        dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=False)) for line in lines[1:]
    ]


class CrdTest(ControlPlaneTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cache = os.path.join(cls.cp.dir, "kubectl-cache")  # discovery cache of this server
        cls.cp.create_namespace(NS)
        cls.cp.create_namespace(NS_DRY_RUN)
        proc = cls.run_kubectl("apply", "-f", CRD_FILE)
        if proc.returncode != 0:
            raise AssertionError("kubectl apply -f %s failed:\n%s" % (CRD_FILE, proc.stderr))
        cls.cp.wait_for("the CRD to be Established", lambda: cls.crd_condition("Established"))
        # Established means served; discovery may trail it by a moment.
        cls.cp.wait_for(
            "the API server to list virtualflowjobs",
            lambda: cls.run_kubectl("get", "vfj", "-A").returncode == 0,
        )

    @classmethod
    def crd_condition(cls, condition):
        crd = cls.cp.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + CRD_NAME)
        conditions = (crd or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == condition and c["status"] == "True" for c in conditions)

    @classmethod
    def run_kubectl(cls, *args, input=None, check=False):
        return cls.cp.kubectl("--cache-dir", cls.cache, *args, input=input, check=check)

    def kubectl(self, *args, input=None, check=False):
        return self.run_kubectl(*args, input=input, check=check)

    def apply(self, obj, *flags, namespace=NS):
        text = obj if isinstance(obj, str) else json.dumps(obj)
        return self.kubectl("apply", "-n", namespace, *flags, "-f", "-", input=text)

    def job(self, name):
        return self.cp.get("%s/namespaces/%s/virtualflowjobs/%s" % (API, NS, name))

    def crd_json(self):
        """The CRD file as kubectl reads it (YAML to JSON), without touching the server's copy."""
        out = self.kubectl(
            "create", "--dry-run=client", "-o", "json", "-f", CRD_FILE, check=True
        ).stdout
        return json.loads(out)

    def assertLocal(self, vf, obj, expect_error=None):
        """Runs `vf run`'s validator (the binary VF) on OBJ; with EXPECT_ERROR, asserts it
        rejects OBJ with a message holding every string in it, else that it accepts OBJ."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "job.yaml")
            with open(path, "w") as f:
                f.write(obj if isinstance(obj, str) else json.dumps(obj, indent=2))
            proc = subprocess.run(
                [vf, "run", path, "--workers", LOCAL_WORKERS],
                capture_output=True,
                text=True,
                timeout=60,
            )
        message = proc.stderr.strip()
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        if expect_error is None:
            self.assertIn(LOCAL_ACCEPTED, message, "vf run rejected a manifest the CRD accepts")
        else:
            self.assertNotIn(LOCAL_ACCEPTED, message, "vf run accepted a manifest the CRD rejects")
            for s in expect_error:
                self.assertIn(s, message)

    def assertRejected(self, obj, expected):
        """kubectl apply fails with the API server's Invalid error holding every EXPECTED
        string; the same object POSTed without kubectl gets 422; nothing is created."""
        name = obj["metadata"]["name"]
        proc = self.apply(obj)
        self.assertNotEqual(proc.returncode, 0, "accepted: %s" % json.dumps(obj))
        self.assertIn('The VirtualFlowJob "%s" is invalid' % name, proc.stderr)
        for s in expected:
            self.assertIn(s, proc.stderr)
        with self.assertRaises(ApiError) as raised:
            self.cp.request("POST", "%s/namespaces/%s/virtualflowjobs" % (API, NS), obj)
        self.assertEqual(raised.exception.status, 422, raised.exception.body)
        status = json.loads(raised.exception.body)
        self.assertEqual(status["reason"], "Invalid")
        for s in expected:
            self.assertIn(s, status["message"])
        self.assertIsNone(self.job(name))

    # ------------------------------------------------------------------ installation

    def test_crd_is_established_and_explained(self):
        crd = self.cp.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + CRD_NAME)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        self.assertEqual(conditions.get("Established"), "True", conditions)
        self.assertEqual(conditions.get("NamesAccepted"), "True", conditions)
        self.assertNotIn("NonStructuralSchema", conditions)
        names = crd["status"]["acceptedNames"]
        self.assertEqual(
            (names["kind"], names["plural"], names["singular"]),
            ("VirtualFlowJob", "virtualflowjobs", "virtualflowjob"),
        )
        self.assertTrue({"vfjob", "vfj"} <= set(names["shortNames"]), names)
        self.assertEqual(crd["spec"]["scope"], "Namespaced")
        versions = [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]]
        self.assertEqual(versions, [("v1alpha1", True, True)])
        # The scale subresource: kubectl scale, an HPA or KEDA set spec.replicas.desired.
        self.assertEqual(
            crd["spec"]["versions"][0]["subresources"],
            {
                "status": {},
                "scale": {
                    "specReplicasPath": ".spec.replicas.desired",
                    "statusReplicasPath": ".status.workers",
                    "labelSelectorPath": ".status.selector",
                },
            },
        )

        # explain reads the published OpenAPI, which trails the CRD by a moment.
        out = self.cp.wait_for(
            "kubectl explain virtualflowjob.spec",
            lambda: (lambda p: p.returncode == 0 and "virtualNodes" in p.stdout and p.stdout)(
                self.kubectl("explain", "virtualflowjob.spec")
            ),
        )
        for field in ("virtualNodes", "globalBatchSize", "replicas", "optimizer", "template"):
            self.assertIn(field, out)
        self.assertRegex(out, r"virtualNodes\s+<integer> -required-")
        self.assertIn("Immutable", out)
        out = self.kubectl("explain", "vfj.spec.replicas.max", check=True).stdout
        self.assertIn("at most virtualNodes", out)
        out = self.kubectl("explain", "virtualflowjob.status.phase", check=True).stdout
        self.assertIn("Pending", out)
        # spec.template is a whole PodTemplateSpec, every field explained.
        out = self.kubectl(
            "explain", "virtualflowjob.spec.template.spec.containers.securityContext", check=True
        ).stdout
        self.assertRegex(out, r"allowPrivilegeEscalation\s+<boolean>")
        self.assertRegex(out, r"capabilities\s+<Object>")
        out = self.kubectl(
            "explain", "vfj.spec.template.spec.topologySpreadConstraints", check=True
        ).stdout
        self.assertRegex(out, r"maxSkew\s+<integer> -required-")

    def test_the_template_schema_is_the_api_servers_pod_template(self):
        # Generated from this API server's own OpenAPI document for core/v1, so that the
        # committed CRD cannot drift from what scripts/crd_pod_template.py makes of it.
        doc = self.cp.request("GET", crd_pod_template.OPENAPI_PATH)
        spec = self.crd_json()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        self.assertEqual(
            spec["spec"]["properties"]["template"],
            crd_pod_template.template_schema(doc),
            "spec.template differs from scripts/crd_pod_template.py's; run it",
        )
        # Client-side `kubectl apply` stores the CRD in an annotation of at most 256 KiB.
        applied = len(json.dumps(self.crd_json(), separators=(",", ":")))
        self.assertLess(applied, 256 * 1024)

    # ------------------------------------------------------------------ the example

    def test_example_is_accepted_unchanged(self):
        text = read(EXAMPLE)
        dry = self.kubectl("apply", "-n", NS, "--dry-run=server", "-f", EXAMPLE)
        self.assertEqual(dry.returncode, 0, dry.stderr)
        self.assertIn("created (server dry run)", dry.stdout)
        self.assertIsNone(self.job("fashion-mnist"))
        proc = self.kubectl("apply", "-n", NS, "-f", EXAMPLE)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("virtualflowjob.virtualflow.io/fashion-mnist created", proc.stdout)
        self.assertEqual(read(EXAMPLE), text)
        # Stored as written: nothing pruned, nothing defaulted over; the one field the example
        # leaves out and the API server fills in is spec.suspend (false, as in a batch/v1 Job).
        local = json.loads(
            self.kubectl(
                "create", "--dry-run=client", "-o", "json", "-f", EXAMPLE, check=True
            ).stdout
        )
        self.assertNotIn("suspend", local["spec"])
        self.assertEqual(self.job("fashion-mnist")["spec"], {**local["spec"], "suspend": False})
        # Re-applying the same file changes nothing.
        again = self.kubectl("apply", "-n", NS, "-f", EXAMPLE, check=True)
        self.assertIn("unchanged", again.stdout)

        for resource in ("vfjobs", "vfj", "vfjob", "virtualflowjobs"):
            header, rows = table(
                self.kubectl("get", resource, "-n", NS, "fashion-mnist", check=True).stdout
            )
            self.assertEqual(header, ["NAME", "VIRTUAL NODES", "WORKERS", "STEP", "PHASE", "AGE"])
            self.assertEqual(rows[0]["NAME"], "fashion-mnist")
            self.assertEqual(rows[0]["VIRTUAL NODES"], "8")

    # ------------------------------------------------------------------ status

    def test_status_subresource_and_printer_columns(self):
        proc = self.apply(manifest("status-demo"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        status = {
            "phase": "Running",
            "workers": 3,
            "readyWorkers": 3,
            "desiredWorkers": 4,
            "observedGeneration": 1,
            "epoch": 2,
            "step": 120,
            "totalSteps": 1872,
            "loss": 0.4394,
            "samplesPerSecond": 7705.5,
            "assignment": [
                {"worker": "status-demo-worker-0", "rank": 0, "virtualNodes": [0, 1, 2]},
                {"worker": "status-demo-worker-1", "rank": 1, "virtualNodes": [3, 4, 5]},
                {"worker": "status-demo-worker-2", "rank": 2, "virtualNodes": [6, 7]},
            ],
            "lastResize": {
                "time": "2026-01-02T03:04:05Z",
                "from": 2,
                "to": 3,
                "reason": "GPUs free again",
                "pauseSeconds": 0.12,
            },
            "restarts": {"failure": 1, "preemption": 2},
            "conditions": [
                {
                    "type": "Running",
                    "status": "True",
                    "reason": "Training",
                    "message": "3 workers",
                    "observedGeneration": 1,
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                }
            ],
            "message": "training on 3 workers",
            "workerCounts": {"pending": 1, "joining": 0, "training": 3, "leaving": 0, "failed": 0},
        }
        self.kubectl(
            "patch",
            "vfj",
            "status-demo",
            "-n",
            NS,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
            check=True,
        )
        stored = self.job("status-demo")
        self.assertEqual(stored["status"], status)
        self.assertEqual(stored["metadata"]["generation"], 1)

        header, rows = table(
            self.kubectl("get", "vfjobs", "-n", NS, "status-demo", check=True).stdout
        )
        self.assertEqual(header, ["NAME", "VIRTUAL NODES", "WORKERS", "STEP", "PHASE", "AGE"])
        row = rows[0]
        self.assertEqual(
            (row["VIRTUAL NODES"], row["WORKERS"], row["STEP"], row["PHASE"]),
            ("8", "3", "120", "Running"),
        )
        header, rows = table(
            self.kubectl("get", "vfj", "-n", NS, "status-demo", "-o", "wide", check=True).stdout
        )
        self.assertEqual(header[-2:], ["LOSS", "PENDING"])
        self.assertEqual((rows[0]["LOSS"], rows[0]["PENDING"]), ("0.4394", "1"))

        # The main resource ignores status, and the status subresource ignores spec.
        self.kubectl(
            "patch",
            "vfj",
            "status-demo",
            "-n",
            NS,
            "--type=merge",
            "-p",
            json.dumps({"status": {"phase": "Failed"}}),
            check=True,
        )
        self.kubectl(
            "patch",
            "vfj",
            "status-demo",
            "-n",
            NS,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"steps": 99}}),
            check=True,
        )
        stored = self.job("status-demo")
        self.assertEqual(stored["status"]["phase"], "Running")
        self.assertEqual(stored["spec"]["steps"], 10)

        # Status is validated too.
        bad = self.kubectl(
            "patch",
            "vfj",
            "status-demo",
            "-n",
            NS,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"phase": "Bogus"}}),
        )
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("status.phase", bad.stderr)
        self.assertIn('Unsupported value: "Bogus"', bad.stderr)
        duplicate = dict(status["conditions"][0])
        bad = self.kubectl(
            "patch",
            "vfj",
            "status-demo",
            "-n",
            NS,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"conditions": [duplicate, duplicate]}}),
        )
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("status.conditions[1]", bad.stderr)
        self.assertIn("Duplicate value", bad.stderr)

    # ------------------------------------------------------------------ rejection

    def test_invalid_manifests_are_rejected_by_the_api_server(self):
        self.assertGreaterEqual(len(INVALID), 12)
        for name, edits, metadata_name, expected, _ in INVALID:
            with self.subTest(name):
                self.assertRejected(manifest("bad-" + name, edits, metadata_name), expected)

    def test_unknown_fields_are_rejected_by_strict_field_validation(self):
        for name, edits, field in (
            ("unknown-spec-field", {"frobnicate": 1}, "spec.frobnicate"),
            ("misspelled-field", {"replicas": {"min": 1, "maximum": 4}}, "spec.replicas.maximum"),
            (
                "unknown-container-field",
                {"template": {"spec": {"containers": [{"name": "worker", "imag": "x"}]}}},
                "spec.template.spec.containers[0].imag",
            ),
        ):
            with self.subTest(name):
                obj = manifest(name, edits)
                proc = self.apply(obj)  # --validate=strict is kubectl's default
                self.assertNotEqual(proc.returncode, 0, proc.stdout)
                self.assertIn('unknown field "%s"' % field, proc.stderr)
                self.assertIsNone(self.job(name))
                # Without strict validation the schema prunes the field: it never reaches the
                # operator.
                proc = self.apply(obj, "--validate=false")
                self.assertEqual(proc.returncode, 0, proc.stderr)
                stored = json.dumps(self.job(name)["spec"])
                self.assertNotIn('"%s"' % field.rsplit(".", 1)[1], stored)

    def test_training_math_is_immutable(self):
        self.assertEqual(self.apply(manifest("immutable")).returncode, 0)
        for edits, field in (
            ({"virtualNodes": 16}, "virtualNodes"),
            ({"globalBatchSize": 512}, "globalBatchSize"),
            ({"virtualNodes": 4, "globalBatchSize": 128}, "virtualNodes"),
        ):
            with self.subTest(json.dumps(edits)):
                proc = self.apply(manifest("immutable", edits))
                self.assertNotEqual(proc.returncode, 0, proc.stdout)
                self.assertIn('The VirtualFlowJob "immutable" is invalid', proc.stderr)
                self.assertIn(
                    "spec.%s cannot change: it defines the training math" % field, proc.stderr
                )
        # What is not the training math may change.
        changed = manifest("immutable", {"replicas": {"min": 2, "max": 8}, "steps": 20})
        proc = self.apply(changed)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        spec = self.job("immutable")["spec"]
        self.assertEqual((spec["virtualNodes"], spec["globalBatchSize"]), (8, 256))
        self.assertEqual((spec["replicas"], spec["steps"]), ({"min": 2, "max": 8}, 20))
        # Changing the rules of a stored job still checks them against its virtual nodes.
        proc = self.apply(manifest("immutable", {"replicas": {"min": 2, "max": 9}}))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("spec.replicas.max (9) must not exceed spec.virtualNodes (8)", proc.stderr)

    def test_defaults_are_those_of_vf_run(self):
        proc = self.apply(
            manifest(
                "defaults",
                {
                    "replicas": {},
                    "model": {},
                    "dataset": {},
                    "optimizer": {},
                    "elasticity": {},
                    "checkpoint": {},
                },
            )
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        spec = self.job("defaults")["spec"]
        # The values of runtime/job/spec.h; fields that depend on another field's value (the
        # dataset path, sgd's momentum, adamw's betas, replicas.max = min, gpusPerWorker = the
        # worker container's accelerator count) are left to the runtime, which applies the same
        # defaults.
        self.assertEqual(
            spec,
            {
                "virtualNodes": 8,
                "globalBatchSize": 256,
                "steps": 10,
                "replicas": {"min": 1},
                "model": {"name": "mlp", "hiddenSizes": [512, 256]},
                "dataset": {"name": "fashion-mnist"},
                "optimizer": {"name": "sgd", "learningRate": 0.05, "weightDecay": 0},
                "reduction": "exact",
                "seed": 0,
                "elasticity": {"policy": "elastic", "cooldownSeconds": 30},
                "checkpoint": {"everySteps": 0},
                "suspend": False,
            },
        )

    # ------------------------------------------------------------------ vf run agrees

    def test_crd_and_vf_run_accept_the_same_manifests(self):
        examples = [
            p
            for p in sorted(glob.glob(os.path.join(SOURCE_DIR, "examples", "*.yaml")))
            if re.search(r"^kind: VirtualFlowJob$", read(p), re.M)
        ]
        self.assertIn(EXAMPLE, examples)
        documented = []
        for doc in sorted(glob.glob(os.path.join(SOURCE_DIR, "docs", "*.md"))):
            for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", read(doc), re.S)):
                if re.search(r"^kind: VirtualFlowJob$", block, re.M):
                    documented.append(("%s#%d" % (os.path.basename(doc), i), block))
        self.assertTrue(documented, "no VirtualFlowJob in the docs' yaml blocks")

        cases = [(os.path.relpath(p, SOURCE_DIR), read(p)) for p in examples]
        cases += documented
        cases += [
            ("valid-" + name, json.dumps(manifest("valid-" + name, edits))) for name, edits in VALID
        ]
        for label, text in cases:
            with self.subTest("crd: " + label):
                proc = self.apply(text, "--dry-run=server", namespace=NS_DRY_RUN)
                self.assertEqual(proc.returncode, 0, proc.stderr)
        # The API server's side of the rejections is test_invalid_manifests_are_rejected_....

        vf = vf_binary()
        if vf is None:
            self.skipTest("vf is not built (set VF_BIN_DIR to the build's bin directory)")
        for label, text in cases:
            with self.subTest("vf run: " + label):
                self.assertLocal(vf, text)
        for name, edits, metadata_name, _, local_error in INVALID:
            with self.subTest("vf run: invalid-" + name):
                self.assertLocal(vf, manifest("bad-" + name, edits, metadata_name), local_error)
        self.assertLocal(vf, manifest("x", {"frobnicate": 1}), ["spec.frobnicate: unknown field"])
        # The one rule the schema leaves to the parser (it would compare a field with a map key
        # of a container found by name): the operator fails such a job with the same message.
        worker = {"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 1}}}
        self.assertLocal(
            vf,
            manifest("x", {"gpusPerWorker": 2, "template": {"spec": {"containers": [worker]}}}),
            [
                "spec.gpusPerWorker (2) disagrees with "
                "spec.template.spec.containers[0].resources.limits.nvidia.com/gpu (1)"
            ],
        )
        self.assertLocal(
            vf,
            manifest("x", {"replicas": {"min": 1, "maximum": 4}}),
            ["spec.replicas.maximum: unknown field"],
        )

    # ------------------------------------------------------------------ the reference

    def test_reference_documents_every_field(self):
        text = read(REFERENCE)
        crd = self.crd_json()
        version = crd["spec"]["versions"][0]
        root = version["schema"]["openAPIV3Schema"]

        for section, prefix in (("## Spec fields", "spec"), ("## Status fields", "status")):
            schema = schema_paths(root["properties"][prefix], prefix)
            # spec.template is Kubernetes' PodTemplateSpec, documented by Kubernetes (and by
            # kubectl explain); the reference names its two parts and the refused old fields.
            schema = {
                path: sub
                for path, sub in schema.items()
                if not re.match(r"spec\.template\.(spec|metadata)\.", path)
                and not sub.get("description", "").startswith("Refused:")
            }
            rows = reference_rows(text, section)
            documented = {}
            for row in rows:
                m = re.fullmatch(r"`([^`]+)`", row[0])
                self.assertTrue(m, "%s: first cell is not a `path`: %s" % (section, row))
                documented[m.group(1)] = row
            self.assertEqual(
                sorted(set(schema) - set(documented)),
                [],
                "fields of the CRD missing from %s" % section,
            )
            self.assertEqual(
                sorted(set(documented) - set(schema)),
                [],
                "fields in %s that the CRD does not have" % section,
            )
            for path, sub in schema.items():
                row = documented[path]
                self.assertIn(sub["type"], row[1], "%s: type" % path)
                if "default" in sub:
                    self.assertIn(
                        "`%s`" % render_default(sub["default"]), row[2], "%s: default" % path
                    )
                if "enum" in sub:
                    for value in sub["enum"]:
                        self.assertIn("`%s`" % value, row[3], "%s: values" % path)
                for key in ("minimum", "maximum"):
                    if key in sub and not (key == "maximum" and sub[key] == 2147483647):
                        self.assertIn(str(sub[key]), row[3], "%s: %s" % (path, key))
                self.assertTrue(row[-1], "%s: meaning" % path)

        # Every rule's message is quoted in the reference, so that a user who meets one finds it.
        for path, rule in validations(root):
            self.assertIn(rule["message"], text, "message of the rule on %s" % path)

        columns = {(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]}
        rows = reference_rows(text, "## Printer columns")
        self.assertEqual({(r[0], r[1].strip("`")) for r in rows}, columns)

        names = crd["spec"]["names"]
        for name in names["shortNames"] + [names["plural"], names["kind"], crd["spec"]["group"]]:
            self.assertIn(name, text)


if __name__ == "__main__":
    unittest.main()
