"""`burstbuffer check` against the chart as rendered by Helm, stored in the API server
stand-in, with the real injector serving the chart's certificate behind its Service:
every check passes on a sound installation, and each way of breaking it fails the
check that should fail, with its fix, and a non-zero exit status."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.chart.helmchart import INJECTOR, one, render
from tests.chart.helmchart import NAMESPACE as RELEASE_NAMESPACE
from tests.injector.webhook import Webhook, start_webhook
from tests.ops.conftest import NAMESPACE, Cluster, namespace

CHECKS = ("deployment", "webhook", "ca", "namespace", "dry-run")
# The kinds of the chart the checks read (the stand-in stores no others).
STORED = ("Deployment", "Service", "Secret", "ConfigMap", "MutatingWebhookConfiguration")


@pytest.fixture(scope="module")
def chart() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def injector(
    chart: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Webhook]:
    """The real injector, with the chart's serving certificate and configuration."""
    directory = tmp_path_factory.mktemp("injector")
    for key, blob in one(chart, "Secret")["data"].items():
        (directory / key).write_bytes(base64.b64decode(blob))
    config = directory / "config.yaml"
    config.write_text(one(chart, "ConfigMap")["data"]["config.yaml"])
    webhook = start_webhook(directory, "--config", str(config))
    yield webhook
    webhook.stop()


@pytest.fixture
def installed(cluster: Cluster, chart: list[dict[str, Any]], injector: Webhook) -> Cluster:
    """The chart installed, its injector up and ready, namespace `ml` opted in."""
    api = cluster.api
    api.put(namespace(RELEASE_NAMESPACE))
    api.put(namespace(NAMESPACE, {"burstbuffer.io/inject": "enabled"}))
    for document in chart:
        if document["kind"] in STORED:
            api.put(document)
    deployment = _stored(cluster, "Deployment")
    replicas = deployment["spec"]["replicas"]
    deployment["status"] = {"replicas": replicas, "readyReplicas": replicas}
    api.put(deployment)
    api.endpoints[(RELEASE_NAMESPACE, INJECTOR)] = injector.port
    return cluster


def _stored(cluster: Cluster, kind: str) -> dict[str, Any]:
    (found,) = cluster.api.of_kind(kind)
    return copy.deepcopy(found)


def _run(cluster: Cluster, *args: str) -> tuple[int, dict[str, tuple[str, str | None]]]:
    """Exit status, and per check: its line, and its fix line (None when it passed)."""
    result = cluster.burstbuffer("check", *args)
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    verdicts: dict[str, tuple[str, str | None]] = {}
    names = iter(CHECKS)
    for i, line in enumerate(lines):
        if not line.startswith("      fix: "):
            following = lines[i + 1] if i + 1 < len(lines) else ""
            fix = (
                following.removeprefix("      fix: ")
                if following.startswith("      fix:")
                else None
            )
            verdicts[next(names)] = (line, fix)
    assert list(verdicts) == list(CHECKS), result.stdout
    return result.returncode, verdicts


def test_a_sound_installation_passes_every_check(installed: Cluster, injector: Webhook) -> None:
    logged = len(injector.log.read_text())
    status, verdicts = _run(installed)
    assert status == 0, verdicts
    for line, fix in verdicts.values():
        assert line.startswith("ok    ") and fix is None, line
    assert verdicts["deployment"][0] == (
        f"ok    injector Deployment {RELEASE_NAMESPACE}/{INJECTOR} is ready: 2/2 replicas ready"
    )
    assert f"Service {RELEASE_NAMESPACE}/{INJECTOR}" in verdicts["webhook"][0]
    # The chart's certificate lives webhook.certificateValidityDays (3650) days.
    assert verdicts["ca"][0].endswith("expires in 3649 days")
    assert "came back with the burstbuffer container" in verdicts["dry-run"][0]
    # The dry run went through the real injector: it logged the probe pod.
    assert f"pod {NAMESPACE}/burstbuffer-check-" in injector.log.read_text()[logged:]

    result = installed.burstbuffer("check", "-o", "json")
    checks = json.loads(result.stdout)["checks"]
    assert [c["ok"] for c in checks] == [True] * 5
    assert yaml.safe_load(installed.burstbuffer("check", "-o", "yaml").stdout) == {"checks": checks}


def _not_ready(cluster: Cluster) -> None:
    deployment = _stored(cluster, "Deployment")
    deployment["status"] = {"replicas": 2, "readyReplicas": 0}
    cluster.api.put(deployment)


