"""Ready time: from starting the sidecar to its first `/healthz` 200.

Measured for a first start (the pod CA is created) and a restart (the CA is loaded
from --ca-dir), against plain mitmdump's time to accept connections on first start
(it writes its own CA) and on restart. The clock starts before the process is
spawned, `unshare` included, as kubelet's would.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.lab import Lab, Profile
from bench.mitmdump import launch_mitmdump
from bench.report import Result, Row, Sample, below

logger = logging.getLogger(__name__)

NAME = "ready"
LIMIT_S = 1.5  # the bound on start -> /healthz 200
POLL = 0.005  # seconds between readiness checks
TIMEOUT = 60.0  # seconds


def seconds_since(started: float, ready: Callable[[], bool]) -> float:
    """Wait until `ready()`; return the seconds since `started` (a perf_counter)."""
    while not ready():
        if time.perf_counter() - started > TIMEOUT:
            raise TimeoutError(f"not ready after {TIMEOUT}s")
        time.sleep(POLL)
    return time.perf_counter() - started


def sidecar_starts(lab: Lab) -> list[float]:
    """Seconds to ready for a first start and a restart of one sidecar."""
    sidecar = lab.sidecar(lab.ca_pem, start=False)
    times = []
    for _ in ("first start", "restart"):
        started = time.perf_counter()
        sidecar.launch()
        try:
            times.append(seconds_since(started, sidecar.healthy))
        finally:
            sidecar.stop()
    return times


def mitmdump_starts(lab: Lab) -> list[float]:
    """Seconds to listening for a first start and a restart of mitmdump (one confdir)."""
    workdir = Path(tempfile.mkdtemp(prefix="mitmdump-", dir=lab.dir))
    times = []
    for _ in ("first start", "restart"):
        started = time.perf_counter()
        proxy = launch_mitmdump(workdir, lab.hosts, lab.ca_pem)
        try:
            times.append(seconds_since(started, proxy.ready))
        finally:
            proxy.stop()
    return times


def run(profile: Profile, lab: Lab) -> Result:
    result = Result(NAME, "Ready time: start → /healthz 200")
    ours: list[list[float]] = []
    reference: list[list[float]] = []
    for run_index in range(profile.ready_starts):
        logger.info("%s: run %d/%d", NAME, run_index + 1, profile.ready_starts)
        ours.append(sidecar_starts(lab))
        reference.append(mitmdump_starts(lab))
    for index, label in enumerate(("first start (creates the pod CA)", "restart (CA exists)")):
        result.rows.append(
            Row(
                label,
                "s",
                Sample.of([pair[index] for pair in ours]),
                Sample.of([pair[index] for pair in reference]),
                "mitmdump listening",
                below(LIMIT_S, "s"),
            )
        )
    result.notes.append(
        f"medians of {profile.ready_starts} starts (min–max), polled every "
        f"{POLL * 1000:.0f} ms; the sidecar's clock stops at /healthz 200 (proxy listening "
        "and trust files written), mitmdump's when its port accepts connections"
    )
    return result
