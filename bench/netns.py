"""Network namespaces of the benchmarks and the pod-run tests: calls made inside one."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any


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
