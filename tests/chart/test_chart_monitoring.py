"""The Grafana dashboard and the PrometheusRule: off by default, rendered when enabled,
and reading the metrics by the names the sidecar and the injector export.

The names themselves are checked against a live `/metrics` in
tests/sidecar/test_sidecar_metrics_used.py and tests/injector/test_injector_metrics_used.py;
here the PromQL name parser those tests rely on is checked, so that they can fail.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from helmchart import INJECTOR, NAMESPACE, SCENARIOS, notes, of_kind, one, render

from tests.promql import (
    ALL_RULES,
    DASHBOARD,
    dashboard_expressions,
    metric_names,
    rendered_rules,
    rule_expressions,
)

DASHBOARD_VALUES = {"grafana": {"dashboards": {"enabled": True}}}
RULE_VALUES = {"prometheus": {"prometheusRule": {"enabled": True}}}
ORDER = [f"burstbuffer_{name}_total" for name in ("hits", "misses", "coalesced", "passes")]
HIT_RATIO_COUNTERS = set(ORDER)


def _dashboard_config_maps(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in of_kind(documents, "ConfigMap") if "burstbuffer.json" in d["data"]]


def _alerts(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(rule["alert"]): rule for rule in rendered_rules(values)}


def test_dashboard_and_rules_are_off_by_default() -> None:
    documents = render()
    assert _dashboard_config_maps(documents) == []
    assert of_kind(documents, "PrometheusRule") == []


def test_the_dashboard_configmap_carries_the_file_for_grafanas_sidecar() -> None:
    (config_map,) = _dashboard_config_maps(render(DASHBOARD_VALUES))
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == NAMESPACE
    assert json.loads(config_map["data"]["burstbuffer.json"]) == json.loads(DASHBOARD.read_text())


def test_the_dashboard_label_namespace_and_annotations_come_from_values() -> None:
    values = {
        "grafana": {
            "dashboards": {
                "enabled": True,
                "label": "grafana.example.org/dashboard",
                "labelValue": "burstbuffer",
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "ML platform"},
            }
        }
    }
    (config_map,) = _dashboard_config_maps(render(values))
    metadata = config_map["metadata"]
    assert metadata["labels"]["grafana.example.org/dashboard"] == "burstbuffer"
    assert "grafana_dashboard" not in metadata["labels"]
    assert metadata["namespace"] == "monitoring"
    assert metadata["annotations"] == {"grafana_folder": "ML platform"}


def test_notes_name_the_dashboard_when_there_is_one() -> None:
    assert "burstbuffer-dashboard" in notes(DASHBOARD_VALUES)
    assert "dashboard" not in notes()


def test_the_dashboard_has_the_panels_operators_look_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "burstbuffer" and "id" not in dashboard
    titles = [panel["title"] for panel in dashboard["panels"]]
    assert titles == [
        "Hit ratio",
        "Bytes from the buffer vs from upstream",
        "Buffer fill",
        "Fills in progress",
        "Passes by reason",
        "Upstream errors",
        "Injector admission latency",
        "Admission reviews by outcome",
    ]
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert variables == ["datasource", "namespace", "pod"]


def test_the_rules_render_every_alert() -> None:
    documents = render(RULE_VALUES)
    rule = one(documents, "PrometheusRule")
    assert rule["metadata"]["namespace"] == NAMESPACE
    alerts = _alerts(RULE_VALUES)
    assert sorted(alerts) == [
        "BurstbufferBufferFull",
        "BurstbufferBufferUnavailable",
        "BurstbufferHitRatioCollapsed",
        "BurstbufferUpstreamErrors",
        "BurstbufferWebhookFailing",
    ]
    # The injector's `up` exists only where the ServiceMonitor scrapes it.
    with_monitor = _alerts(ALL_RULES)
    down = with_monitor["BurstbufferInjectorDown"]
    assert down["expr"] == f'absent(up{{job="{INJECTOR}", namespace="{NAMESPACE}"}} == 1)'
    assert down["labels"]["severity"] == "warning"
    failing = {**ALL_RULES, "webhook": {"failurePolicy": "Fail"}}
    assert _alerts(failing)["BurstbufferInjectorDown"]["labels"]["severity"] == "critical"
    for alert in with_monitor.values():
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]


def test_the_rules_carry_the_configured_labels() -> None:
    labels = one(render(SCENARIOS["monitoring"]), "PrometheusRule")["metadata"]["labels"]
    assert labels["release"] == "prom" and labels["app.kubernetes.io/name"] == "burstbuffer"


def test_the_hit_ratio_is_the_one_definition() -> None:
    hit_ratio = [expr for title, expr in dashboard_expressions() if title == "Hit ratio"]
    collapsed = [expr for alert, expr in rule_expressions() if alert.endswith("HitRatioCollapsed")]
    assert len(hit_ratio) == 1 and len(collapsed) == 1
    for expression in hit_ratio + collapsed:
        # hits / (hits + misses + coalesced + passes), however the terms are filtered.
        assert metric_names(expression) == HIT_RATIO_COUNTERS
        ratios = re.findall(
            r"\(rate\((\w+).*? / .*?\(rate\((\w+).*?\+ rate\((\w+).*?"
            r"\+ rate\((\w+).*?\+ rate\((\w+)",
            expression,
        )
        assert ratios and all(
            names == ("burstbuffer_hits_total", *sorted(HIT_RATIO_COUNTERS, key=ORDER.index))
            for names in ratios
        ), expression


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("burstbuffer_entries", {"burstbuffer_entries"}),
        (
            'sum by (namespace, pod) (rate(burstbuffer_hits_total{pod=~"$pod"}[$__rate_interval]))',
            {"burstbuffer_hits_total"},
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket[5m] offset 1h)))",
            {"x_seconds_bucket"},
        ),
        ("sum(rate(a_total[5m])) without (instance) / on (pod) group_left b", {"a_total", "b"}),
        ('absent(up{job="a b", namespace="ns"} == 1) and bool 1e3 > 0.95', {"up"}),
        ('label_replace(c, "dst", "$1", "src", "(.*)") unless d:recorded', {"c", "d:recorded"}),
    ],
)
def test_metric_names_are_read_from_promql(expression: str, names: set[str]) -> None:
    assert metric_names(expression) == names


def test_unbalanced_promql_is_refused() -> None:
    with pytest.raises(AssertionError):
        metric_names("sum(rate(burstbuffer_hits_total[5m])")
