"""Network namespaces of the benchmarks and the pod-run tests: made, entered, removed.

A namespace of its own gives a run the ports and addresses a pod has (a capture's 80
and 443, an origin's own address, iptables rules) without touching this machine's.
Code that runs inside one (`in_netns`) makes its sockets there, and so do the
processes it starts: a child is created in its parent thread's namespace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

_COMMAND_TIMEOUT = 10.0  # seconds for one `ip` or `sysctl`


def create_netns(
    name: str, addresses: Sequence[str] = (), sysctls: Mapping[str, str] | None = None
) -> None:
    """The network namespace `name`: loopback up with `addresses` (each /32) on it too,
    and `sysctls` (namespaced `net.*` settings) set, as a container runtime sets a
    pod's before any container starts."""
    commands = [["ip", "netns", "add", name], ["ip", "-n", name, "link", "set", "lo", "up"]]
    # On loopback: reachable from every process inside, and no interface type the
    # kernel may lack.
    commands += [["ip", "-n", name, "addr", "add", f"{a}/32", "dev", "lo"] for a in addresses]
    commands += [
        ["ip", "netns", "exec", name, "sysctl", "-q", "-w", f"{key}={value}"]
        for key, value in (sysctls or {}).items()
    ]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True, timeout=_COMMAND_TIMEOUT)
    except BaseException:
        delete_netns(name)
        raise


def delete_netns(name: str) -> None:
    """Kill what still runs in `name` (what its owner stopped is gone already), then
    remove it."""
    leftovers = subprocess.run(
        ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=_COMMAND_TIMEOUT
    ).stdout.split()
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=_COMMAND_TIMEOUT)


@contextlib.contextmanager
def netns(prefix: str, sysctls: Mapping[str, str] | None = None) -> Iterator[str]:
    """`with netns("bbbench") as name:` a new network namespace, removed on exit."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_netns(name, sysctls=sysctls)
    try:
        yield name
    finally:
        delete_netns(name)


def in_netns(netns: str, function: Callable[[], Any]) -> Any:
    """Call `function` in a thread that joined the network namespace `netns`.

    Sockets it creates stay in that namespace and may be used from any thread afterwards.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                os.setns(fd, os.CLONE_NEWNET)
            finally:
                os.close(fd)
            outcome["value"] = function()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
