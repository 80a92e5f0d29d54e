"""The parent tier on a real cluster: the chart's Squid StatefulSet runs with its volume
claim bound by the cluster's default StorageClass, and a second pod's misses are served
by it: the origin sends each object once, whichever pod asked first."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cluster.apps import completed_download
from tests.cluster.conftest import Cluster, Origin, Release, origin_requests

PATH = "/train-0.bin"


@pytest.fixture(scope="module")
def release_values(origin: Origin) -> tuple[str, ...]:
    # Squid forwards only what the chart intercepts: the origin's host is the one list.
    return (
        "sidecar.upstreamCA.configMapName=dataset-ca",
        f"sidecar.intercept={{{origin.host}}}",
        "parentCache.enabled=true",
        "parentCache.replicas=1",
        "parentCache.cacheSizeGi=1",
        "parentCache.resources.requests.cpu=100m",
        "parentCache.resources.requests.memory=256Mi",
    )


def test_the_second_pods_miss_is_served_by_the_parent(
    cluster: Cluster,
    release: Release,
    origin: Origin,
    training_namespace: Callable[[str], str],
) -> None:
    claims = cluster.core.list_namespaced_persistent_volume_claim(release.namespace).items
    assert [c.status.phase for c in claims] == ["Bound"]
    assert claims[0].spec.storage_class_name == "standard"  # the cluster's default

    before = origin_requests(cluster, origin, PATH)
    for index in range(2):
        _, stats = completed_download(cluster, training_namespace(f"tier{index}"), origin, PATH)
        # Each pod's own buffer misses once; the parent answers the second pod's miss.
        assert (stats["misses"], stats["hits"]) == (1, 2), stats
        assert origin_requests(cluster, origin, PATH) == before + 1
