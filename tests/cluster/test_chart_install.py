"""The chart on a real API server: installed, upgraded and uninstalled by Helm, and every
value combination of the chart tests accepted by server-side validation."""

from __future__ import annotations

import copy
import json
from functools import partial
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.chart.crds import SCHEMAS
from tests.chart.helmchart import SCENARIOS
from tests.cluster.conftest import CHART, Cluster, Release, helm_install

RELEASE = Release("bb-lifecycle", "bb-lifecycle")
# What the chart makes, by kind; none may be left once it is uninstalled.
KINDS = (
    "mutatingwebhookconfigurations", "clusterroles", "clusterrolebindings", "secrets",
    "serviceaccounts", "roles", "rolebindings", "configmaps", "deployments", "services",
    "poddisruptionbudgets", "statefulsets",
)  # fmt: skip


def _made_by(cluster: Cluster, release: Release) -> list[str]:
    """Objects of every kind, in every namespace, carrying the release's instance label."""
    selector = f"app.kubernetes.io/instance={release.name}"
    found = cluster.kubectl("get", ",".join(KINDS), "-A", "-l", selector, "-o", "name")
    return found.split()


def test_install_upgrade_uninstall_leaves_nothing(cluster: Cluster) -> None:
    helm_install(cluster, RELEASE)
    deployment = cluster.apps.read_namespaced_deployment(_injector(cluster), RELEASE.namespace)
    assert deployment.status.ready_replicas == deployment.spec.replicas == 2
    assert [w["timeoutSeconds"] for w in _webhooks(cluster)] == [10, 10]
    assert all(w["clientConfig"]["caBundle"] for w in _webhooks(cluster))

    helm_install(cluster, RELEASE, "webhook.timeoutSeconds=5", "injector.replicaCount=1",
                 action="upgrade")  # fmt: skip
    assert [w["timeoutSeconds"] for w in _webhooks(cluster)] == [5, 5]
    deployment = cluster.apps.read_namespaced_deployment(_injector(cluster), RELEASE.namespace)
    assert deployment.status.ready_replicas == deployment.spec.replicas == 1
    assert _made_by(cluster, RELEASE)

    cluster.run("helm", "uninstall", RELEASE.name, "-n", RELEASE.namespace, "--wait")
    assert _made_by(cluster, RELEASE) == []
    left = cluster.kubectl("get", "secrets,configmaps", "-n", RELEASE.namespace, "-o", "name")
    # Only what the namespace itself holds (its root CA ConfigMap) is left.
    assert left.split() == ["configmap/kube-root-ca.crt"]
    cluster.core.delete_namespace(RELEASE.namespace)


def _webhooks(cluster: Cluster) -> list[dict[str, Any]]:
    """The webhooks of the release's MutatingWebhookConfiguration, as the API server has them."""
    found = cluster.kubectl("get", "mutatingwebhookconfiguration", _injector(cluster), "-o", "yaml")
    webhooks: list[dict[str, Any]] = yaml.safe_load(found)["webhooks"]
    return webhooks


def _injector(cluster: Cluster) -> str:
    names = cluster.kubectl(
        "get", "deployments", "-n", RELEASE.namespace, "-l",
        "app.kubernetes.io/component=injector", "-o", "jsonpath={.items[*].metadata.name}",
    ).split()  # fmt: skip
    assert len(names) == 1, names
    return names[0]


@pytest.fixture(scope="module")
def custom_resources(cluster: Cluster) -> None:
    """The CRDs of cert-manager and the Prometheus Operator that the chart may render,
    from the schemas the chart tests validate against (tests/chart/crds.py)."""
    for (api_version, kind), schema in SCHEMAS.items():
        cluster.kubectl("apply", "--server-side", "-f", "-",
                        stdin=yaml.safe_dump(_crd(api_version, kind, schema)))  # fmt: skip
        plural = f"{kind.lower()}s.{api_version.split('/')[0]}"
        cluster.wait_for(f"{plural} established", partial(_established, cluster, plural), 60)


def _established(cluster: Cluster, crd: str) -> bool:
    """Whether the API server serves `crd`. Polled here because `kubectl wait` fails, rather
    than waits, on a definition so new that it has no conditions yet."""
    found = client.ApiextensionsV1Api(cluster.api).read_custom_resource_definition(crd)
    conditions = found.status.conditions if found.status else None
    return any(c.type == "Established" and c.status == "True" for c in conditions or ())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_passes_server_side_validation(
    cluster: Cluster, custom_resources: None, scenario: str
) -> None:
    """What `helm template` renders is accepted by the API server in a dry run with strict
    field validation: a misspelt or misplaced field is an error, not pruned silently."""
    rendered = _template(cluster, SCENARIOS[scenario])
    done = cluster.run(
        "kubectl", "apply", "--dry-run=server", "--validate=strict", "-n", "default", "-f", "-",
        stdin=rendered, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_server_side_validation_can_fail(cluster: Cluster) -> None:
    documents = [d for d in yaml.safe_load_all(_template(cluster, {})) if d]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
    done = cluster.run(
        "kubectl", "apply", "--dry-run=server", "--validate=strict", "-n", "default", "-f", "-",
        stdin=yaml.safe_dump(broken), check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "imagePullPolice" in done.stderr


def _template(cluster: Cluster, values: dict[str, Any]) -> str:
    """`helm template` for this cluster's Kubernetes version (offline, Helm assumes an old one)."""
    version = json.loads(cluster.kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
    return cluster.run(
        "helm", "template", "bb", CHART, "--namespace", "default", "--kube-version", version,
        "-f", "-", stdin=yaml.safe_dump(values),
    ).stdout  # fmt: skip


def _crd(api_version: str, kind: str, schema: dict[str, Any]) -> dict[str, Any]:
    group, version = api_version.split("/")
    plural = f"{kind.lower()}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _structural(schema)},
                }
            ],
        },
    }


def _structural(schema: Any) -> Any:
    """A JSON schema as a CRD takes it: `additionalProperties: false` is what the API
    server's strict field validation does for every object with properties, and is not
    allowed beside them; apiVersion, kind and metadata are the API server's own."""
    if isinstance(schema, list):
        return [_structural(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {k: _structural(v) for k, v in schema.items() if k not in ("additionalProperties",)}
    if "const" in result:  # not in a CRD's schema language: the one-value enum says the same
        result["enum"] = [result.pop("const")]
    if "enum" in result and "type" not in result:  # a structural schema types every field
        result["type"] = {str: "string", bool: "boolean", int: "integer"}[type(result["enum"][0])]
    if schema.get("additionalProperties") not in (None, False):
        result["additionalProperties"] = _structural(schema["additionalProperties"])
    if result.get("type") == "array" and "items" not in result:  # items of any kind
        result["items"] = {"x-kubernetes-preserve-unknown-fields": True}
    properties = result.get("properties")
    if isinstance(properties, dict) and "metadata" in properties:
        properties.pop("metadata")
        properties["apiVersion"] = {"type": "string"}
        properties["kind"] = {"type": "string"}
        result["required"] = [r for r in result.get("required", []) if r != "metadata"]
    return result
