"""Resident memory of a running process, from /proc/<pid>/status.

`VmRSS` is sampled by a background thread while a transfer runs, for each process of
a server (the sidecar's main process and its workers) and for all together (the
figure a pod's memory limit is held against); `Pss` (smaps_rollup) counts shared pages
once across a tree; `VmHWM`, the kernel's own peak of each
process, catches spikes between samples. Writing 5 to /proc/<pid>/clear_refs resets
that peak, so that the hit and the miss of one process can be measured apart.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

SAMPLE_INTERVAL = 0.01  # seconds between VmRSS samples
MB = 1_000_000


def status_kb(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    raise KeyError(f"{field} not in /proc/{pid}/status")


def rss_mb(pid: int) -> float:
    return status_kb(pid, "VmRSS") * 1024 / MB


def peak_mb(pid: int) -> float:
    """The process's peak RSS since it started or since `reset_peak`."""
    return status_kb(pid, "VmHWM") * 1024 / MB


def pss_mb(pid: int) -> float:
    """The process's proportional set size: its own pages plus its share of those it
    shares (forked pages, mapped files), so that a tree's PSS adds up to what it costs."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "Pss":
            return int(value.split()[0]) * 1024 / MB
    raise KeyError(f"Pss not in /proc/{pid}/smaps_rollup")


def mapped_pss_mb(pid: int, name: str) -> float:
    """The process's share of the pages of its mappings whose path holds `name` (a
    memory file's, `/memfd:<name>`): counted apart from what else it takes."""
    kib = 0
    mapped = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        first = line.split(maxsplit=1)[0]
        if "-" in first and not first.endswith(":"):  # a mapping's header line
            mapped = name in line
        elif mapped and first == "Pss:":
            kib += int(line.split()[1])
    return kib * 1024 / MB


def reset_peak(pid: int) -> None:
    """Make VmHWM restart from the current RSS (Linux >= 4.0; own processes or root)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


class RssSampler:
    """`with RssSampler(pids) as s: ...` -> the largest VmRSS of any one of `pids`
    (`s.max_mb`) and of all of them together (`s.max_total_mb`) seen meanwhile."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.max_mb = 0.0
        self.max_total_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            sizes = [rss_mb(pid) for pid in self.pids]
            self.max_mb = max(self.max_mb, *sizes)
            self.max_total_mb = max(self.max_total_mb, sum(sizes))
            if self._stop.wait(SAMPLE_INTERVAL):
                return
