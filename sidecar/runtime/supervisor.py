"""The worker processes: how many, started, watched, replaced, stopped.

The parent makes the listening sockets, the connection counts they share and one
channel per worker, then starts that many workers with those descriptors. Each is
forked from a multiprocessing fork server (its socket in the sidecar's private
directory) that has preloaded the workers' module (`sidecar.runtime.worker`, named by
`sidecar.__main__`): the lean path only, without mitmproxy, which every worker loads for
itself once it serves.
So a worker, a first one or a replacement, starts in milliseconds. A worker that
exits unasked is replaced (after a pause that grows while it keeps crashing); its
fills in progress are failed and their room returned first (`Keeper.worker_gone`).
SIGTERM reaches every worker; one that has not exited after `STOP_GRACE` is killed.

Counters live in the workers: `counters()` asks each for its snapshot and adds up,
keeping what workers that exited had counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import math
import multiprocessing
import multiprocessing.process
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing import reduction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar import ipc
from sidecar.ipc import Message
from sidecar.metrics import add_snapshots
from sidecar.shared import Shared

if TYPE_CHECKING:
    # Only a type here: the main process starts its workers before it loads the buffer.
    from sidecar.buffer.keeper import Keeper

logger = logging.getLogger(__name__)


class WorkersFailed(Exception):
    """The worker processes could not be started."""


# A worker gets this long to finish after SIGTERM before it is killed.
STOP_GRACE = 1.5  # seconds
# A scrape waits this long for a busy worker's counters, then uses its last ones.
STATS_TIMEOUT = 1.0  # seconds
# A worker that dies within this long of starting counts as crash-looping: the pause
# before the next start doubles, from RESTART_PAUSE up to RESTART_PAUSE_MAX.
STABLE_AFTER = 10.0  # seconds
RESTART_PAUSE = 0.1  # seconds
RESTART_PAUSE_MAX = 30.0  # seconds


def cpu_limit(cpu_max: str | None, cfs_quota: str | None, cfs_period: str | None) -> float | None:
    """CPUs a cgroup quota allows: cgroup v2 `cpu.max` ("150000 100000" or "max
    100000"), else cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: none)."""
    if cpu_max is not None:
        quota, _, period = cpu_max.strip().partition(" ")
        if quota != "max" and quota.isdigit() and period.isdigit() and int(period) > 0:
            return int(quota) / int(period)
        return None
    if cfs_quota is not None and cfs_period is not None:
        quota_us, period_us = int(cfs_quota.strip()), int(cfs_period.strip())
        if quota_us > 0 and period_us > 0:
            return quota_us / period_us
    return None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def available_cpus() -> int:
    """The CPUs this container may use: its cgroup quota (rounded up), at most the CPUs
    it may run on, at least 1. The default number of workers."""
    limit = cpu_limit(
        _read("/sys/fs/cgroup/cpu.max"),
        _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    )
    cpus = len(os.sched_getaffinity(0))
    if limit is not None:
        cpus = min(cpus, math.ceil(limit))
    return max(1, cpus)


class InheritedFd:
    """A file descriptor handed to a worker: multiprocessing duplicates it into the
    worker when the worker is started (as it does for sockets)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_fd, (reduction.DupFd(self.fd),))


def _rebuild_fd(duplicate: Any) -> InheritedFd:
    return InheritedFd(duplicate.detach())


@dataclass(frozen=True)
class Inherited:
    """What a worker gets from the main process."""

    index: int
    argv: list[str]  # the sidecar's own flags
    listeners: list[socket.socket]  # shared by every worker
    keeper: socket.socket  # its end of its channel to the keeper
    shared: InheritedFd  # the shared memory (`sidecar.shared`)


def _run_worker(entry: str, inherited: Inherited) -> None:
    """A worker process: `entry` (`module:function`, the module preloaded by the fork
    server) called with what the main process hands it."""
    module, _, function = entry.partition(":")
    getattr(importlib.import_module(module), function)(inherited)


@dataclass
class _Worker:
    index: int
    process: multiprocessing.process.BaseProcess | None = None
    socket: socket.socket | None = None  # our end of its channel, until served
    channel: ipc.Channel | None = None
    ready: bool = False
    last: dict[str, Any] = field(default_factory=dict)  # its last reported counters


class Workers:
    """The worker processes of one sidecar."""

    def __init__(
        self,
        shared: Shared,
        argv: Sequence[str],
        sockets: Sequence[socket.socket],
        private_dir: Path,
        entry: str,
    ) -> None:
        """One worker per connection slot of `shared`; `argv`: the sidecar's own flags,
        passed on to every worker; `private_dir`: a directory only the sidecar can use
        (its --ca-dir), where the fork server's socket lives; `entry`: the workers' code
        as `module:function`, named rather than imported (as gunicorn names an app), so
        that the supervisor does not depend on the worker that depends on it."""
        self._argv = list(argv)
        self._entry = entry
        self._shared = shared
        self._sockets = sockets
        self._keeper: Keeper | None = None
        self._workers = [_Worker(index) for index in range(shared.workers)]
        # Workers are forked from a server that loaded their code once: they start in
        # milliseconds and share its memory until they write to it.
        self._context = multiprocessing.get_context("forkserver")
        self._private_dir = private_dir
        self._spawn_failure: BaseException | None = None
        self._context.set_forkserver_preload([entry.partition(":")[0]])
        self._retired: list[dict[str, Any]] = []  # counters of workers that exited
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self.started_all = asyncio.Event()

    def __len__(self) -> int:
        return len(self._workers)

    def spawn(self) -> threading.Thread:
        """Start every worker process, in a thread (the first start waits for the fork
        server to preload `sidecar.runtime.worker`); each worker waits for `serve()` before it
        serves. Join the thread before `serve()`."""
        thread = threading.Thread(target=self._spawn_all, name="spawn-workers", daemon=True)
        thread.start()
        return thread

    def serve(self, keeper: Keeper) -> None:
        """Tell the workers to start, answer them with `keeper`, and replace any that
        exits (in the event loop)."""
        self._keeper = keeper
        self._tasks = [asyncio.create_task(self._supervise(worker)) for worker in self._workers]

    def ready(self) -> str | None:
        """None when every worker has started and one is serving, else what is missing."""
        if not self.started_all.is_set():
            waiting = sum(not worker.ready for worker in self._workers)
            return f"{waiting} of {len(self._workers)} workers are starting"
        if not any(worker.ready for worker in self._workers):
            return "every worker is restarting"
        return None

    async def counters(self) -> tuple[dict[str, Any], dict[str, int]]:
        """Every worker's counters added up (those of exited workers and the keeper's
        included), the gauges workers report (stage-in progress), how many workers are
        ready, and the client connections open in all of them."""
        replies = await asyncio.gather(
            *(self._ask_stats(worker) for worker in self._workers), return_exceptions=True
        )
        gauges: dict[str, int] = {}
        for worker, reply in zip(self._workers, replies, strict=True):
            if isinstance(reply, dict):
                worker.last = reply["counters"]
                for name, value in reply["gauges"].items():
                    gauges[name] = gauges.get(name, 0) + value
        keeper = [self._keeper.metrics.snapshot()] if self._keeper is not None else []
        counters = add_snapshots([*keeper, *self._retired, *(w.last for w in self._workers)])
        gauges["workers"] = sum(worker.ready for worker in self._workers)
        gauges["client_connections"] = self._shared.client_connections()
        return counters, gauges

    async def _ask_stats(self, worker: _Worker) -> Message:
        if worker.channel is None or not worker.ready:
            raise ipc.PeerGone("not running")
        return await asyncio.wait_for(worker.channel.call("stats"), STATS_TIMEOUT)

    async def stop(self) -> None:
        """SIGTERM to every worker; kill those still running after STOP_GRACE."""
        self._stopping = True
        running = [w.process for w in self._workers if w.process and w.process.is_alive()]
        for process in running:
            process.terminate()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_GRACE)
        for process in running:
            if process.is_alive():
                logger.warning("worker pid %s did not stop in time; killed", process.pid)
                process.kill()
                process.join()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- one worker's life ------------------------------------------------------------------

    def _spawn_all(self) -> None:
        try:
            # The fork server listens on a socket in a temporary directory: in a pod
            # with a read-only root file system, /tmp is not one, and the socket must
            # be private anyway. Set before the first start, used for no other file.
            self._private_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            tempfile.tempdir = str(self._private_dir)
            for worker in self._workers:
                self._spawn(worker)
        except Exception as e:
            self._spawn_failure = e

    def check_spawned(self) -> None:
        """Raise WorkersFailed if `spawn()` could not start the worker processes."""
        if self._spawn_failure is not None:
            raise WorkersFailed(f"cannot start the worker processes: {self._spawn_failure}")

    def _spawn(self, worker: _Worker) -> None:
        ours, theirs = socket.socketpair()
        inherited = Inherited(
            worker.index, self._argv, list(self._sockets), theirs, InheritedFd(self._shared.fd)
        )
        try:
            # Daemonic: if the main process fails or exits, it takes its workers along.
            worker.process = self._context.Process(
                target=_run_worker,
                args=(self._entry, inherited),
                name=f"burstbuffer-w{worker.index}",
                daemon=True,
            )
            worker.process.start()
        finally:
            theirs.close()
        worker.socket = ours

    async def _supervise(self, worker: _Worker) -> None:
        pause = RESTART_PAUSE
        while not self._stopping:
            started = time.monotonic()
            if worker.process is None:
                try:
                    self._spawn(worker)
                except (OSError, ValueError) as e:
                    logger.error("cannot start worker %d: %s; trying again", worker.index, e)
                    await asyncio.sleep(RESTART_PAUSE_MAX)
                    continue
            status = await self._serve_one(worker)
            worker.process = None
            if self._stopping:
                return
            assert self._keeper is not None
            self._keeper.worker_gone(worker.index)
            self._shared.worker_gone(worker.index)
            # What it counted stays; its view of the parents went with it.
            self._retired.append({**worker.last, "parent_state": {}})
            worker.last = {}
            pause = RESTART_PAUSE if time.monotonic() - started > STABLE_AFTER else pause * 2
            pause = min(pause, RESTART_PAUSE_MAX)
            logger.error(
                "worker %d exited (%s); its fills in progress were dropped; restarting in %.1fs",
                worker.index,
                _describe_status(status),
                pause,
            )
            await asyncio.sleep(pause)

    async def _serve_one(self, worker: _Worker) -> int:
        """Serve one worker process until it exits; its exit status."""
        assert worker.process is not None and worker.socket is not None

        async def from_worker(message: Message) -> Message | None:
            if message["op"] == "ready":
                worker.ready = True
                if all(w.ready for w in self._workers):
                    self.started_all.set()
                return None
            if message["op"] == "parent":
                # What one worker learned of the parent tier, for the others.
                news = {name: value for name, value in message.items() if name != "op"}
                for other in self._workers:
                    if other is not worker and other.channel is not None:
                        other.channel.notify("parent", **news)
                return None
            assert self._keeper is not None
            return await self._keeper.handle(worker.index, message)

        worker.channel = ipc.Channel(worker.socket, from_worker)
        worker.socket = None
        channel = asyncio.create_task(worker.channel.run())
        worker.channel.notify("start")
        try:
            return await _exit_status(worker.process)
        finally:
            worker.ready = False
            channel.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await channel
            worker.channel = None


async def _exit_status(process: multiprocessing.process.BaseProcess) -> int:
    """Wait (without blocking the loop) until a worker process exits."""
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()
    sentinel = process.sentinel  # readable once the process has exited

    def wake() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(sentinel, wake)
    try:
        await exited
    finally:
        loop.remove_reader(sentinel)
    process.join()
    return process.exitcode if process.exitcode is not None else -1


def _describe_status(status: int) -> str:
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit status {status}"
