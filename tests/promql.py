"""The PromQL the chart ships (the Grafana dashboard, the PrometheusRule) and the metric
names it reads, for the tests that check those names against a live `/metrics`.

A name is a PromQL identifier outside label matchers, ranges, strings, `by (...)` label
lists and Grafana variables, and not followed by `(` (a function or aggregation).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import helm_python
import yaml
from prometheus_client.parser import text_string_to_metric_families

CHART = Path(__file__).resolve().parents[1] / "charts" / "burstbuffer"
DASHBOARD = CHART / "dashboards" / "burstbuffer.json"

# Every alert rendered: the injector-down alert needs the ServiceMonitor.
ALL_RULES = {
    "prometheus": {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}
}

# Names that neither the sidecar nor the injector exports: Prometheus' own series per
# target, and the API server's admission metrics (kube-apiserver's /metrics, ALPHA).
OUTSIDE = {
    "up",
    "apiserver_admission_webhook_fail_open_count",
    "apiserver_admission_webhook_rejection_count",
}
INJECTOR_PREFIX = "burstbuffer_injector_"
SIDECAR_PREFIX = "burstbuffer_"

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_VARIABLES = re.compile(r"\$\{?\w+\}?")
_OFFSETS = re.compile(r"\boffset\s+-?[0-9a-z]+")
_IDENTIFIER = re.compile(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expression: str) -> set[str]:
    """The metric names an expression reads."""
    for opening, closing in ("()", "[]", "{}"):
        assert expression.count(opening) == expression.count(closing), expression
    text = _STRINGS.sub('""', expression)
    text = _VARIABLES.sub(" ", text)  # Grafana's $__rate_interval, $namespace
    text = _LABEL_LISTS.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _OFFSETS.sub(" ", text)
    return {
        match.group(1)
        for match in _IDENTIFIER.finditer(text)
        if match.group(2) is None and match.group(1).lower() not in _KEYWORDS
    }


def exported_names(exposition: str) -> set[str]:
    """The sample names of a Prometheus text exposition (`_total`, `_bucket`, `_sum`,
    `_count` included, as a query names them)."""
    return {
        sample.name
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def dashboard_expressions() -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard, variables included."""
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["query"]["query"])
            assert query, variable["query"]
            yield f"variable {variable['name']}", query.group(1)


def rendered_rules(values: dict[str, object] | None = None) -> list[dict[str, object]]:
    """The PrometheusRule's rules as `helm install` renders them (none when it is off)."""
    with helm_python.Chart.load(CHART) as chart:
        files = chart.render(
            values, name="burstbuffer", namespace="burstbuffer-system", is_install=True
        )
    text = next((t for path, t in files.items() if path.endswith("prometheusrule.yaml")), "")
    rules: list[dict[str, object]] = []
    for document in yaml.safe_load_all(text):
        if document:
            for group in document["spec"]["groups"]:
                rules.extend(group["rules"])
    return rules


def rule_expressions() -> Iterator[tuple[str, str]]:
    """(alert, expression) of every rule, with every alert rendered."""
    for rule in rendered_rules(ALL_RULES):
        yield str(rule["alert"]), str(rule["expr"])


def names_used() -> dict[str, set[str]]:
    """Metric name -> where the dashboard or the rules read it."""
    used: dict[str, set[str]] = {}
    for where, expression in [*dashboard_expressions(), *rule_expressions()]:
        for name in metric_names(expression):
            used.setdefault(name, set()).add(where)
    return used


def sidecar_names(used: dict[str, set[str]]) -> set[str]:
    return {n for n in used if n.startswith(SIDECAR_PREFIX) and not n.startswith(INJECTOR_PREFIX)}


def injector_names(used: dict[str, set[str]]) -> set[str]:
    return {n for n in used if n.startswith(INJECTOR_PREFIX)}
