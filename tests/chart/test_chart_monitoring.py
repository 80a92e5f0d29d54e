"""The Grafana dashboard and the PrometheusRule as the chart renders them: off by
default, where Grafana and the Prometheus Operator find them when enabled.

What their queries do is tested elsewhere: every alert with promtool
(test_chart_alerts.py), every panel against a real Prometheus scraping a real sidecar and
injector (test_chart_prometheus.py).
"""

from __future__ import annotations

import json
from typing import Any

from helmchart import INJECTOR, NAMESPACE, SCENARIOS, notes, of_kind, one, render

from tests.monitoring import ALL_RULES, DASHBOARD, rendered_rules

DASHBOARD_VALUES = {"grafana": {"dashboards": {"enabled": True}}}
RULE_VALUES = {"prometheus": {"prometheusRule": {"enabled": True}}}


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
        "Client connections",
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
