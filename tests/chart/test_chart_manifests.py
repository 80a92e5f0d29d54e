"""The chart renders, lints clean, and every manifest is valid Kubernetes.

Built-in kinds are validated strictly (unknown fields fail) against the schemas of
the oldest supported Kubernetes and the newest one kubernetes-validate ships; custom
resources (cert-manager, Prometheus Operator) against their structural schemas.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from crds import validate_custom
from helmchart import (
    INJECTOR,
    KUBE_VERSIONS,
    NAMESPACE,
    SCENARIOS,
    is_builtin,
    lint,
    notes,
    of_kind,
    one,
    pod_template,
    render,
    selector_matches,
    validate_builtin,
)

CLUSTER_SCOPED = {"MutatingWebhookConfiguration"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_strict_is_clean(scenario: str) -> None:
    assert lint(SCENARIOS[scenario]) == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_manifest_is_valid(scenario: str) -> None:
    documents = render(SCENARIOS[scenario])
    assert documents
    for document in documents:
        if is_builtin(document):
            for version in KUBE_VERSIONS:
                validate_builtin(document, version)
        else:
            validate_custom(document)


def test_strict_validation_can_fail() -> None:
    deployment = one(render(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolcy"):
        validate_builtin(deployment, KUBE_VERSIONS[-1])


def test_structural_validation_can_fail() -> None:
    certificate = one(render(SCENARIOS["cert-manager"]), "Certificate", INJECTOR)
    certificate["spec"]["dnsName"] = certificate["spec"].pop("dnsNames")
    with pytest.raises(Exception, match="dnsName"):
        validate_custom(certificate)


@pytest.mark.parametrize("namespace", [NAMESPACE, "platform"])
def test_namespaced_objects_live_in_the_release_namespace(namespace: str) -> None:
    for document in render(SCENARIOS["monitoring"], namespace=namespace):
        metadata = document["metadata"]
        if document["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in metadata
        else:
            assert metadata["namespace"] == namespace, document["kind"]


def test_default_objects() -> None:
    kinds = sorted(doc["kind"] for doc in render())
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "MutatingWebhookConfiguration",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "ServiceAccount",
    ]


def test_injector_needs_no_api_access() -> None:
    documents = render(SCENARIOS["monitoring"])
    assert not [d for d in documents if d["kind"] in ("Role", "ClusterRole", "RoleBinding")]
    assert one(documents, "ServiceAccount")["automountServiceAccountToken"] is False
    assert pod_template(documents)["spec"]["automountServiceAccountToken"] is False


def test_secure_defaults() -> None:
    spec = pod_template(render())["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = spec["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["limits"]["memory"]
    # The read-only root leaves /tmp as the only writable place.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/tls"]["readOnly"] and mounts["/etc/burstbuffer-injector"]["readOnly"]


def test_injector_command_matches_its_mounts_and_ports() -> None:
    documents = render()
    spec = pod_template(documents)["spec"]
    (container,) = spec["containers"]
    assert container["command"] == [
        "burstbuffer-injector",
        "serve",
        "--port",
        "8443",
        "--tls-cert",
        "/tls/tls.crt",
        "--tls-key",
        "/tls/tls.key",
        "--config",
        "/etc/burstbuffer-injector/config.yaml",
    ]
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert mounts["/tls"]["secret"]["secretName"] == one(documents, "Secret")["metadata"]["name"]
    config_map = one(documents, "ConfigMap")
    assert (
        mounts["/etc/burstbuffer-injector"]["configMap"]["name"] == config_map["metadata"]["name"]
    )
    assert "config.yaml" in config_map["data"]
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}


def test_service_reaches_the_injector_pods() -> None:
    documents = render()
    service = one(documents, "Service")
    template = pod_template(documents)
    assert selector_matches(
        {"matchLabels": service["spec"]["selector"]}, template["metadata"]["labels"]
    )
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443 and port["targetPort"] == "https"


def test_two_replicas_spread_and_protected() -> None:
    documents = render()
    deployment = one(documents, "Deployment")
    labels = pod_template(documents)["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budget = one(documents, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert selector_matches(budget["spec"]["selector"], labels)
    anti = pod_template(documents)["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selector_matches(term["podAffinityTerm"]["labelSelector"], labels)


def test_single_replica_has_no_budget_and_custom_affinity_replaces_the_default() -> None:
    values = SCENARIOS["everything-else"]
    documents = render(values)
    assert not of_kind(documents, "PodDisruptionBudget")
    spec = pod_template(documents)["spec"]
    assert spec["affinity"] == values["injector"]["affinity"]
    assert spec["serviceAccountName"] == "prepared-account"
    assert not of_kind(documents, "ServiceAccount")
    assert spec["imagePullSecrets"] == [{"name": "mirror-credentials"}]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["containers"][0]["image"] == (
        "registry.example.org:5000/mirror/burstbuffer@sha256:" + "ab" * 32
    )


def test_pod_labels_cannot_undo_the_opt_out() -> None:
    values: dict[str, Any] = {"injector": {"podLabels": {"burstbuffer.io/inject": "true"}}}
    assert pod_template(render(values))["metadata"]["labels"]["burstbuffer.io/inject"] == "false"


def _checksum(values: dict[str, Any]) -> str:
    annotations = pod_template(render(values))["metadata"]["annotations"]
    checksum: str = annotations["checksum/config"]
    return checksum


def test_config_change_rolls_the_injector() -> None:
    default = _checksum({})
    assert _checksum({"sidecar": {"buffer": {"size": "2Gi"}}}) != default
    assert _checksum({"image": {"tag": "0.1.1"}}) != default
    assert _checksum({"injector": {"replicaCount": 3}}) == default


def test_service_monitor_scrapes_the_injector_over_verified_tls() -> None:
    documents = render(SCENARIOS["monitoring"])
    monitor = one(documents, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    service = one(documents, "Service")
    assert selector_matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics"
    tls = endpoint["tlsConfig"]
    assert tls["ca"]["secret"] == {
        "name": one(documents, "Secret")["metadata"]["name"],
        "key": "ca.crt",
    }
    assert tls["serverName"] == f"{INJECTOR}.{NAMESPACE}.svc"


def test_pod_monitor_scrapes_sidecars_everywhere_by_port_name() -> None:
    monitor = one(render(SCENARIOS["monitoring"]), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "bb-admin", "path": "/metrics", "interval": "30s"}


def test_monitors_are_off_by_default() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"ServiceMonitor", "PodMonitor"}


def test_notes_say_how_to_enable_check_and_read_the_hit_ratio() -> None:
    text = notes()
    assert "kubectl label namespace <namespace> burstbuffer.io/inject=enabled" in text
    assert "burstbuffer\\.io/status" in text
    assert "{range .spec.initContainers[*]}" in text
    assert "pods/<pod>:3129/proxy/stats" in text
    assert "burstbuffer_hits_total" not in text  # only with the PodMonitor
    classic = notes({"sidecar": {"nativeSidecar": False, "adminPort": 9000}})
    assert "{range .spec.containers[*]}" in classic
    assert "pods/<pod>:9000/proxy/stats" in classic
    assert "burstbuffer_hits_total" in notes(SCENARIOS["monitoring"])
