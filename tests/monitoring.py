"""What the chart ships for monitoring, as the tests read it: the Grafana dashboard's
queries and the PrometheusRule as `helm install` renders it."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "burstbuffer"
DASHBOARD = CHART / "dashboards" / "burstbuffer.json"
# promtool's unit tests of the alerts (tests/chart/test_chart_alerts.py runs them).
ALERT_TESTS = Path(__file__).resolve().parent / "chart" / "alerts.test.yaml"
RELEASE = "burstbuffer"
NAMESPACE = "burstbuffer-system"

# Every alert rendered: the injector-down alert needs the ServiceMonitor.
ALL_RULES = {
    "prometheus": {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}
}


def promtool() -> str:
    """Prometheus' promtool, or the test is skipped saying why."""
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("no promtool: Debian's prometheus package (.ci/system-deps installs it)")
    return path


def dashboard_panels() -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard's panels."""
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


def dashboard_variables() -> Iterator[tuple[str, str, str]]:
    """(name, expression, label) of every query variable: `label_values(EXPR, label)`."""
    dashboard = json.loads(DASHBOARD.read_text())
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["query"]["query"])
            assert query, variable["query"]
            yield variable["name"], query.group(1), query.group(2)


def rule_groups(values: dict[str, object] | None = None) -> list[dict[str, Any]]:
    """The PrometheusRule's groups as `helm install` renders them (none when it is off):
    a Prometheus rule file's `groups`."""
    with helm_python.Chart.load(CHART) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    text = next((t for path, t in files.items() if path.endswith("prometheusrule.yaml")), "")
    documents = [d for d in yaml.safe_load_all(text) if d]
    return [group for document in documents for group in document["spec"]["groups"]]


def rendered_rules(values: dict[str, object] | None = None) -> list[dict[str, Any]]:
    """Every rule of the PrometheusRule (none when it is off)."""
    return [rule for group in rule_groups(values) for rule in group["rules"]]


def write_rule_file(path: Path, values: dict[str, object] | None = None) -> Path:
    """The rendered rules as a Prometheus rule file, at `path`."""
    path.write_text(yaml.safe_dump({"groups": rule_groups(values)}, sort_keys=False))
    return path
