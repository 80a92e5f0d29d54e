"""The documents agree with the code and with each other.

- Every annotation and label the injector reads or writes (injector/names.py) is named
  in each place that lists them.
- The hit ratio has one definition, the README's: hits / (hits + misses + coalesced +
  passes), in prose, in the PromQL examples, in NOTES.txt, in the dashboard and alerts.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from injector import names
from tests.monitoring import DASHBOARD, rendered_rules

REPO = Path(__file__).resolve().parents[1]
# Where annotations are listed.
ANNOTATION_DOCS = ("README.md", "docs/injector.md", "docs/chart.md", "charts/burstbuffer/README.md")
# Where the hit ratio is spoken of.
HIT_RATIO_DOCS = (
    "README.md",
    "docs/sidecar.md",
    "docs/chart.md",
    "docs/injector.md",
    "charts/burstbuffer/README.md",
    "charts/burstbuffer/templates/NOTES.txt",
    "charts/burstbuffer/values.yaml",
)
HIT_RATIO = "hits / (hits + misses + coalesced + passes)"
COUNTERS = {f"burstbuffer_{n}_total" for n in ("hits", "misses", "coalesced", "passes")}


def _annotations() -> list[str]:
    """Every full `burstbuffer.io/...` and `prometheus.io/...` key of names.py."""
    keys = [
        value
        for value in vars(names).values()
        if isinstance(value, str) and re.fullmatch(r"(burstbuffer|prometheus)\.io/[a-z-]+", value)
    ]
    assert names.SIDECAR_CPU in keys and names.PROMETHEUS_PATH in keys
    return keys


@pytest.mark.parametrize("document", ANNOTATION_DOCS)
def test_every_annotation_is_listed(document: str) -> None:
    text = (REPO / document).read_text()
    assert [key for key in _annotations() if f"`{key}" not in text] == []


def _hit_ratio_formulas(text: str) -> list[str]:
    """Every `hits / (...)` in prose (PromQL names end in _total and are not matched)."""
    return re.findall(r"(?<![\w_])hits\s*/\s*\([^)]*\)", text)


def _promql_ratios(text: str) -> list[str]:
    """Every paragraph that divides burstbuffer_hits_total by something."""
    paragraphs = re.split(r"\n\s*\n", text)
    return [p for p in paragraphs if "burstbuffer_hits_total" in p and " / " in p]


@pytest.mark.parametrize("document", HIT_RATIO_DOCS)
def test_the_hit_ratio_has_one_definition(document: str) -> None:
    text = (REPO / document).read_text()
    assert {" ".join(f.split()) for f in _hit_ratio_formulas(text)} <= {HIT_RATIO}
    for paragraph in _promql_ratios(text):
        assert set(re.findall(r"burstbuffer_\w+_total", paragraph)) == COUNTERS, paragraph


def test_the_readme_defines_the_hit_ratio() -> None:
    assert f"hit ratio is `{HIT_RATIO}`" in " ".join((REPO / "README.md").read_text().split())


def test_the_dashboard_and_the_alerts_explain_the_same_hit_ratio() -> None:
    assert HIT_RATIO in DASHBOARD.read_text()
    rules = rendered_rules({"prometheus": {"prometheusRule": {"enabled": True}}})
    collapsed = next(r for r in rules if r["alert"] == "BurstbufferHitRatioCollapsed")
    assert HIT_RATIO in str(collapsed["annotations"])


def test_a_second_definition_would_be_found() -> None:
    assert _hit_ratio_formulas("ratio (hits / (hits + misses)) here") == ["hits / (hits + misses)"]
    wrong = "sum(rate(burstbuffer_hits_total[5m])) / sum(rate(burstbuffer_misses_total[5m]))"
    assert _promql_ratios(f"intro\n\n{wrong}\n\nafter") == [wrong]


def _sidecar_modules() -> list[str]:
    """`package.module` (or `module` on the ground floor) of every sidecar module."""
    root = REPO / "sidecar"
    modules = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__main__" or parts == ("__init__",):
            continue
        modules.append(".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts))
    return modules


def test_the_architecture_map_names_every_module_of_the_sidecar() -> None:
    """docs/architecture.md is the map as built: a module added or moved without it fails."""
    text = (REPO / "docs/architecture.md").read_text()
    missing = [
        module
        for module in _sidecar_modules()
        if f"`{module}`" not in text and f"`{module.rpartition('.')[2]}`" not in text
    ]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_architecture_map_shows_the_layers_the_contract_enforces() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in contracts["contracts"] if c["type"] == "layers"]
    text = (REPO / "docs/architecture.md").read_text()
    drawn = re.findall(r"^(sidecar\.\S+|ground floor)", text, flags=re.MULTILINE)
    assert drawn == [*layers[:-1], "ground floor"], drawn
    for module in layers[-1].split("|"):
        assert f"`{module.strip()}`" in text or module.strip() in text
