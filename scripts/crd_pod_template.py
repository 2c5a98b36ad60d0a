#!/usr/bin/env python3
"""Generates the schema of the VirtualFlowJob's spec.template (a core/v1 PodTemplateSpec).

The schema is not written by hand: it is derived from Kubernetes' own OpenAPI v3 document for
core/v1 (what kube-apiserver serves at /openapi/v3/api/v1), the way controller-gen embeds a
PodTemplateSpec in a CRD:
  - every $ref and allOf is resolved into the structural schema itself;
  - IntOrString becomes x-kubernetes-int-or-string, Quantity int-or-string with controller-gen's
    pattern;
  - list and map types (x-kubernetes-list-type, -list-map-keys, -map-type) are kept, and the
    defaults the Kubernetes types declare with +default markers (protocol: TCP, ...), which the
    list-map keys need (non-empty strings); the zero-value defaults ("", 0, false, {}) and enums
    are not, as controller-gen does not emit them;
  - the template's metadata is labels and annotations only (what the operator copies);
  - descriptions are cut to their first sentence, which keeps the CRD under the 256 KiB that
    client-side `kubectl apply` can store in its last-applied annotation.
To these it adds the old flattened fields (image, command, ... at the template's top level),
each refused by a CEL rule whose message says where the field lives now.

  scripts/crd_pod_template.py              # starts a control plane (tests/e2e/controlplane.py)
  scripts/crd_pod_template.py --openapi v1.json
rewrites the `template:` block of crds/virtualflowjob.yaml and of the chart's copy.
tests/e2e/test_crd.py checks that the committed block equals template_schema() of the suite's
API server, so the two cannot drift apart.
"""

import argparse
import copy
import json
import os
import re
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(HERE)
CRD_FILES = [
    os.path.join(SOURCE_DIR, "crds", "virtualflowjob.yaml"),
    os.path.join(SOURCE_DIR, "charts", "virtualflow", "files", "virtualflowjob.yaml"),
]
OPENAPI_PATH = "/openapi/v3/api/v1"

REF_PREFIX = "#/components/schemas/"
POD_TEMPLATE_SPEC = "io.k8s.api.core.v1.PodTemplateSpec"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
# controller-gen's pattern for a resource.Quantity.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# Keys of an OpenAPI schema that a structural schema keeps as they are.
KEPT_KEYS = (
    "type",
    "format",
    "required",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
)

TEMPLATE_DESCRIPTION = (
    "The worker pods (used on Kubernetes only), as a Deployment's or a Job's pod template. "
    "The operator patches the container named worker (or the first) with what it owns and "
    "leaves the rest as written: see docs/crd-reference.md."
)
# The fields of the flattened template this one replaced, and where each lives now.
OLD_CONTAINER_FIELDS = [
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "workingDir",
    "env",
    "envFrom",
    "volumeMounts",
    "resources",
    "securityContext",
]
OLD_POD_FIELDS = [
    "volumes",
    "affinity",
    "tolerations",
    "nodeSelector",
    "priorityClassName",
    "schedulerName",
    "serviceAccountName",
    "imagePullSecrets",
    "runtimeClassName",
    "podSecurityContext",
]
# Their types, as CEL needs a type to see a field; their contents are left unchecked.
_STRING: dict[str, Any] = {"type": "string"}
_STRINGS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
_OBJECT: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_OBJECTS: dict[str, Any] = {"type": "array", "items": _OBJECT}
OLD_FIELD_TYPES = {
    "image": _STRING,
    "imagePullPolicy": _STRING,
    "command": _STRINGS,
    "args": _STRINGS,
    "workingDir": _STRING,
    "env": _OBJECTS,
    "envFrom": _OBJECTS,
    "volumeMounts": _OBJECTS,
    "resources": _OBJECT,
    "securityContext": _OBJECT,
    "volumes": _OBJECTS,
    "affinity": _OBJECT,
    "tolerations": _OBJECTS,
    "nodeSelector": _OBJECT,
    "priorityClassName": _STRING,
    "schedulerName": _STRING,
    "serviceAccountName": _STRING,
    "imagePullSecrets": _OBJECTS,
    "runtimeClassName": _STRING,
    "podSecurityContext": _OBJECT,
}
OLD_FORM_MESSAGE = (
    "spec.template is a pod template now: write image, command, args, env, resources, "
    "volumeMounts and securityContext under spec.template.spec.containers (one container "
    "named worker), and volumes, affinity, tolerations, nodeSelector and the other pod fields "
    "under spec.template.spec (podSecurityContext as spec.template.spec.securityContext)"
)


def first_sentence(text: str) -> str:
    """The description's first sentence, on one line."""
    text = " ".join(text.split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!etc)\.(\s|$)", text)
    return text[: m.start() + 1] if m else text


