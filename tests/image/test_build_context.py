"""The image's build context is exactly what the Dockerfile copies.

A checkout holds more than the source: a running cluster's state in `.cluster/`
(containerd's snapshots, which change while a build reads them), virtual environments,
cargo's target folder. `.dockerignore` therefore excludes everything and names what may
enter; these tests keep it and the Dockerfile's COPY lines in step.
"""

from __future__ import annotations

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def copied_sources(dockerfile: str) -> set[str]:
    """The context paths the Dockerfile's COPY instructions read (not `--from` stages)."""
    sources: set[str] = set()
    for line in dockerfile.splitlines():
        if not line.upper().startswith("COPY "):
            continue
        words = shlex.split(line)
        if any(w.startswith("--from") for w in words[1:]):
            continue
        arguments = [w for w in words[1:] if not w.startswith("--")]
        sources.update(a.rstrip("/") for a in arguments[:-1])
    return sources


def ignore_rules() -> list[str]:
    text = (ROOT / ".dockerignore").read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_context_starts_from_nothing() -> None:
    assert ignore_rules()[0] == "*"


def test_what_the_dockerfile_copies_is_what_enters_the_context() -> None:
    admitted = {rule[1:] for rule in ignore_rules() if rule.startswith("!")}
    assert admitted == copied_sources((ROOT / "Dockerfile").read_text())


def test_the_hosts_builds_stay_out_of_the_context() -> None:
    rules = ignore_rules()
    for built in ("sidecar/core/target", "sidecar/core/*.so", "**/__pycache__"):
        assert rules.index(built) > max(i for i, r in enumerate(rules) if r.startswith("!"))
