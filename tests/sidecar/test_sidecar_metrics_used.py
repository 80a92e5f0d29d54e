"""Every sidecar metric the chart's dashboard and alerts read is one a live sidecar exports.

A real sidecar serves a miss, a hit and a pass (so that the labelled series exist too),
and its `/metrics` is scraped; the names come from the PromQL as the chart ships it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness import OriginServer, Sidecar, http_get
from tests.promql import exported_names, names_used, sidecar_names
from tests.sidecar.conftest import curl

pytestmark = pytest.mark.e2e


def test_the_dashboard_and_the_alerts_read_only_exported_sidecar_metrics(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    body = (dataset / "small.bin").read_bytes()
    for url in (
        origin.url("small.bin"),
        origin.url("small.bin"),
        origin.url("small.bin", nostore=1),
    ):
        download = curl(sidecar, url)
        assert download.returncode == 0 and download.body == body, download.stderr
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits"], stats["passes"]) == (1, 1, 1)

    status, metrics = http_get(f"http://127.0.0.1:{sidecar.admin_port}/metrics")
    assert status == 200
    exported = exported_names(metrics.decode())
    used = names_used()
    wanted = sidecar_names(used)
    assert {"burstbuffer_hits_total", "burstbuffer_capacity_bytes"} <= wanted
    missing = {name: sorted(used[name]) for name in wanted - exported}
    assert missing == {}