class Resolver:
    """Turns schemas of one OpenAPI v3 document into structural CRD schemas."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.schemas: dict[str, Any] = doc["components"]["schemas"]

    def property(self, s: dict[str, Any], is_key: bool) -> dict[str, Any]:
        out = self.schema(s, s.get("description"))
        if is_key and "default" in s and "default" not in out:
            out["default"] = s["default"]
        return out

    def named(
        self, name: str, description: str | None, keys: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        if name == QUANTITY:
            out: dict[str, Any] = {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": QUANTITY_PATTERN,
                "x-kubernetes-int-or-string": True,
            }
        elif name == INT_OR_STRING:
            out = {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "x-kubernetes-int-or-string": True,
            }
        elif name == OBJECT_META:
            string_map = {"type": "object", "additionalProperties": {"type": "string"}}
            out = {
                "type": "object",
                "properties": {
                    "annotations": dict(string_map, description="Annotations of every pod."),
                    "labels": dict(string_map, description="Labels of every pod."),
                },
            }
        else:
            return self.schema(self.schemas[name], description, keys)
        desc = description if description is not None else self.schemas[name].get("description")
        if desc:
            out = {"description": first_sentence(desc), **out}
        return out

    def schema(
        self, s: dict[str, Any], description: str | None = None, keys: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        """`keys`: the list-map keys when `s` is the item of a list map, whose defaults are kept
        whatever they are (the API server needs a key to be required or defaulted)."""
        if "$ref" in s:
            return self.named(
                s["$ref"][len(REF_PREFIX) :], description or s.get("description"), keys
            )
        if "allOf" in s:
            (only,) = s["allOf"]
            return self.named(
                only["$ref"][len(REF_PREFIX) :], description or s.get("description"), keys
            )
        out: dict[str, Any] = {}
        # A property's own description says more than its type's.
        desc = description if description is not None else s.get("description")
        if desc:
            out["description"] = first_sentence(desc)
        for key in KEPT_KEYS:
            if key in s:
                out[key] = copy.deepcopy(s[key])
        default = s.get("default")
        if default not in (None, "", 0, {}) and not isinstance(default, bool | dict):
            out["default"] = default
        if "properties" in s:
            out["properties"] = {
                k: self.property(v, k in keys) for k, v in sorted(s["properties"].items())
            }
        if "items" in s:
            out["items"] = self.schema(
                s["items"], keys=frozenset(s.get("x-kubernetes-list-map-keys", []))
            )
        if "additionalProperties" in s and isinstance(s["additionalProperties"], dict):
            out["additionalProperties"] = self.schema(s["additionalProperties"])
        if "type" not in out and "x-kubernetes-int-or-string" not in out:
            out["x-kubernetes-preserve-unknown-fields"] = True
        return out


def template_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """The schema of spec.template from the OpenAPI v3 document of core/v1 (`doc`)."""
    pts = Resolver(doc).named(POD_TEMPLATE_SPEC, None)
    properties = dict(pts["properties"])
    for field in OLD_CONTAINER_FIELDS + OLD_POD_FIELDS:
        where = (
            "spec.template.spec.containers[].%s" % field
            if field in OLD_CONTAINER_FIELDS
            else "spec.template.spec.securityContext"
            if field == "podSecurityContext"
            else "spec.template.spec.%s" % field
        )
        properties[field] = {
            "description": "Refused: the flattened template's field; write %s." % where,
            **OLD_FIELD_TYPES[field],
        }
    old = OLD_CONTAINER_FIELDS + OLD_POD_FIELDS
    return {
        "description": TEMPLATE_DESCRIPTION,
        "type": "object",
        "properties": properties,
        "x-kubernetes-validations": [
            {
                "rule": " && ".join("!has(self.%s)" % f for f in old),
                "message": OLD_FORM_MESSAGE,
            }
        ],
    }


def fetch_openapi() -> dict[str, Any]:
    sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "e2e"))
    from controlplane import ControlPlane  # noqa: PLC0415 (only for this command)

    with ControlPlane(name="crd-pod-template") as cp:
        return cp.request("GET", OPENAPI_PATH)


def render(schema: dict[str, Any], indent: int) -> list[str]:
    import yaml  # noqa: PLC0415 (PyYAML only where the files are written)

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    text = yaml.dump(schema, Dumper=Dumper, sort_keys=False, width=100, default_flow_style=False)
    return [(" " * indent + line) if line else line for line in text.splitlines()]


def splice(path: str, schema: dict[str, Any]) -> None:
    """Replaces the `template:` block under the job's spec properties in the CRD at `path`."""
    with open(path) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line == " " * 16 + "template:")
    end = start + 1
    while end < len(lines) and (
        not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > 16
    ):
        end += 1
    lines[start + 1 : end] = render(schema, 18)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--openapi", help="the OpenAPI v3 document of core/v1 (JSON)")
    args = parser.parse_args()
    if args.openapi:
        with open(args.openapi) as f:
            doc = json.load(f)
    else:
        doc = fetch_openapi()
    schema = template_schema(doc)
    for path in CRD_FILES:
        splice(path, schema)
        print("%s: %d bytes" % (os.path.relpath(path, SOURCE_DIR), os.path.getsize(path)))


if __name__ == "__main__":
    main()
