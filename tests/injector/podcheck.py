"""Test helpers: AdmissionReviews as the API server sends them, and pod validation.

`check_pod` is what stands in for the API server's validation: the JSON schemas of
Kubernetes 1.29 (the first with native sidecars) and of the newest version that
kubernetes-validate ships, in strict mode, plus the rules the schemas cannot express
(unique names, mounts of existing volumes, subPath only into files we write...).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections import Counter
from typing import Any

import jsonpatch
import kubernetes_validate

SCHEMA_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


def admission_review(
    pod: dict[str, Any], namespace: str = "default", operation: str = "CREATE"
) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview for creating `pod` (malformed ones too)."""
    metadata = pod.get("metadata")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": metadata.get("name", "") if isinstance(metadata, dict) else "",
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch operations of an AdmissionReview response (empty if none)."""
    if "patch" not in response:
        assert "patchType" not in response
        return []
    assert response["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(response["patch"]))
    assert isinstance(operations, list)
    return operations


def apply(pod: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod after the patch, as the API server would store it."""
    patched = jsonpatch.apply_patch(pod, operations)
    assert isinstance(patched, dict)
    return patched


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def check_pod(pod: dict[str, Any]) -> None:
    """Fail unless the API server of every SCHEMA_VERSIONS would accept `pod`."""
    for version in SCHEMA_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
    spec = pod["spec"]
    containers = _containers(spec)
    names = Counter(c["name"] for c in containers)
    assert max(names.values()) == 1, f"duplicate container names: {names}"
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    assert len(volumes) == len(spec.get("volumes") or []), "duplicate volume names"
    ports = Counter(p["name"] for c in containers for p in c.get("ports") or [] if "name" in p)
    assert not ports or max(ports.values()) == 1, f"duplicate port names: {ports}"
    for c in containers:
        paths = Counter(m["mountPath"] for m in c.get("volumeMounts") or [])
        assert not paths or max(paths.values()) == 1, f"{c['name']}: duplicate mountPath"
        for mount in c.get("volumeMounts") or []:
            assert mount["name"] in volumes, f"{c['name']}: mount of missing {mount['name']}"
        if c.get("restartPolicy") is not None:
            assert c in (spec.get("initContainers") or []), "restartPolicy on a regular container"
            assert c["restartPolicy"] == "Always"
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            if probe in c and c.get("restartPolicy") is None:
                assert c not in (spec.get("initContainers") or []), "probe on an init container"
