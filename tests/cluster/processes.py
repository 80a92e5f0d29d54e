"""Starting, finding and stopping the cluster's processes, which outlive `make cluster`.

Each process runs in a session of its own, detached from whoever started it, with its
output in `state/logs/NAME.log` and its pid in `state/pids/NAME.pid`; stopping it checks
that the pid still names the same program before signalling it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.cluster.components import Component
from tests.cluster.layout import Layout

STOP_GRACE = 20.0  # seconds between SIGTERM and SIGKILL


class StartFailed(RuntimeError):
    """A process exited or never became ready; the message has its log's last lines."""


def start(layout: Layout, component: Component, env: dict[str, str] | None = None) -> int:
    """Start `component` detached; its pid."""
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.pids.mkdir(parents=True, exist_ok=True)
    log = layout.logs / f"{component.name}.log"
    # The shell starts the program in the background and exits, so the program belongs
    # to no process of ours (and outlives `make cluster`); `$!` is its pid.
    done = subprocess.run(
        ["sh", "-c", '"$@" >>"$LOG" 2>&1 </dev/null & echo $!', "sh", *component.argv],
        env={**(env or os.environ), "LOG": str(log)},
        capture_output=True, text=True, timeout=30, start_new_session=True, check=True,
    )  # fmt: skip
    pid = int(done.stdout.strip())
    (layout.pids / f"{component.name}.pid").write_text(f"{pid} {component.argv[0]}\n")
    # The shell's child becomes the program when it execs it, a moment later.
    started = wait_until(lambda: running_pid(layout, component.name) == pid, 10, 0.01)
    if not started and not Path(f"/proc/{pid}").exists():
        raise StartFailed(f"{component.name} exited at once: see {log}")
    return pid


def running_pid(layout: Layout, name: str) -> int | None:
    """The pid of `name` if it still runs the program it was started as."""
    try:
        pid_text, program = (layout.pids / f"{name}.pid").read_text().split(maxsplit=1)
        argv0 = Path(f"/proc/{pid_text}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return int(pid_text) if argv0 == program.strip() else None


def stop(layout: Layout, name: str) -> None:
    """SIGTERM, then SIGKILL after STOP_GRACE; nothing if it does not run."""
    pid = running_pid(layout, name)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        if not wait_until(lambda: not Path(f"/proc/{pid}").exists(), STOP_GRACE):
            os.kill(pid, signal.SIGKILL)
    (layout.pids / f"{name}.pid").unlink(missing_ok=True)


def wait_until(ready: Callable[[], bool], timeout: float, interval: float = 0.5) -> bool:
    """Poll `ready` until it is true (True) or `timeout` seconds have passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def await_ready(
    layout: Layout, name: str, ready: Callable[[], bool], what: str, timeout: float = 120.0
) -> None:
    """Wait for `ready`, failing early (with the log's tail) if `name` exits meanwhile."""

    def ready_or_gone() -> bool:
        return running_pid(layout, name) is None or ready()

    if wait_until(ready_or_gone, timeout) and running_pid(layout, name) is not None:
        return
    tail = (layout.logs / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
    state = "exited" if running_pid(layout, name) is None else f"not {what} after {timeout:.0f} s"
    raise StartFailed(f"{name} {state}; the end of {layout.logs / name}.log:\n" + "\n".join(tail))
