"""Benchmark figures and their Markdown: medians of repeated runs, ratios against a
reference measured in the same run, and the issue's requirements checked on them."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Sample:
    """Repeated measurements of one figure; the median is the figure."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Sample:
        if not values:
            raise ValueError("a sample needs at least one value")
        return cls(tuple(values))

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def cell(self) -> str:
        if len(self.values) == 1:
            return number(self.median)
        low, high = min(self.values), max(self.values)
        return f"{number(self.median)} ({number(low)}–{number(high)})"


@dataclass(frozen=True)
class Requirement:
    """A bound from the issue, on the ratio to the reference or on the figure itself.
    A binding one fails the run when missed; a target is only reported."""

    text: str
    met: Callable[[Row], bool]
    binding: bool = True


def ratio_at_least(bound: float, target: float | None = None) -> Requirement:
    text = f"≥ {bound:g}×" + (f" (target ≥ {target:g}×)" if target is not None else "")
    return Requirement(text, lambda row: row.ratio is not None and row.ratio >= bound)


def target_ratio(bound: float) -> Requirement:
    return Requirement(
        f"target ≥ {bound:g}×", lambda row: row.ratio is not None and row.ratio >= bound, False
    )


def within(value: float, tolerance: float, text: str) -> Requirement:
    """Every run is within `tolerance` of `value`: for figures the issue predicts exactly
    (a hit ratio, a request count), where a median could hide one wrong run."""
    slack = tolerance + 1e-9 * max(abs(value), 1.0)  # float noise, not a real miss
    return Requirement(text, lambda row: all(abs(v - value) <= slack for v in row.ours.values))


def below(bound: float, unit: str, every_run: bool = False) -> Requirement:
    """The median (or, for a limit such as peak memory, every run) is under `bound`."""
    if every_run:
        return Requirement(f"< {bound:g} {unit}, every run", lambda r: max(r.ours.values) < bound)
    return Requirement(f"< {bound:g} {unit}", lambda row: row.ours.median < bound)


@dataclass(frozen=True)
class Row:
    """One measurement: ours against a reference (ratio = ours / reference)."""

    what: str
    unit: str
    ours: Sample
    reference: Sample | None = None
    reference_name: str = ""
    required: Requirement | None = None

    @property
    def ratio(self) -> float | None:
        if self.reference is None or self.reference.median == 0:
            return None
        return self.ours.median / self.reference.median

    def verdict(self, judged: bool) -> str:
        if self.required is None:
            return ""
        if not judged:
            return "not judged"
        if self.required.met(self):
            return "ok"
        return "**FAIL**" if self.required.binding else "below target"


@dataclass
class Result:
    """What one benchmark found: its rows and the notes that explain them."""

    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def failures(self) -> list[Row]:
        return [row for row in self.rows if row.verdict(judged=True) == "**FAIL**"]


def number(value: float) -> str:
    """Three significant digits at most, no exponent for the magnitudes measured here."""
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def markdown(results: Sequence[Result], judged: bool) -> str:
    """All results as one table (a section row per benchmark), then their notes."""
    lines = [
        "| measurement | burstbuffer | reference | ratio | required | |",
        "| --- | --: | --: | --: | --- | --- |",
    ]
    for result in results:
        lines.append(f"| **{result.title}** | | | | | |")
        for row in result.rows:
            reference = ""
            if row.reference is not None:
                reference = f"{row.reference.cell()} {row.reference_name}".strip()
            ratio = f"{number(row.ratio)}×" if row.ratio is not None else ""
            required = row.required.text if row.required else ""
            lines.append(
                f"| {row.what}, {row.unit} | {row.ours.cell()} | {reference} | {ratio} "
                f"| {required} | {row.verdict(judged)} |"
            )
    notes = [f"- {result.title}: {note}" for result in results for note in result.notes]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def write(path: Path, heading: str, environment: str, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {heading}\n\n{environment}\n\n{body}")
