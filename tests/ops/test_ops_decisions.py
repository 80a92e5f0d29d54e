"""The pure decisions of `burstbuffer`: rows from /stats, the hit ratio, the certificate
verdict at any moment, where the injector's Secret is found."""

from __future__ import annotations

import base64
import datetime
from typing import Any

import pytest
import trustme

from injector.ops import check, status
from injector.ops.kube import ApiError
from tests.chart.helmchart import SCENARIOS, one, render
from tests.ops.conftest import injected_pod

INJECTOR = check.Injector("burstbuffer-system", "burstbuffer-injector")


def test_hit_ratio_counts_every_answered_request() -> None:
    counted = status.Figures(hits=3, misses=1, coalesced=1, passes=1)
    assert counted.hit_ratio == 0.5
    assert status.Figures().hit_ratio is None


@pytest.mark.parametrize("native", [True, False])
def test_admin_port_is_the_sidecars_named_port(native: bool) -> None:
    pod = injected_pod("p", "ml", 13129, native_sidecar=native)
    assert status.admin_port(pod) == 13129


def test_rows_say_what_is_wrong_with_a_sidecars_figures() -> None:
    pod = injected_pod("p", "ml", 3129)
    stats: dict[str, Any] = {name: 1 for name in status.COUNTERS}
    unavailable = status.row(pod, {**stats, "buffer": "unavailable: read-only"}, None)
    assert unavailable.state == "buffer unavailable: read-only"
    assert unavailable.figures == status.Figures(*[1] * 8)
    missing = status.row(pod, {k: v for k, v in stats.items() if k != "hits"}, None)
    assert (missing.figures, missing.state) == (None, "the sidecar's /stats has no usable 'hits'")
    pod["metadata"]["annotations"]["burstbuffer.io/status"] = "not json"
    assert status.row(pod, stats, None).capture == "?"


def test_totals_add_up_reachable_pods_per_namespace() -> None:
    a = status.row(injected_pod("a", "ml", 1), {n: 2 for n in status.COUNTERS}, None)
    b = status.row(injected_pod("b", "ml", 1), None, "pod is Pending")
    c = status.row(injected_pod("c", "cv", 1), {n: 1 for n in status.COUNTERS}, None)
    totals = status.totals([a, b, c])
    assert [(t.namespace, t.pods, t.unreachable, t.figures.hits) for t in totals] == [
        ("cv", 1, 0, 1),
        ("ml", 2, 1, 2),
    ]


def _pem(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


def _installed(ca: trustme.CA, *names: str) -> tuple[dict[str, Any], dict[str, Any]]:
    issued = ca.issue_cert(*names)
    chain = b"".join(p.bytes() for p in issued.cert_chain_pems)
    configuration = {
        "webhooks": [{"name": "w", "clientConfig": {"caBundle": _pem(ca.cert_pem.bytes())}}]
    }
    return configuration, {"data": {"tls.crt": _pem(chain)}}


def test_the_certificate_verdict_at_any_moment() -> None:
    ca = trustme.CA()
    configuration, secret = _installed(ca, INJECTOR.service_host)
    now = datetime.datetime.now(datetime.UTC)
    verdict = check.ca_bundle_trusts_certificate(INJECTOR, configuration, "tls", secret, now)
    assert verdict.ok, verdict
    later = now + datetime.timedelta(days=400_000)  # trustme certificates end in 3000
    expired = check.ca_bundle_trusts_certificate(INJECTOR, configuration, "tls", secret, later)
    assert not expired.ok and "not valid at validation time" in expired.detail, expired
    assert expired.fix and "rollout restart" in expired.fix


def test_the_certificate_must_name_the_service() -> None:
    configuration, secret = _installed(trustme.CA(), "burstbuffer-injector.elsewhere.svc")
    now = datetime.datetime.now(datetime.UTC)
    verdict = check.ca_bundle_trusts_certificate(INJECTOR, configuration, "tls", secret, now)
    assert not verdict.ok and "subjectAltName" in verdict.detail, verdict


def test_an_empty_ca_bundle_fails() -> None:
    configuration, secret = _installed(trustme.CA(), INJECTOR.service_host)
    del configuration["webhooks"][0]["clientConfig"]["caBundle"]
    now = datetime.datetime.now(datetime.UTC)
    verdict = check.ca_bundle_trusts_certificate(INJECTOR, configuration, "tls", secret, now)
    assert (verdict.ok, verdict.detail) == (False, "webhook w has no caBundle")


@pytest.mark.parametrize(
    ("scenario", "secret"),
    [
        ("default", "burstbuffer-injector-tls"),
        ("cert-manager", "burstbuffer-injector-cert-manager-tls"),
    ],
)
def test_the_secret_is_the_one_the_deployment_serves(scenario: str, secret: str) -> None:
    assert check.tls_secret_name(one(render(SCENARIOS[scenario]), "Deployment")) == secret
    assert check.tls_secret_name(ApiError(404, "NotFound", "gone")) is None
