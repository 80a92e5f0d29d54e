"""Another mutating webhook beside ours, called after it (the API server calls webhook
configurations in name order): it puts an init container first and appends a container
to every pod of its namespaces (`other_webhook.py`).

With the chart's default `webhook.reinvocationPolicy: Never` the injector is called once,
before those containers exist: they are left as the other webhook made them (no proxy,
no pod CA: their downloads go to the origins directly, uncached), and the added init
container runs before the native sidecar. With `IfNeeded` the API server calls the
injector again after the other webhook changed the pod: the containers added since are
wired to the sidecar the pod has, and the sidecar goes back in front of them, so that
their downloads are cached too (`injector.mutate.rewire`)."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from kubernetes import client

from tests.cluster.apps import (
    app_log,
    app_pod,
    download_job,
    job_completed,
    origin_hash,
    printed_hashes,
)
from tests.cluster.conftest import (
    INJECTED,
    Cluster,
    Origin,
    Release,
    helm_install,
    origin_requests,
    serve_tls,
)
from tests.cluster.images import APP_IMAGE

PATH = "/labels.bin"
WEBHOOK_SCRIPT = Path(__file__).resolve().parent / "other_webhook.py"
LABEL = ("other-webhook", "enabled")  # a namespace's pods go to the other webhook too
BUNDLE = "/etc/burstbuffer/trust/ca-bundle.crt"


@pytest.fixture(scope="module")
def release_values() -> tuple[str, ...]:
    return ("sidecar.upstreamCA.configMapName=dataset-ca",)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _added_containers(origin: Origin) -> dict[str, str]:
    """The other webhook's containers (as its environment): both download PATH with the
    image's wget, with nothing but what they were given at admission."""
    url = origin.url(PATH)
    get = ["wget", "-q", "-O", "/dev/null", url]
    init = {"name": "extra-init", "image": APP_IMAGE, "command": get}
    fetch = f"wget -q -O /tmp/extra {url} && sha256sum /tmp/extra"
    regular = {"name": "extra", "image": APP_IMAGE, "command": ["sh", "-c", fetch]}
    return {"INIT_CONTAINER": json.dumps(init), "CONTAINER": json.dumps(regular)}


@pytest.fixture(scope="module")
def other_webhook(cluster: Cluster, origin: Origin) -> Iterator[None]:
    """The other webhook running in a namespace of its own, with its configuration named
    to be called after ours; both removed at the end."""
    namespace = f"other-webhook-{secrets.token_hex(3)}"
    configuration = f"zz-other-webhook-{secrets.token_hex(3)}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    ca = trustme.CA()
    leaf = ca.issue_cert(f"other-webhook.{namespace}.svc")
    hook = {
        "name": "containers.other-webhook.example.com",
        "clientConfig": {
            "service": {"name": "other-webhook", "namespace": namespace, "path": "/mutate"},
            "caBundle": _b64(ca.cert_pem.bytes()),
        },
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                   "resources": ["pods"], "scope": "Namespaced"}],
        "namespaceSelector": {"matchLabels": dict([LABEL])},
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        # Down, it would refuse the pods rather than let a test pass without it.
        "failurePolicy": "Fail",
        "reinvocationPolicy": "Never",
        "timeoutSeconds": 10,
    }  # fmt: skip
    serve_tls(cluster, namespace, "other-webhook", leaf, WEBHOOK_SCRIPT, _added_containers(origin))
    cluster.kubectl(
        "apply", "-f", "-", stdin=yaml.safe_dump({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": configuration},
            "webhooks": [hook],
        }),
    )  # fmt: skip
    yield
    cluster.kubectl("delete", "mutatingwebhookconfiguration", configuration)
    cluster.core.delete_namespace(namespace, propagation_policy="Background")


def _namespace(cluster: Cluster, training_namespace: Callable[[str], str], prefix: str) -> str:
    """An opted-in namespace whose pods the other webhook mutates too."""
    namespace = training_namespace(prefix)
    cluster.core.patch_namespace(namespace, {"metadata": {"labels": dict([LABEL])}})
    return namespace


def _admitted(cluster: Cluster, namespace: str, origin: Origin) -> dict[str, Any]:
    """A pod as the admission chain makes it (a server-side dry run: every webhook is
    called, nothing is stored), once the other webhook is called (the API server picks
    up a new webhook configuration within a few seconds)."""
    pod = {"apiVersion": "v1", "kind": "Pod", **app_pod(origin, "true")}
    pod["metadata"]["name"] = "probe"
    made: dict[str, Any] = {}

    def mutated_by_both() -> bool:
        out = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-n", namespace,
                              "-f", "-", stdin=json.dumps(pod))  # fmt: skip
        made.update(json.loads(out))
        return "extra" in _names(made, "containers")

    cluster.wait_for("the other webhook's containers in a new pod", mutated_by_both, timeout=60)
    return made


def _names(pod: dict[str, Any], key: str) -> list[str]:
    return [c["name"] for c in pod["spec"].get(key) or []]


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in (spec.get("initContainers") or []) + spec["containers"]}


def _proxied_and_trusting(container: dict[str, Any]) -> tuple[bool, bool]:
    """Whether the container goes through the sidecar, and whether it trusts the pod CA."""
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    proxied = env.get("https_proxy") == "http://127.0.0.1:3128"
    return proxied, env.get("SSL_CERT_FILE") == BUNDLE


def test_with_never_the_containers_added_after_ours_are_left_as_the_other_webhook_made_them(
    cluster: Cluster,
    release: Release,
    origin: Origin,
    other_webhook: None,
    training_namespace: Callable[[str], str],
) -> None:
    namespace = _namespace(cluster, training_namespace, "never")
    pod = _admitted(cluster, namespace, origin)
    # Ours first (called first), then the other's: its init container before the sidecar.
    assert _names(pod, "initContainers") == ["extra-init", INJECTED]
    assert _names(pod, "containers") == ["app", "extra"]
    containers = _containers(pod)
    assert _proxied_and_trusting(containers["app"]) == (True, True)
    assert _proxied_and_trusting(containers["extra-init"]) == (False, False)
    assert _proxied_and_trusting(containers["extra"]) == (False, False)


def test_with_if_needed_they_are_wired_to_the_sidecar_and_their_downloads_cached(
    cluster: Cluster,
    release: Release,
    origin: Origin,
    other_webhook: None,
    training_namespace: Callable[[str], str],
    release_values: tuple[str, ...],
) -> None:
    helm_install(cluster, release, *release_values, "webhook.reinvocationPolicy=IfNeeded",
                 action="upgrade")  # fmt: skip
    namespace = _namespace(cluster, training_namespace, "ifneeded")
    pod = _admitted(cluster, namespace, origin)
    assert _names(pod, "initContainers") == [INJECTED, "extra-init"]
    assert _names(pod, "containers") == ["app", "extra"]
    for name, container in _containers(pod).items():
        if name != INJECTED:
            assert _proxied_and_trusting(container) == (True, True), name

    # Run: the added init container's download is the one miss (the origin's one GET),
    # the app's three and the added container's are hits.
    before = origin_requests(cluster, origin, PATH)
    cluster.apply(namespace, download_job(origin, PATH))
    job_completed(cluster, namespace, "download")
    (done,) = cluster.pods(namespace, "app=download")
    expected = origin_hash(origin, PATH)
    assert printed_hashes(app_log(cluster, namespace, done.metadata.name)) == {expected}
    extra_log = cluster.kubectl("logs", "-n", namespace, done.metadata.name, "-c", "extra")
    assert extra_log.split()[0] == expected, extra_log
    assert origin_requests(cluster, origin, PATH) == before + 1
