"""The classic-sidecar fallback (`sidecar.nativeSidecar: false`) on the kubelet: the sidecar
is the first regular container, held ready by its postStart hook before the app starts;
the app's downloads go through it as with a native sidecar.

A classic sidecar does not end with the app (the kubelet has no such notion before native
sidecars), so a Job's pod keeps running after its app finished, unless the app stops the
sidecar: its command starts with `trap '<QUIT>' EXIT`, the documented line that POSTs to
the sidecar's `/quitquitquit` on loopback (as Istio's `/quitquitquit` and Linkerd's
`/shutdown` are used), and the sidecar stops as on SIGTERM, with exit status 0, so the
Job completes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cluster.apps import (
    app_log,
    completed_download,
    download_job,
    origin_hash,
    printed_hashes,
    printed_stats,
)
from tests.cluster.conftest import INJECTED, Cluster, Origin, Release, injected

PATH = "/labels.bin"
# The line docs/injector.md gives (the chart's default admin port): wget goes straight to
# loopback, which no_proxy names.
QUIT = "wget -q -O /dev/null --post-data= http://127.0.0.1:3129/quitquitquit"


@pytest.fixture(scope="module")
def release_values() -> tuple[str, ...]:
    return ("sidecar.upstreamCA.configMapName=dataset-ca", "sidecar.nativeSidecar=false")


def test_a_job_downloads_through_a_classic_sidecar(
    cluster: Cluster,
    release: Release,
    origin: Origin,
    training_namespace: Callable[[str], str],
) -> None:
    namespace = training_namespace("classic")
    cluster.apply(namespace, download_job(origin, PATH))

    def app_finished() -> bool:
        pods = cluster.pods(namespace, "app=download")
        statuses = {s.name: s for s in (pods[0].status.container_statuses or [])} if pods else {}
        return "app" in statuses and statuses["app"].state.terminated is not None

    cluster.wait_for("the app container's end", app_finished, timeout=240)
    (pod,) = cluster.pods(namespace, "app=download")
    assert injected(pod)
    assert [c.name for c in pod.spec.containers] == [INJECTED, "app"]
    assert pod.spec.containers[0].lifecycle.post_start is not None
    (app,) = [s for s in pod.status.container_statuses if s.name == "app"]
    assert app.state.terminated.exit_code == 0
    log = app_log(cluster, namespace, pod.metadata.name)
    assert printed_hashes(log) == {origin_hash(origin, PATH)}, log
    stats = printed_stats(log)
    assert (stats["misses"], stats["hits"], stats["upstream_requests"]) == (1, 2, 1), stats
    # The sidecar runs on: the pod is not done, and neither is its Job.
    (sidecar,) = [s for s in pod.status.container_statuses if s.name == INJECTED]
    assert sidecar.state.running is not None and pod.status.phase == "Running"


def test_a_job_that_stops_its_classic_sidecar_completes(
    cluster: Cluster,
    release: Release,
    origin: Origin,
    training_namespace: Callable[[str], str],
) -> None:
    namespace = training_namespace("classic-quit")
    job = download_job(origin, PATH)
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    command[-1] = f"trap '{QUIT}' EXIT\n{command[-1]}"
    # Waits for the Job's Complete condition, and checks every file the app downloaded.
    pod, stats = completed_download(cluster, namespace, origin, PATH, job)
    assert injected(pod) and [c.name for c in pod.spec.containers] == [INJECTED, "app"]
    assert (stats["misses"], stats["hits"], stats["upstream_requests"]) == (1, 2, 1), stats
    found = cluster.core.read_namespaced_pod(pod.metadata.name, namespace)
    ends = {s.name: s.state.terminated for s in found.status.container_statuses}
    assert all(ends.values()), ends
    assert (ends["app"].exit_code, ends[INJECTED].exit_code) == (0, 0), ends
    assert found.status.phase == "Succeeded"
    log = cluster.kubectl("logs", "-n", namespace, pod.metadata.name, "-c", INJECTED)
    assert "stopping: asked by POST /quitquitquit" in log, log
