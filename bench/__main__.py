"""`make bench`: the sidecar's benchmarks, each against a reference measured in the same run.

    python -m bench [--quick] [--only NAME ...] [--results DIR] [--scale-counts N ...]

Each benchmark starts its own processes on tmpfs (bench.lab), prints its rows as soon
as it is done, and writes them to <results>/<name>.md; the whole table goes to the
terminal at the end, and to <results>/summary.md when every benchmark ran. The seed
results among them (Momenta's table, Nezha's demo, the parallel cold fetch) are also
drawn in <results>/seeds.png. A missed requirement of the issue makes the exit status
1. `--quick` shrinks every size so the suite runs in seconds (tests/bench): its figures
say nothing about speed and are not judged.

Needs root (the processes get a private /etc/hosts and the clients the pod's CA
bundle through bind mounts in their own mount namespaces), wget, curl, nginx and
Squid built with OpenSSL (`squid-openssl`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from mitmproxy import version as mitmproxy_version

from bench import (
    bench_coalescing,
    bench_cold_miss,
    bench_entrances,
    bench_first_epoch,
    bench_huggingface,
    bench_large_hit,
    bench_loader,
    bench_momenta,
    bench_nezha,
    bench_parallel_cold,
    bench_parent,
    bench_ready,
    bench_rss,
    bench_scale,
    bench_small,
    bench_soak,
    bench_warm_scale,
    bench_workers,
    plot,
    report,
)
from bench.harness import ROOT
from bench.lab import FULL, QUICK, Lab, Profile
from bench.nginx import NginxMissing, ensure_installed
from bench.squid import SquidMissing
from bench.squid import ensure_installed as squid_installed

logger = logging.getLogger("bench")

BENCHMARKS: dict[str, ModuleType] = {
    module.NAME: module
    for module in (
        bench_large_hit,
        bench_cold_miss,
        bench_rss,
        bench_ready,
        bench_small,
        bench_loader,
        bench_entrances,
        bench_workers,
        bench_first_epoch,
        bench_nezha,
        bench_momenta,
        bench_coalescing,
        bench_parallel_cold,
        bench_soak,
        bench_parent,
        bench_scale,
        bench_warm_scale,
        bench_huggingface,
    )
}
RESULTS = ROOT / "bench" / "results"


def environment(profile: Profile) -> str:
    """One line saying where and with what the figures were measured."""
    nginx = subprocess.run([ensure_installed(), "-v"], capture_output=True, text=True)

    def first_line(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True).stdout.split("\n")[0]

    parts = [
        datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        f"{os.cpu_count()} CPUs",
        f"Linux {platform.release()}",
        f"Python {platform.python_version()}",
        f"mitmproxy {mitmproxy_version.VERSION}",
        nginx.stderr.strip().removeprefix("nginx version: "),
        " ".join(first_line(["wget", "--version"]).split()[:3]),
        " ".join(first_line(["curl", "--version"]).split()[:2]),
        "quick profile (tiny sizes, not judged)" if profile.quick else "full profile",
    ]
    return "Measured " + " · ".join(parts)


def missing_prerequisites() -> str | None:
    if os.geteuid() != 0:
        return "the benchmarks need root (private /etc/hosts and CA bundles via bind mounts)"
    for tool in ("unshare", "wget", "curl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        ensure_installed()
        squid_installed()
    except (NginxMissing, SquidMissing) as e:
        return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument(
        "--only", nargs="+", choices=list(BENCHMARKS), metavar="NAME",
        help=f"run only these benchmarks: {', '.join(BENCHMARKS)}",
    )  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the .md files go")
    parser.add_argument(
        "--scale-counts", nargs="+", type=int, metavar="N",
        help="the stored objects `scale` restarts a sidecar on (on demand: 10000000; a buffer"
        " of ten million objects takes about 50 GB and hours to make, once)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    problem = missing_prerequisites()
    if problem is not None:
        print(f"bench: {problem}", file=sys.stderr)
        return 2

    profile = QUICK if args.quick else FULL
    if args.scale_counts:
        profile = dataclasses.replace(profile, scale_counts=tuple(sorted(args.scale_counts)))
    about = environment(profile)
    judged = not profile.quick
    results = []
    for name in args.only or list(BENCHMARKS):
        logger.info("%s: starting", name)
        with Lab() as lab:
            result = BENCHMARKS[name].run(profile, lab)
        results.append(result)
        body = report.markdown([result], judged)
        print(body, flush=True)
        report.write(args.results / f"{name}.md", result.title, about, body)

    table = report.markdown(results, judged)
    print(f"{about}\n\n{table}")
    if not args.only:
        report.write(args.results / "summary.md", "burstbuffer benchmarks", about, table)
    picture = plot.seeds(results, profile, about, args.results / "seeds.png")
    if picture is not None:
        print(f"plot of the seed results: {picture}")
    failures = [row for result in results for row in result.failures()] if judged else []
    for row in failures:
        assert row.required is not None
        print(f"bench: requirement missed: {row.what}: {row.required.text}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
