"""The seed results as one picture (bench/results/seeds.png): Momenta's table, hit
ratios under no replacement and LRU, and the throughputs of Nezha's demo and of the
parallel cold fetch, drawn from the rows of the benchmarks run in the same invocation.

Rows are found by their exact labels: a benchmark that renames one fails here, in the
smoke test, rather than drawing a wrong bar. A panel whose benchmarks did not run is
left out. matplotlib's object API renders with Agg: no display, no pyplot state.
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench import bench_momenta, bench_nezha, bench_parallel_cold
from bench.lab import Profile
from bench.report import Result, Row, number

logger = logging.getLogger(__name__)

# bench_nezha's rows: cold (its reference is the origin direct) and warm.
NEZHA_COLD = "cold (miss) through the sidecar, wget"
NEZHA_WARM = "warm (hit) vs cold (miss), wget"
DIRECT, COLD, COLD_WIDE, WARM = "#9e9e9e", "#f28e2b", "#c85a00", "#59a14f"
NO_REPLACEMENT, LRU = "#4e79a7", "#e15759"


@dataclass(frozen=True)
class Bar:
    group: str
    label: str
    value: float
    color: str


def row(result: Result, what: str) -> Row:
    """The row of `result` labelled `what`."""
    for candidate in result.rows:
        if candidate.what == what:
            return candidate
    raise LookupError(f"benchmark {result.name} has no row {what!r}")


def throughput_bars(results: dict[str, Result]) -> list[Bar]:
    """MB/s of Nezha's demo and of the parallel cold fetch, each group led by its
    reference (the origin, straight)."""
    bars = []
    nezha = results.get(bench_nezha.NAME)
    if nezha is not None:
        cold, group = row(nezha, NEZHA_COLD), "Nezha's demo"
        assert cold.reference is not None
        bars += [
            Bar(group, "origin\ndirect", cold.reference.median, DIRECT),
            Bar(group, "cold\n(miss)", cold.ours.median, COLD),
            Bar(group, "warm\n(hit)", row(nezha, NEZHA_WARM).ours.median, WARM),
        ]
    parallel = results.get(bench_parallel_cold.NAME)
    if parallel is not None:
        group = "parallel cold fetch"
        sides = [(n, row(parallel, label)) for n, (label, _) in bench_parallel_cold.SIDES.items()]
        reference = sides[0][1].reference
        assert reference is not None
        bars.append(Bar(group, "wget\ndirect", reference.median, DIRECT))
        bars += [
            Bar(group, f"cold, {n}\nconnections", side.ours.median, COLD if i == 0 else COLD_WIDE)
            for i, (n, side) in enumerate(sides)
        ]
    return bars


def draw_momenta(axes: Axes, result: Result, objects: int) -> None:
    """Grouped bars per buffer size: no replacement, LRU, and Momenta's expectation."""
    buffers = [bench_momenta.buffer_objects(ratio, objects) for ratio in bench_momenta.RATIOS]
    rows = {
        eviction: [row(result, bench_momenta.label(eviction, b, objects)) for b in buffers]
        for eviction in bench_momenta.POLICIES
    }
    expected = [r.reference.median for r in rows["none"] if r.reference is not None]
    x, width = np.arange(len(buffers)), 0.38
    for offset, eviction, color in ((-0.5, "none", NO_REPLACEMENT), (0.5, "lru", LRU)):
        values = [r.ours.median for r in rows[eviction]]
        name = f"{bench_momenta.POLICIES[eviction]} (--eviction {eviction})"
        bars = axes.bar(x + offset * width, values, width, label=name, color=color)
        axes.bar_label(bars, labels=[number(v) for v in values], padding=2, fontsize=8)
    axes.hlines(
        expected, x - width, x, colors="black", linestyles="dashed", linewidth=1.2,
        label="Momenta's expectation for no replacement",
    )  # fmt: skip
    axes.set_xticks(x, [f"{b}/{objects}" for b in buffers])
    axes.set_xlabel("buffer / dataset (objects)")
    axes.set_ylabel("hit ratio per epoch, % (epochs 2 and 3)")
    axes.set_ylim(0, 125)
    axes.set_title("Momenta's table: a scan larger than the buffer")
    axes.legend(loc="upper left", fontsize=8, frameon=False)


def draw_throughput(axes: Axes, bars: list[Bar]) -> None:
    """Bars on a log scale, grouped, each labelled with its MB/s and its ratio to the
    group's first bar (the origin straight)."""
    positions, x, previous = [], -1.0, None
    for bar in bars:
        x += 1.0 if bar.group == previous else 1.6  # a gap between groups
        positions.append(x)
        previous = bar.group
    drawn = axes.bar(positions, [b.value for b in bars], 0.8, color=[b.color for b in bars])
    labels = []
    for bar in bars:
        first = next(b for b in bars if b.group == bar.group)
        ratio = "" if bar is first else f"\n{number(bar.value / first.value)}×"
        labels.append(number(bar.value) + ratio)
    axes.bar_label(drawn, labels=labels, padding=2, fontsize=8)
    axes.set_yscale("log")
    axes.set_ylim(1, max(b.value for b in bars) * 8)
    axes.set_xticks(positions, [b.label for b in bars], fontsize=8)
    for group in dict.fromkeys(b.group for b in bars):
        members = [p for p, b in zip(positions, bars, strict=True) if b.group == group]
        axes.annotate(
            group, xy=(sum(members) / len(members), 0), xycoords=("data", "axes fraction"),
            xytext=(0, -34), textcoords="offset points", ha="center", va="top",
            fontweight="bold", fontsize=9,
        )  # fmt: skip
    axes.set_ylabel("MB/s, wget over HTTPS (log scale)")
    axes.set_title("Throughput: first and repeated downloads")


def seeds(results: Sequence[Result], profile: Profile, about: str, path: Path) -> Path | None:
    """Write the PNG of the seed benchmarks among `results`; None if none of them ran."""
    found = {result.name: result for result in results}
    momenta = found.get(bench_momenta.NAME)
    speeds = throughput_bars(found)
    panels = (momenta is not None) + bool(speeds)
    if not panels:
        return None
    figure = Figure(figsize=(6.4 * panels, 5.4), layout="constrained")
    axes = iter(figure.subplots(1, panels, squeeze=False)[0])
    if momenta is not None:
        draw_momenta(next(axes), momenta, profile.momenta_objects)
    if speeds:
        draw_throughput(next(axes), speeds)
    figure.suptitle("burstbuffer: the seed results, measured", fontweight="bold")
    figure.supxlabel(textwrap.fill(about, 110 * panels), fontsize=7, color="#555555")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    logger.info("plot written to %s", path)
    return path
