"""Injected pods at work on the node: unmodified clients in the app image download from an
HTTPS origin in the cluster through the sidecar, trusting the pod CA by what the
injector set alone; a Job completes while its native sidecar runs beside it; a container
restart keeps the buffer."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cluster.apps import (
    PRINT_STATS,
    app_log,
    app_pod,
    completed_download,
    origin_hash,
    printed_hashes,
    printed_stats,
)
from tests.cluster.conftest import Cluster, Origin, Release, injected, origin_requests

PATH = "/train-0.bin"


@pytest.fixture(scope="module")
def release_values() -> tuple[str, ...]:
    return ("sidecar.upstreamCA.configMapName=dataset-ca",)


def test_a_job_downloads_through_the_sidecar_and_completes(
    cluster: Cluster,
    release: Release,
    origin: Origin,
    training_namespace: Callable[[str], str],
) -> None:
    namespace = training_namespace("job")
    before = origin_requests(cluster, origin, PATH)
    pod, stats = completed_download(cluster, namespace, origin, PATH)
    assert injected(pod)
    assert (stats["misses"], stats["hits"], stats["upstream_requests"]) == (1, 2, 1), stats
    assert origin_requests(cluster, origin, PATH) == before + 1

    def sidecar_ended() -> bool:
        found = cluster.core.read_namespaced_pod(pod.metadata.name, namespace)
        (status,) = [s for s in found.status.init_container_statuses if s.name == "burstbuffer"]
        return found.status.phase == "Succeeded" and status.state.terminated is not None

    cluster.wait_for("the pod's end, its native sidecar's with it", sidecar_ended)


def test_a_restarted_container_finds_the_buffer(
    cluster: Cluster,
    release: Release,
    origin: Origin,
    training_namespace: Callable[[str], str],
) -> None:
    """The buffer is the pod's (an emptyDir), not a container's: the app restarted finds
    its object stored (its first request a hit), and so does the sidecar restarted."""
    namespace = training_namespace("restart")
    path = "/labels.bin"
    url = origin.url(path)
    # Download, print the stats, and exit (to be restarted) when the test says so.
    script = (
        f"wget -q -O /tmp/labels {url} && sha256sum /tmp/labels && {PRINT_STATS} && "
        "while [ ! -e /tmp/restart ]; do sleep 0.2; done; exit 1"
    )
    pod = {"apiVersion": "v1", "kind": "Pod", **app_pod(origin, script)}
    pod["metadata"]["name"] = "download"
    cluster.apply(namespace, pod)

    def downloaded(restarts: int) -> Callable[[], bool]:
        def ready() -> bool:
            found = cluster.core.read_namespaced_pod("download", namespace)
            statuses = {s.name: s for s in found.status.container_statuses or []}
            app = statuses.get("app")
            if app is None or app.restart_count < restarts or not app.state.running:
                return False
            log = cluster.kubectl("logs", "-n", namespace, "download", "-c", "app", check=False)
            return "STATS" in log

        return ready

    cluster.wait_for("the first download", downloaded(0))
    first = printed_stats(app_log(cluster, namespace, "download"))
    assert (first["misses"], first["hits"]) == (1, 0), first

    cluster.kubectl("exec", "-n", namespace, "download", "-c", "app", "--", "touch", "/tmp/restart")
    cluster.wait_for("the restarted app's download", downloaded(1))
    log = app_log(cluster, namespace, "download")
    assert printed_hashes(log) == {origin_hash(origin, path)}
    again = printed_stats(log)
    assert (again["misses"], again["hits"], again["upstream_requests"]) == (1, 1, 1), again

    # The sidecar stopped (SIGTERM to its main process) is restarted by the kubelet, and
    # serves what the buffer holds: the next download is a hit of a fresh process.
    cluster.kubectl("exec", "-n", namespace, "download", "-c", "burstbuffer", "--",
                    "python", "-c", "import os, signal; os.kill(1, signal.SIGTERM)")  # fmt: skip

    def sidecar_restarted() -> bool:
        found = cluster.core.read_namespaced_pod("download", namespace)
        (status,) = [s for s in found.status.init_container_statuses if s.name == "burstbuffer"]
        return status.restart_count >= 1 and bool(status.ready)

    cluster.wait_for("the sidecar's restart", sidecar_restarted)
    cluster.kubectl("exec", "-n", namespace, "download", "-c", "app", "--",
                    "wget", "-q", "-O", "/dev/null", url)  # fmt: skip
    stats = cluster.stats(namespace, "download")
    assert (stats["misses"], stats["hits"], stats["entries"]) == (0, 1, 1), stats
    assert origin_requests(cluster, origin, path) == 1