def _remove(kind: str, name: str | None = None) -> Callable[[Cluster], None]:
    def remove(cluster: Cluster) -> None:
        (path,) = [
            p
            for p, o in cluster.api.objects.items()
            if o["kind"] == kind and name in (None, o["metadata"]["name"])
        ]
        del cluster.api.objects[path]

    return remove


def _other_ca(cluster: Cluster) -> None:
    configuration = _stored(cluster, "MutatingWebhookConfiguration")
    other = one(render(), "MutatingWebhookConfiguration")
    configuration["webhooks"] = other["webhooks"]
    cluster.api.put(configuration)


def _not_opted_in(cluster: Cluster) -> None:
    cluster.api.put(namespace(NAMESPACE))


def _injector_down(cluster: Cluster) -> None:
    del cluster.api.endpoints[(RELEASE_NAMESPACE, INJECTOR)]


def _injector_down_failing_closed(cluster: Cluster) -> None:
    _injector_down(cluster)
    configuration = _stored(cluster, "MutatingWebhookConfiguration")
    for hook in configuration["webhooks"]:
        hook["failurePolicy"] = "Fail"
    cluster.api.put(configuration)


def _forbid(what: str) -> Callable[[Cluster], None]:
    return lambda cluster: cluster.api.forbidden.add(what)


# break the installation -> {failing check: (words of its line, words of its fix)}
FAILURES: dict[str, tuple[Callable[[Cluster], None], dict[str, tuple[str, str]]]] = {
    "deployment not ready": (
        _not_ready,
        {"deployment": ("0/2 replicas ready", "describe deployment burstbuffer-injector")},
    ),
    "no deployment": (
        _remove("Deployment"),
        {
            "deployment": (
                '404 deployments.apps "burstbuffer-injector" not found',
                "helm upgrade --install",
            ),
            "ca": ("cannot tell which Secret", "--injector-name"),
        },
    ),
    "no webhook configuration": (
        _remove("MutatingWebhookConfiguration"),
        {
            "webhook": (
                "404 mutatingwebhookconfigurations.admissionregistration.k8s.io",
                "helm upgrade",
            ),
            "ca": ("no webhook configuration to read", "helm upgrade"),
            "dry-run": ("came back without the sidecar", "logs deployment/burstbuffer-injector"),
        },
    ),
    "caBundle of another CA": (
        _other_ca,
        {
            "ca": ("its caBundle does not verify Secret", "rollout restart"),
            "dry-run": ("came back without the sidecar", "failurePolicy Ignore"),
        },
    ),
    "namespace not opted in": (
        _not_opted_in,
        {
            "namespace": (
                "no such label",
                "kubectl label namespace ml burstbuffer.io/inject=enabled",
            ),
            "dry-run": ("came back without the sidecar", "fix the checks above"),
        },
    ),
    "namespace missing": (
        _remove("Namespace", NAMESPACE),
        {
            "namespace": ('404 namespaces "ml" not found', "kubectl create namespace ml"),
            "dry-run": ('404 namespaces "ml" not found', "logs deployment/burstbuffer-injector"),
        },
    ),
    "deployments forbidden": (
        _forbid("get deployments"),
        {
            "deployment": ("403 deployments.apps", "permission to get deployments in namespace"),
            "ca": ("cannot tell which Secret", "--injector-name"),
        },
    ),
    "injector unreachable": (
        _injector_down,
        {"dry-run": ("came back without the sidecar", "failurePolicy Ignore")},
    ),
    "injector unreachable, failurePolicy Fail": (
        _injector_down_failing_closed,
        {
            "dry-run": (
                '500 Internal error occurred: failed calling webhook "namespace.inject',
                "kubectl -n burstbuffer-system logs",
            )
        },
    ),
    "secrets forbidden": (
        _forbid("get secrets"),
        {
            "ca": (
                '403 secrets "burstbuffer-injector-tls" is forbidden',
                "RBAC permission to get secrets",
            )
        },
    ),
    "dry run forbidden": (
        _forbid("create pods"),
        {"dry-run": ("403 pods is forbidden", "RBAC permission to create pods in namespace ml")},
    ),
}


@pytest.mark.parametrize("failure", FAILURES)
def test_each_failure_fails_its_check_with_the_fix(installed: Cluster, failure: str) -> None:
    breaking, expected = FAILURES[failure]
    breaking(installed)
    status, verdicts = _run(installed)
    assert status == 1
    failed = {name for name, (line, _) in verdicts.items() if line.startswith("FAIL  ")}
    assert failed == set(expected), verdicts
    for name, (words, fix_words) in expected.items():
        line, fix = verdicts[name]
        assert words in line, line
        assert fix is not None and fix_words in fix, fix
