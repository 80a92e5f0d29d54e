"""values.yaml and values.schema.json: typos fail, bad values fail, every key documented.

The schema is what turns a misspelt key into a failed install; these tests put an
unknown key at every level of values.yaml and expect Helm itself to refuse it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
import yaml
from helmchart import CHART, REPO, SCENARIOS, lint, render, walk_keys

VALUES_TEXT = (CHART / "values.yaml").read_text()
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART / "values.schema.json").read_text())

# Keys whose children are Kubernetes API fields (documented by Kubernetes), not ours.
KUBERNETES_OBJECTS = {
    "injector.resources",
    "injector.podSecurityContext",
    "injector.securityContext",
    "sidecar.resources",
    "parentCache.resources",
}
# Free-form maps (annotations, labels, node selectors): any key is legitimate there.
FREE_MAPS = {
    "injector.podAnnotations",
    "injector.podLabels",
    "injector.nodeSelector",
    "injector.serviceAccount.annotations",
    "prometheus.serviceMonitor.labels",
    "prometheus.podMonitor.labels",
    "prometheus.prometheusRule.labels",
    "grafana.dashboards.annotations",
}


def _our_keys() -> Iterator[tuple[str, Any]]:
    """Every key of values.yaml that the chart defines (not inside Kubernetes objects)."""
    for path, value in walk_keys(VALUES):
        if any(path.startswith(parent + ".") for parent in KUBERNETES_OBJECTS):
            continue
        yield path, value


def _object_paths() -> list[str]:
    """Every mapping of values.yaml whose keys are fixed by the schema ("" is the root)."""
    paths = [""]
    for path, value in walk_keys(VALUES):
        if isinstance(value, dict) and path not in FREE_MAPS:
            paths.append(path)
    return paths


def _with(path: str, key: str, value: Any) -> dict[str, Any]:
    """values.yaml's defaults plus `key: value` inside the mapping at `path`."""
    values = copy.deepcopy(VALUES)
    target = values
    for part in filter(None, path.split(".")):
        target = target[part]
    target[key] = value
    return values


@pytest.mark.parametrize("path", _object_paths())
def test_an_unknown_key_fails_at_every_level(path: str) -> None:
    typo = "replicaCuont" if path == "injector" else "enabeld"
    values = _with(path, typo, True)
    with pytest.raises(helm_python.HelmValuesError, match=typo):
        render(values)
    assert any(typo in problem for problem in lint(values))


@pytest.mark.parametrize(
    ("values", "mentioned"),
    [
        ({"webhook": {"failurePolicy": "ignore"}}, "failurePolicy"),
        ({"webhook": {"timeoutSeconds": 60}}, "timeoutSeconds"),
        ({"injector": {"replicaCount": 0}}, "replicaCount"),
        ({"image": {"digest": "latest"}}, "digest"),
        ({"sidecar": {"capture": "iptables"}}, "capture"),
        ({"sidecar": {"proxyPort": 0}}, "proxyPort"),
        ({"sidecar": {"runAsUser": 0}}, "runAsUser"),
        ({"sidecar": {"buffer": {"size": "1GB"}}}, "size"),
        ({"sidecar": {"buffer": {"medium": "memory"}}}, "medium"),
        ({"sidecar": {"buffer": {"medium": "pmem"}}}, "pmem"),
        (
            {
                "sidecar": {
                    "buffer": {
                        "medium": "pmem",
                        "pmem": {"storageClassName": "pmem-csi", "hostPath": "/mnt/pmem"},
                    }
                }
            },
            "pmem",
        ),
        ({"sidecar": {"intercept": ["https://huggingface.co"]}}, "intercept"),
        ({"sidecar": {"noProxy": ["10.0.0.0/8"]}}, "noProxy"),
        ({"sidecar": {"trust": {"mountPath": "relative/path"}}}, "mountPath"),
        ({"certManager": {"duration": "90 days"}}, "duration"),
        ({"injector": {"resources": {"requests": {"cpu": "lots"}}}}, "cpu"),
        ({"grafana": {"dashboards": {"label": "grafana dashboard"}}}, "label"),
        ({"grafana": {"dashboards": {"labelValue": 1}}}, "labelValue"),
        ({"grafana": {"dashboards": {"namespace": "Monitoring"}}}, "namespace"),
        ({"prometheus": {"prometheusRule": {"enabled": "yes"}}}, "enabled"),
        ({"parentCache": {"url": "squid:3128"}}, "url"),
        ({"parentCache": {"enabled": True, "tls": {"enabled": True}}}, "secretName"),
        # A parent's CA is for https parents only.
        ({"parentCache": {"ca": {"configMapName": "squid-ca"}}}, "https"),
        (
            {"parentCache": {"url": "http://squid:3128", "ca": {"configMapName": "squid-ca"}}},
            "https",
        ),
        ({"parentCache": {"maximumObjectSize": "64G"}}, "maximumObjectSize"),
    ],
)
def test_a_bad_value_fails(values: dict[str, Any], mentioned: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=mentioned):
        render(values)


def test_every_scenario_satisfies_the_schema() -> None:
    for values in SCENARIOS.values():
        render(values)


def _schema_node(path: str) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for part in path.split("."):
        node = node["properties"][part]
        while "$ref" in node:
            node = SCHEMA["definitions"][node["$ref"].rpartition("/")[2]]
    return node


def test_schema_forbids_unknown_keys_in_every_object() -> None:
    def objects(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if isinstance(node, dict):
            if node.get("type") == "object":
                yield where, node
            for key, child in node.items():
                yield from objects(child, f"{where}/{key}")
        elif isinstance(node, list):
            for index, child in enumerate(node):
                yield from objects(child, f"{where}/{index}")

    for where, node in objects(SCHEMA, "#"):
        extra = node.get("additionalProperties")
        if where.endswith("/stringMap"):  # labels, annotations: any key, string values
            assert extra == {"type": "string"}, where
        elif where.endswith("/kubernetesObject"):  # affinity terms, checked by the API server
            assert "additionalProperties" not in node, where
        else:
            assert extra is False, where


def test_every_values_key_has_a_schema() -> None:
    for path, _ in _our_keys():
        if any(path.startswith(parent + ".") for parent in FREE_MAPS):
            continue
        assert _schema_node(path), path


def _comment_above(lines: list[str], index: int) -> list[str]:
    comment: list[str] = []
    while index > 0 and lines[index - 1].strip().startswith("#"):
        index -= 1
        comment.insert(0, lines[index].strip().lstrip("#").strip())
    return comment


def test_every_key_is_documented_by_a_comment_starting_with_its_name() -> None:
    lines = VALUES_TEXT.splitlines()
    key_line = re.compile(r"^(\s*)([A-Za-z][\w-]*):")
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing keys
    undocumented = []
    for index, line in enumerate(lines):
        match = key_line.match(line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        if any(path.startswith(parent + ".") for parent in KUBERNETES_OBJECTS):
            continue
        comment = _comment_above(lines, index)
        if not comment or not re.match(rf"{re.escape(key)}\b", comment[0]):
            undocumented.append(path)
    assert undocumented == []


def test_the_chart_docs_list_every_key() -> None:
    docs = (REPO / "docs" / "chart.md").read_text()
    missing = [path for path, _ in _our_keys() if f"`{path}`" not in docs]
    assert missing == []
