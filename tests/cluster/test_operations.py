"""The operators' view on a real cluster: `burstbuffer status` and `check` (and the same as
`kubectl burstbuffer`), and what happens to pod creation while the injector is down,
under each failurePolicy the chart can set."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from tests.cluster.apps import PRINT_STATS, app_pod
from tests.cluster.conftest import (
    CLI,
    ENABLED,
    Cluster,
    Origin,
    Release,
    helm_install,
    injected,
)
from tests.cluster.images import APP_IMAGE

INJECTOR = "burstbuffer-injector"  # the chart's default full name of the injector


@pytest.fixture(scope="module")
def release_values() -> tuple[str, ...]:
    return ("sidecar.upstreamCA.configMapName=dataset-ca",)


def _cli(cluster: Cluster, *args: str, kubectl: bool = False) -> tuple[int, str]:
    argv = ("kubectl", "burstbuffer", *args) if kubectl else (str(CLI), *args)
    done = cluster.run(*argv, check=False)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("kubectl", [False, True], ids=["burstbuffer", "kubectl-burstbuffer"])
def test_status_reads_every_sidecar_and_check_passes(
    cluster: Cluster,
    release: Release,
    origin: Origin,
    training_namespace: Callable[[str], str],
    kubectl: bool,
) -> None:
    namespace = training_namespace("ops")
    script = f"wget -q -O /dev/null {origin.url('/labels.bin')} && {PRINT_STATS} && sleep 3600"
    pod = {"apiVersion": "v1", "kind": "Pod", **app_pod(origin, script)}
    pod["metadata"]["name"] = "reader"
    cluster.apply(namespace, pod)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "pod/reader", "--timeout=3m")
    cluster.wait_for(
        "the download",
        lambda: "STATS" in cluster.kubectl("logs", "-n", namespace, "reader", "-c", "app"),
    )

    status, output = _cli(cluster, "status", "-n", namespace, "-o", "json", kubectl=kubectl)
    assert status == 0, output
    (read,) = json.loads(output)["pods"]
    assert (read["pod"], read["reachable"], read["misses"], read["entries"]) == (
        "reader", True, 1, 1,
    )  # fmt: skip
    status, table = _cli(cluster, "status", "-n", namespace, kubectl=kubectl)
    assert status == 0 and "reader" in table and "proxy-env" in table, table

    status, output = _cli(cluster, "check", "-n", namespace, kubectl=kubectl)
    assert status == 0, output
    assert output.count("ok ") == 5, output


def _injector_replicas(cluster: Cluster, release: Release, replicas: int) -> None:
    cluster.kubectl("scale", "-n", release.namespace, f"deployment/{INJECTOR}",
                    f"--replicas={replicas}")  # fmt: skip
    if replicas:
        cluster.kubectl("rollout", "status", "-n", release.namespace, f"deployment/{INJECTOR}",
                        "--timeout=180s")  # fmt: skip
    else:
        cluster.wait_for(
            "the injector's pods to go",
            lambda: not cluster.pods(release.namespace, "app.kubernetes.io/component=injector"),
        )


def _sleeper(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "app", "image": APP_IMAGE, "command": ["sleep", "3600"]}],
            "terminationGracePeriodSeconds": 1,
        },
    }


def test_the_injector_down_under_each_failure_policy(
    cluster: Cluster, release: Release, make_namespace: Callable[..., str]
) -> None:
    namespace = make_namespace("down", ENABLED)
    _injector_replicas(cluster, release, 0)
    try:
        # Ignore (the chart's default): the pod is made at once, without the sidecar.
        started = time.monotonic()
        cluster.apply(namespace, _sleeper("while-down"))
        assert time.monotonic() - started < 10
        assert not injected(cluster.core.read_namespaced_pod("while-down", namespace))
        status, output = _cli(cluster, "check", "-n", namespace)
        assert status == 1, output
        assert "FAIL  injector Deployment" in output and "came back without the sidecar" in output

        # Fail: the pod is refused, with the webhook's name in the reason.
        helm_install(cluster, release, "sidecar.upstreamCA.configMapName=dataset-ca",
                     "webhook.failurePolicy=Fail", action="upgrade")  # fmt: skip
        _injector_replicas(cluster, release, 0)
        refused = cluster.run("kubectl", "apply", "-n", namespace, "-f", "-", check=False,
                              stdin=json.dumps(_sleeper("refused")))  # fmt: skip
        assert refused.returncode != 0
        assert "failed calling webhook" in refused.stderr, refused.stderr
    finally:
        _injector_replicas(cluster, release, 2)
    # Back up: new pods are injected again.
    cluster.apply(namespace, _sleeper("after"))
    assert injected(cluster.core.read_namespaced_pod("after", namespace))
    status, output = _cli(cluster, "check", "-n", namespace)
    assert status == 0, output
