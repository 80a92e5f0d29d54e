"""The benchmark suite, run end to end with tiny sizes so that it cannot rot, and the
pure pieces of its report."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS
from bench.harness import PYTHON, ROOT, clean_env
from bench.report import (
    Requirement,
    Result,
    Row,
    Sample,
    below,
    markdown,
    ratio_at_least,
    target_ratio,
)


def test_quick_suite_runs_every_benchmark(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: the benchmarks use private mounts")
    if not os.access("/usr/sbin/nginx", os.X_OK):
        pytest.skip("needs nginx (apt-get install nginx-light)")
    done = subprocess.run(
        [PYTHON, "-m", "bench", "--quick", "--results", str(tmp_path)],
        env=clean_env(PYTHONPATH=str(ROOT)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = (tmp_path / "summary.md").read_text()
    for name in BENCHMARKS:
        section = (tmp_path / f"{name}.md").read_text()
        rows = [line for line in section.splitlines() if line.startswith("| ") and "×" in line]
        assert rows, f"{name} printed no ratio:\n{section}"
        assert all(row in summary for row in rows)
    assert "quick profile" in summary
    assert "FAIL" not in summary  # quick figures are never judged


def row(ours: list[float], reference: list[float], required: Requirement | None = None) -> Row:
    return Row("x", "MB/s", Sample.of(ours), Sample.of(reference), "ref", required)


def test_ratio_is_of_medians() -> None:
    assert row([1, 9, 3], [2, 2, 100]).ratio == pytest.approx(1.5)


def test_requirements() -> None:
    assert row([80], [100], ratio_at_least(0.8)).verdict(judged=True) == "ok"
    assert row([79], [100], ratio_at_least(0.8)).verdict(judged=True) == "**FAIL**"
    assert row([300], [100], below(250, "MB")).verdict(judged=True) == "**FAIL**"
    assert row([1, 1, 300], [100], below(250, "MB")).verdict(judged=True) == "ok"
    assert row([1, 1, 300], [100], below(250, "MB", every_run=True)).verdict(True) == "**FAIL**"
    assert row([50], [1], target_ratio(100)).verdict(judged=True) == "below target"
    assert row([79], [100], ratio_at_least(0.8)).verdict(judged=False) == "not judged"


def test_markdown_names_the_figures_and_the_failure() -> None:
    result = Result("n", "Title", [row([50, 40, 60], [100], ratio_at_least(0.9))], ["a note"])
    text = markdown([result], judged=True)
    assert "| x, MB/s | 50.0 (40.0–60.0) | 100 ref | 0.5× | ≥ 0.9× | **FAIL** |" in text
    # A ratio just under its bound must not be printed as if it met it.
    close = Result("n", "T", [row([0.897], [1], ratio_at_least(0.9))])
    assert "| 0.897× | ≥ 0.9× | **FAIL** |" in markdown([close], judged=True)
    assert "- Title: a note" in text
    assert result.failures() == result.rows
