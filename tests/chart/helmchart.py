"""Rendering the chart with the real Helm engine, and reading what it produced.

`helm-python-sdk` binds Helm v4's Go SDK (no helm binary): `render()` runs the same
template engine and values-schema validation as `helm install`, offline. Also here:
the scenarios every test walks through, Kubernetes label-selector matching (to check
which pods the webhook entries select), and strict schema validation of manifests.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "burstbuffer"
RELEASE = "burstbuffer"
NAMESPACE = "burstbuffer-system"
INJECTOR = "burstbuffer-injector"

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest one
# kubernetes-validate ships schemas for.
KUBE_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())

# Values exercising every template branch; "default" is what `helm install` gives.
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "cert-manager": {"certManager": {"enabled": True}},
    "cert-manager-cluster-issuer": {
        "certManager": {
            "enabled": True,
            "issuerRef": {"name": "corporate-ca", "kind": "ClusterIssuer"},
            "duration": "720h",
            "renewBefore": "240h",
        }
    },
    "pmem-storage-class": {
        "sidecar": {
            "buffer": {"size": "8Gi", "medium": "pmem", "pmem": {"storageClassName": "pmem-csi"}}
        }
    },
    "pmem-host-path": {
        "sidecar": {"buffer": {"medium": "pmem", "pmem": {"hostPath": "/mnt/pmem0/burstbuffer"}}}
    },
    "parent-cache": {
        "parentCache": {
            "enabled": True,
            "replicas": 3,
            "storageClassName": "fast-ssd",
            "tls": {"enabled": True, "secretName": "parent-tls"},
            "ca": {"configMapName": "parent-tls-ca"},
        },
        "sidecar": {"upstreamCA": {"configMapName": "corp-root-ca"}},
    },
    "parent-cache-url": {"parentCache": {"url": "http://squid.cache.svc:3128"}},
    "parent-cache-https-url": {
        "parentCache": {"url": "https://squid.cache.svc:3129", "ca": {"configMapName": "squid-ca"}}
    },
    "classic-sidecar": {"sidecar": {"nativeSidecar": False, "buffer": {"medium": "Disk"}}},
    "monitoring": {
        "prometheus": {
            "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
            "podMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
        },
        "grafana": {"dashboards": {"enabled": True, "annotations": {"grafana_folder": "ML"}}},
    },
    "everything-else": {
        "fullnameOverride": "bb",
        "image": {
            "repository": "registry.example.org:5000/mirror/burstbuffer",
            "digest": "sha256:" + "ab" * 32,
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "mirror-credentials"}],
        "injector": {
            "replicaCount": 1,
            "podAnnotations": {"example.org/team": "ml-platform"},
            "podLabels": {"example.org/tier": "infra"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "infra", "operator": "Exists"}]}
                        ]
                    }
                }
            },
            "priorityClassName": "system-cluster-critical",
            "serviceAccount": {"create": False, "name": "prepared-account"},
        },
        "webhook": {"failurePolicy": "Fail", "timeoutSeconds": 5, "reinvocationPolicy": "IfNeeded"},
        "sidecar": {
            "capture": "proxy-env",
            "proxyPort": 13128,
            "adminPort": 13129,
            "runAsUser": 1001,
            "revalidate": True,
            "buffer": {"size": "4Gi", "eviction": "lru"},
            "intercept": ["datasets.example.org", "*.blob.example.net"],
            "noProxy": [".internal.example.org", "10.0.0.1"],
            "trust": {"mountPath": "/var/run/trust", "bundlePaths": ["/etc/ssl/cert.pem"]},
            "resources": {
                "requests": {"cpu": "250m", "memory": "256Mi"},
                "limits": {"cpu": 1, "memory": "1Gi"},
            },
        },
    },
}


def render_files(
    values: Mapping[str, Any] | None = None,
    *,
    namespace: str = NAMESPACE,
    config: helm_python.Config | None = None,
    upgrade: bool = False,
) -> dict[str, str]:
    """Render the chart: template path -> text. With `config`, `lookup` asks that cluster."""
    with helm_python.Chart.load(CHART) as chart:
        options: dict[str, Any] = {
            "name": RELEASE,
            "namespace": namespace,
            "is_install": not upgrade,
            "is_upgrade": upgrade,
        }
        if config is not None:
            return config.render(chart, dict(values) if values else None, **options)
        return chart.render(dict(values) if values else None, **options)


def render(values: Mapping[str, Any] | None = None, **options: Any) -> list[dict[str, Any]]:
    """Render the chart and parse every manifest (NOTES.txt and empty documents left out)."""
    documents: list[dict[str, Any]] = []
    for path, text in sorted(render_files(values, **options).items()):
        if path.endswith("NOTES.txt"):
            continue
        documents.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return documents


def merged_values(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """values.yaml's defaults with `values` over them, as Helm merges them for an install."""
    with helm_python.Chart.load(CHART) as chart:
        return chart.merge_values(dict(values) if values else None)


def notes(values: Mapping[str, Any] | None = None) -> str:
    files = render_files(values)
    return next(text for path, text in files.items() if path.endswith("NOTES.txt"))


def lint(values: Mapping[str, Any] | None = None) -> list[str]:
    """`helm lint --strict`: the warnings and errors (info lines such as "icon" left out)."""
    report = helm_python.lint(
        CHART,
        dict(values) if values else None,
        strict=True,
        namespace=NAMESPACE,
        kube_version="v" + KUBE_VERSIONS[0],
    )
    problems = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    return problems + list(report["errors"])


def of_kind(documents: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents if doc["kind"] == kind]


def one(documents: Sequence[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one document of this kind (and name); fails if there are none or several."""
    found = [d for d in of_kind(documents, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def injector_config(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The injector's configuration document carried by its ConfigMap."""
    (config_map,) = [d for d in of_kind(documents, "ConfigMap") if "config.yaml" in d["data"]]
    parsed: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return parsed


def pod_template(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    template: dict[str, Any] = one(documents, "Deployment")["spec"]["template"]
    return template


def secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def validate_builtin(document: Mapping[str, Any], version: str) -> None:
    """Strict validation against the Kubernetes OpenAPI schema (unknown fields fail)."""
    kubernetes_validate.validate(dict(document), version, strict=True)


def is_builtin(document: Mapping[str, Any]) -> bool:
    group = document["apiVersion"].rpartition("/")[0]
    return group == "" or group.endswith(".k8s.io") or group in ("apps", "policy", "batch")


# --- label selectors -------------------------------------------------------------------


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (an empty or absent selector matches everything).

    NotIn and DoesNotExist match objects without the key; In and Exists need it.
    """
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        assert operator in ("In", "NotIn", "Exists", "DoesNotExist"), operator
    return True


def webhooks_calling(
    configuration: Mapping[str, Any],
    namespace: str,
    namespace_labels: Mapping[str, str],
    pod_labels: Mapping[str, str],
) -> list[str]:
    """The names of the webhook entries the API server would call for this pod's CREATE.

    Every namespace carries `kubernetes.io/metadata.name` (set by the API server).
    """
    ns_labels = {"kubernetes.io/metadata.name": namespace, **namespace_labels}
    return [
        hook["name"]
        for hook in configuration["webhooks"]
        if selector_matches(hook.get("namespaceSelector"), ns_labels)
        and selector_matches(hook.get("objectSelector"), pod_labels)
    ]


def walk_keys(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every (dotted.path, value) of a values tree, parents before children."""
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        yield path, value
        if isinstance(value, Mapping):
            yield from walk_keys(value, path)
