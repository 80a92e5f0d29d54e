"""The benchmark suite, run end to end with tiny sizes so that it cannot rot, and the
pure pieces of its report."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from bench import bench_momenta, bench_parallel_cold, plot
from bench.__main__ import BENCHMARKS
from bench.cachedir import cache_dir
from bench.harness import PYTHON, ROOT, clean_env, cpu_seconds, process_tree
from bench.lab import FULL
from bench.report import (
    Requirement,
    Result,
    Row,
    Sample,
    below,
    markdown,
    ratio_at_least,
    target_ratio,
    within,
)
from bench.squid import SquidMissing
from bench.squid import ensure_installed as squid_installed

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_quick_suite_runs_every_benchmark(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: the benchmarks use private mounts")
    if not os.access("/usr/sbin/nginx", os.X_OK):
        pytest.skip("needs nginx (apt-get install nginx-light)")
    try:
        squid_installed()
    except SquidMissing as e:
        pytest.skip(str(e))
    # The clean environment's HOME is /nonexistent: what the suite keeps (the scale
    # benchmark's stored buffers) goes to the tests' cache folder instead.
    done = subprocess.run(
        [PYTHON, "-m", "bench", "--quick", "--results", str(tmp_path)],
        env=clean_env(PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(cache_dir().parent)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
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
    assert (tmp_path / "seeds.png").read_bytes().startswith(PNG_SIGNATURE)


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


def test_within_holds_every_run() -> None:
    one_object = within(6.25, 100 / 160, "expected ± 1 object")
    assert row([6.25, 6.875], [6.25], one_object).verdict(judged=True) == "ok"
    assert row([6.25, 7.5], [6.25], one_object).verdict(judged=True) == "**FAIL**"
    assert row([0, 0.625], [6.25], within(0, 0, "= 0 %")).verdict(judged=True) == "**FAIL**"


def test_momenta_expectations_are_momentas_table() -> None:
    objects = FULL.momenta_objects
    buffers = [bench_momenta.buffer_objects(r, objects) for r in bench_momenta.RATIOS]
    assert buffers == [10, 50, 100, 160, 200]
    for eviction, table in (("none", [6.25, 31.25, 62.5, 100, 100]), ("lru", [0, 0, 0, 100, 100])):
        hits = [bench_momenta.expected_hits(eviction, b, objects) for b in buffers]
        assert [100 * h / objects for h in hits] == table


def seed_results() -> list[Result]:
    """Rows shaped like those of the three seed benchmarks, with made-up figures."""
    objects = FULL.momenta_objects
    momenta = Result(bench_momenta.NAME, "Momenta")
    for ratio in bench_momenta.RATIOS:
        buffer = bench_momenta.buffer_objects(ratio, objects)
        for eviction in bench_momenta.POLICIES:
            label = bench_momenta.label(eviction, buffer, objects)
            momenta.rows.append(Row(label, "%", Sample.of([50.0]), Sample.of([50.0])))
    nezha = Result("nezha", "Nezha", [
        Row(plot.NEZHA_COLD, "MB/s", Sample.of([12.0]), Sample.of([3.49])),
        Row(plot.NEZHA_WARM, "MB/s", Sample.of([900.0]), Sample.of([12.0])),
    ])  # fmt: skip
    parallel = Result(bench_parallel_cold.NAME, "Parallel")
    for label, _ in bench_parallel_cold.SIDES.values():
        parallel.rows.append(Row(label, "MB/s", Sample.of([13.0]), Sample.of([3.49])))
    return [momenta, nezha, parallel]


def png_width(path: Path) -> int:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    return int.from_bytes(data[16:20], "big")  # the IHDR chunk comes first


def test_plot_draws_the_seed_panels(tmp_path: Path) -> None:
    results = seed_results()
    both = plot.seeds(results, FULL, "about", tmp_path / "both.png")
    # Without Momenta's table only the throughput panel is drawn: half as wide.
    one = plot.seeds(results[1:], FULL, "about", tmp_path / "one.png")
    assert both is not None and one is not None
    assert png_width(both) == 2 * png_width(one)
    assert plot.seeds([Result("small", "Small")], FULL, "about", tmp_path / "no.png") is None
    assert not (tmp_path / "no.png").exists()


def test_plot_refuses_a_renamed_row(tmp_path: Path) -> None:
    momenta, nezha, _ = seed_results()
    nezha.rows.pop()
    with pytest.raises(LookupError, match="warm"):
        plot.seeds([momenta, nezha], FULL, "about", tmp_path / "seeds.png")


# A process that spins in a thread that then ends, in a child of its own, and then a
# little at each line it reads: CPU time by their own clocks, which `cpu_seconds` adds up.
SPINNER = """
import os, sys, threading, time

def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

thread = threading.Thread(target=spin, args=(0.2,))
thread.start()
thread.join()
if os.fork() == 0:
    spin(0.1)
    print("spun", flush=True)
    time.sleep(60)
    os._exit(0)
print("ready", flush=True)
for line in sys.stdin:
    spin(float(line))
    print("done", flush=True)
"""


def test_cpu_seconds_adds_a_trees_time_to_less_than_a_tick() -> None:
    with subprocess.Popen(
        [PYTHON, "-c", SPINNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as spinner:
        assert spinner.stdin is not None and spinner.stdout is not None
        try:
            # The child says when it has spun, its parent when its thread has.
            assert sorted([spinner.stdout.readline(), spinner.stdout.readline()]) == [
                "ready\n",
                "spun\n",
            ]
            # The thread that ended and the child both count.
            before = cpu_seconds(spinner.pid)
            assert before >= 0.3
            spinner.stdin.write("0.003\n")
            spinner.stdin.flush()
            assert spinner.stdout.readline() == "done\n"
            # 3 ms of work, and the little it took to read and answer: not 0 or 10 ms, as
            # a count of clock ticks would say.
            assert 0.003 <= cpu_seconds(spinner.pid) - before < 0.008
        finally:
            for member in reversed(process_tree(spinner.pid)):
                os.kill(member, signal.SIGKILL)


# Threads that start and end all the time, as a sidecar's worker's do (mitmproxy's loading,
# the check's pool), and a child: the tree is read while they come and go.
CHURNER = """
import subprocess, sys, threading
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("ready", flush=True)
while True:
    threads = [threading.Thread(target=lambda: None) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
"""


def test_the_process_tree_is_read_while_threads_come_and_go() -> None:
    with subprocess.Popen([PYTHON, "-c", CHURNER], stdout=subprocess.PIPE, text=True) as churner:
        assert churner.stdout is not None
        try:
            assert churner.stdout.readline() == "ready\n"
            trees = [process_tree(churner.pid) for _ in range(2000)]
            assert all(tree[0] == churner.pid and len(tree) == 2 for tree in trees)
        finally:
            for member in reversed(process_tree(churner.pid)):
                os.kill(member, signal.SIGKILL)
