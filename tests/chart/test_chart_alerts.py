"""The PrometheusRule's alerts, rendered as `helm install` renders them, checked and
unit-tested with Prometheus' own promtool, as the Prometheus community tests alerts:
`promtool check rules`, then `promtool test rules` with the cases of alerts.test.yaml
(input series, when each alert fires, its labels and annotations, and when it must stay
quiet)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.monitoring import ALERT_TESTS, ALL_RULES, promtool, rendered_rules, write_rule_file

PROMTOOL_TIMEOUT = 60  # seconds


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT
    )


def test_the_rules_pass_promtool_check(tmp_path: Path) -> None:
    write_rule_file(tmp_path / "rules.yaml", ALL_RULES)
    done = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rendered_rules(ALL_RULES))} rules found" in done.stdout


def test_the_alerts_pass_their_promtool_unit_tests(tmp_path: Path) -> None:
    write_rule_file(tmp_path / "rules.yaml", ALL_RULES)
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    done = _promtool("test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_does_not() -> None:
    cases = [
        case
        for group in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for case in group["alert_rule_test"]
    ]
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    alerts = {str(rule["alert"]) for rule in rendered_rules(ALL_RULES)}
    assert firing == alerts and quiet == alerts
