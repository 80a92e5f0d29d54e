"""Golden tests: testdata/<case>.pod.yaml (+ optional .config.yaml) -> <case>.patch.json.

The patch is taken from the webhook path (an AdmissionReview answered by review.answer)
and compared as parsed JSON. Regenerate with `BURSTBUFFER_REGENERATE_GOLDEN=1 pytest ...`
and read the diff. Every case is also checked for: a valid patched pod (1.29 and the newest
schemas), idempotence of `mutate` itself, an empty patch on a second review, and `render`
printing the same pod.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from podcheck import admission_review, apply, check_pod, decoded_patch

from injector import review, settings
from injector.mutate import mutate
from injector.render import render

TESTDATA = Path(__file__).parent / "testdata"
REGENERATE = os.environ.get("BURSTBUFFER_REGENERATE_GOLDEN") == "1"
CASES = sorted(p.name.removesuffix(".pod.yaml") for p in TESTDATA.glob("*.pod.yaml"))


def load_case(case: str) -> tuple[dict[str, Any], settings.InjectorSettings]:
    pod = yaml.safe_load((TESTDATA / f"{case}.pod.yaml").read_text())
    config = TESTDATA / f"{case}.config.yaml"
    return pod, settings.load_file(config if config.exists() else None)


def check_golden(path: Path, actual: object) -> None:
    if REGENERATE:
        path.write_text(json.dumps(actual, indent=2) + "\n")
    assert path.exists(), f"{path.name} is missing: regenerate the golden files"
    assert actual == json.loads(path.read_text())


@pytest.mark.parametrize("case", CASES)
def test_golden_patch(case: str) -> None:
    pod, config = load_case(case)
    answer = review.answer(admission_review(pod), config)
    response = answer.review["response"]
    assert response["allowed"] is True
    operations = decoded_patch(response)
    check_golden(TESTDATA / f"{case}.patch.json", operations)
    check_golden(TESTDATA / f"{case}.warnings.json", response.get("warnings", []))

    patched = apply(pod, operations)
    check_pod(patched)

    # A second review of the stored pod changes nothing.
    again = review.answer(admission_review(patched), config).review["response"]
    assert decoded_patch(again) == []

    # `render` prints the pod the webhook's patch produces.
    out, err = io.StringIO(), io.StringIO()
    render([], io.BytesIO(yaml.safe_dump(pod).encode()), out, err, config, "default")
    assert yaml.safe_load(out.getvalue()) == patched


@pytest.mark.parametrize("case", CASES)
def test_mutate_is_idempotent(case: str) -> None:
    # On mutate itself, skip rules or not: a second pass must converge, not stack.
    pod, config = load_case(case)
    once = mutate(pod, config).pod
    check_pod(once)
    assert mutate(once, config).pod == once


def test_cases_cover_the_issue() -> None:
    skipped = {"host-network", "opted-out-annotation", "opted-out-label", "windows"}
    for case in skipped:
        assert json.loads((TESTDATA / f"{case}.patch.json").read_text()) == []
    for case in set(CASES) - skipped:
        assert json.loads((TESTDATA / f"{case}.patch.json").read_text()), case
