"""Every injector metric the chart's dashboard and alerts read is one a live injector exports.

A real `burstbuffer-injector serve` injects a pod, skips one that opts out and refuses a
request (so that the labelled series exist too); its `/metrics` is scraped over TLS.
"""

from __future__ import annotations

from pathlib import Path

import trustme
from podcheck import admission_review
from webhook import start_webhook, write_pair

from tests.promql import OUTSIDE, exported_names, injector_names, names_used, sidecar_names

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train", "namespace": "ml"},
    "spec": {"containers": [{"name": "train", "image": "python:3.12"}]},
}
OPTED_OUT = {**POD, "metadata": {"name": "keep", "labels": {"burstbuffer.io/inject": "false"}}}


def test_the_dashboard_and_the_alerts_read_only_exported_injector_metrics(
    tmp_path: Path,
) -> None:
    ca = trustme.CA()
    write_pair(ca, tmp_path)
    webhook = start_webhook(tmp_path)
    try:
        assert webhook.review(ca, admission_review(POD))["patch"]
        assert "patch" not in webhook.review(ca, admission_review(OPTED_OUT))
        assert webhook.request(ca, "POST", "/mutate", b"{}", "text/plain")[0] == 415
        status, metrics = webhook.request(ca, "GET", "/metrics")
    finally:
        assert webhook.stop() == 0
    assert status == 200
    exported = exported_names(metrics.decode())
    used = names_used()
    wanted = injector_names(used)
    assert "burstbuffer_injector_review_seconds_bucket" in wanted
    missing = {name: sorted(used[name]) for name in wanted - exported}
    assert missing == {}
    # Every other name is a sidecar's (tests/sidecar checks those) or Prometheus' or the
    # API server's own.
    assert set(used) - wanted - sidecar_names(used) <= OUTSIDE
