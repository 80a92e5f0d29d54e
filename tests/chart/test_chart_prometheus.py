"""The chart's dashboard and alerts against a real Prometheus scraping a real sidecar and a
real injector.

The sidecar serves misses, hits, a pass and a tunnel; the injector (over TLS, as the
ServiceMonitor scrapes it) injects a pod, skips one and refuses a request. Prometheus
scrapes both every second, labelled as the PodMonitor and the ServiceMonitor label them,
with the chart's rules loaded. Then every query of the dashboard, with its variables
filled in as Grafana fills them, must return data through Prometheus' HTTP API; the hit
ratio panel must be the one the sidecar's own counters give; every rule must evaluate
without error; and every sidecar or injector series the alert unit tests
(alerts.test.yaml) feed to promtool must be one the real programs export.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
import yaml

from bench.harness import OriginServer, Sidecar, wait_until
from tests.injector.podcheck import admission_review
from tests.injector.webhook import Webhook, start_webhook, write_pair
from tests.monitoring import (
    ALERT_TESTS,
    ALL_RULES,
    NAMESPACE,
    dashboard_panels,
    dashboard_variables,
    write_rule_file,
)
from tests.prometheus_server import Prometheus, start_prometheus
from tests.sidecar.conftest import curl

pytestmark = pytest.mark.e2e

POD_NAMESPACE, POD = "ml", "train-0"
# Grafana's values for the dashboard's variables: the one namespace and pod, and a rate
# window that holds every sample since the first scrape (the test lasts under a minute).
VARIABLES = {"$__rate_interval": "5m", "$namespace": POD_NAMESPACE, "$pod": POD}
APP_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train", "namespace": POD_NAMESPACE},
    "spec": {"containers": [{"name": "train", "image": "python:3.12"}]},
}
OPTED_OUT = {**APP_POD, "metadata": {"name": "keep", "labels": {"burstbuffer.io/inject": "false"}}}
HIT_RATIO = ("hits", "misses", "coalesced", "passes")
SIDECAR_TOTALS = (*HIT_RATIO, "tunnelled_connections")
# What the injector's load counts: one pod injected, one request refused.
INJECTOR_TOTALS = {
    "burstbuffer_injector_injected_total": 1,
    "burstbuffer_injector_bad_requests_total": 1,
}


@dataclass
class Scraped:
    prometheus: Prometheus
    sidecar: Sidecar


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Webhook, trustme.CA]]:
    ca = trustme.CA()
    directory = tmp_path_factory.mktemp("injector")
    write_pair(ca, directory)
    server = start_webhook(directory)
    yield server, ca
    server.stop()


@pytest.fixture(scope="module")
def sidecar(
    needs_root: None,
    origin: OriginServer,
    hosts_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Sidecar]:
    argv = ["--intercept", "origin.test", "--upstream-ca", str(origin.ca_pem)]
    started = Sidecar(tmp_path_factory.mktemp("sidecar"), hosts_file, argv)
    started.start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def scraped(
    sidecar: Sidecar,
    origin: OriginServer,
    webhook: tuple[Webhook, trustme.CA],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Scraped]:
    """Prometheus scraping a sidecar and the injector, both under load."""
    tmp_path = tmp_path_factory.mktemp("prometheus")
    injector, ca = webhook
    ca.cert_pem.write_to_path(str(tmp_path / "injector-ca.pem"))
    scrape_configs = [
        {
            "job_name": "burstbuffer-sidecars",
            "static_configs": [
                {
                    "targets": [f"127.0.0.1:{sidecar.admin_port}"],
                    "labels": {"namespace": POD_NAMESPACE, "pod": POD},
                }
            ],
        },
        {
            "job_name": "burstbuffer-injector",
            "scheme": "https",
            "tls_config": {"ca_file": str(tmp_path / "injector-ca.pem")},
            "static_configs": [
                {"targets": [f"127.0.0.1:{injector.port}"], "labels": {"namespace": NAMESPACE}}
            ],
        },
    ]
    rules = write_rule_file(tmp_path / "rules.yaml", ALL_RULES)
    prometheus = start_prometheus(tmp_path, scrape_configs, (rules,))
    try:
        # Scraped once before the load: rates then count all of it.
        wait_until(prometheus.targets_up, "both targets scraped")
        small, medium = (origin.url(name) for name in ("small.bin", "medium.bin"))
        for url in (small, small, medium, medium, origin.url("small.bin", nostore=1)):
            download = curl(sidecar, url)
            assert download.returncode == 0 and download.body, download.stderr
        # A slow fill and a client that joins it (coalesced).
        slow = origin.url("small.bin", rate=100_000)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            filling = pool.submit(curl, sidecar, slow)
            wait_until(lambda: sidecar.stats()["fills_in_progress"] == 1, "the slow fill")
            joined = pool.submit(curl, sidecar, slow)
            assert all(d.result().returncode == 0 for d in (filling, joined))
        tunnelled = curl(sidecar, origin.url("small.bin", host="tunnel.test"))
        assert tunnelled.returncode == 0 and tunnelled.body, tunnelled.stderr
        assert injector.review(ca, admission_review(APP_POD))["patch"]
        assert "patch" not in injector.review(ca, admission_review(OPTED_OUT))
        assert injector.request(ca, "POST", "/mutate", b"{}", "text/plain")[0] == 415
        sidecar.wait_for_entries(3)
        stats = sidecar.stats()
        assert [stats[name] for name in HIT_RATIO] == [2, 3, 1, 1], stats
        assert stats["tunnelled_connections"] == 1, stats

        wait_until(
            lambda: _scraped_totals(prometheus) == {**_totals(sidecar), **INJECTOR_TOTALS},
            "a scrape after the load",
        )
        # And one more of each target, so that series born during the load (a first
        # pass's reason, a first refused request's code) have two samples for rate().
        last = max(value for _, value in prometheus.query("timestamp(up)"))
        wait_until(
            lambda: min(value for _, value in prometheus.query("timestamp(up)")) > last,
            "one more scrape",
        )
        yield Scraped(prometheus, sidecar)
    finally:
        prometheus.stop()


def _totals(sidecar: Sidecar) -> dict[str, float]:
    stats = sidecar.stats()
    return {f"burstbuffer_{name}_total": stats[name] for name in SIDECAR_TOTALS}


def _scraped_totals(prometheus: Prometheus) -> dict[str, float]:
    """The last scraped value of each total (-1 while it is 0 or not scraped yet)."""
    names = [f"burstbuffer_{name}_total" for name in SIDECAR_TOTALS] + list(INJECTOR_TOTALS)
    return {name: sum(v for _, v in prometheus.query(name)) or -1 for name in names}


def _filled_in(expression: str) -> str:
    for variable, value in VARIABLES.items():
        expression = expression.replace(variable, value)
    assert "$" not in expression, expression
    return expression


def test_every_dashboard_query_returns_data(scraped: Scraped) -> None:
    empty = {}
    for title, expression in dashboard_panels():
        samples = scraped.prometheus.query(_filled_in(expression))
        if not samples or not all(math.isfinite(value) for _, value in samples):
            empty[title] = (expression, samples)
    assert empty == {}
    for name, expression, label in dashboard_variables():
        values = scraped.prometheus.api(
            f"label/{label}/values", **{"match[]": _filled_in(expression)}
        )
        assert values == [VARIABLES[f"${name}"]], name


def test_the_hit_ratio_panel_is_the_sidecars_own(scraped: Scraped) -> None:
    (expression,) = [e for title, e in dashboard_panels() if title == "Hit ratio"]
    stats = scraped.sidecar.stats()
    expected = stats["hits"] / sum(stats[name] for name in HIT_RATIO)
    assert scraped.prometheus.value(_filled_in(expression)) == pytest.approx(expected)


def test_every_rule_evaluates_on_the_real_series(scraped: Scraped) -> None:
    def rules() -> list[dict[str, object]]:
        groups = scraped.prometheus.api("rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    wait_until(lambda: all(r["health"] != "unknown" for r in rules()), "every rule evaluated")
    assert {str(r["name"]): (r["health"], r.get("lastError", "")) for r in rules()} == {
        str(r["name"]): ("ok", "") for r in rules()
    }


def test_the_alert_tests_use_the_series_the_programs_export(scraped: Scraped) -> None:
    series = [
        entry["series"]
        for group in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for entry in group["input_series"]
    ]
    ours = {s.split("{")[0] for s in series if s.startswith("burstbuffer_")}
    assert "burstbuffer_eviction_policy_info" in ours
    assert ours - scraped.prometheus.names() == set()
