"""What a sidecar's processes hold, read from /proc: descriptors, TCP sockets by state.

The sidecar is a main process, a fork server and workers: a leak may sit in any of
them, so every figure here covers the whole process tree.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.harness import process_tree

# /proc/net/tcp's `st` column.
ESTABLISHED = "01"
CLOSE_WAIT = "08"


def open_fds(pid: int) -> int:
    """Descriptors open in `pid`'s whole process tree."""
    return sum(len(os.listdir(f"/proc/{member}/fd")) for member in process_tree(pid))


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


def _tcp_inodes(state: str, local_port: int | None, remote_port: int | None) -> set[int]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != state:
                continue
            if local_port is not None and _port(fields[1]) != local_port:
                continue
            if remote_port is not None and _port(fields[2]) != remote_port:
                continue
            found.add(int(fields[9]))
    return found


def sockets(
    pid: int, state: str, local_port: int | None = None, remote_port: int | None = None
) -> int:
    """TCP sockets in `state` held by `pid` alone (with those ports, if given)."""
    inodes = _tcp_inodes(state, local_port, remote_port)
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:[") and int(link[8:-1]) in inodes:
            count += 1
    return count


def tree_sockets(
    pid: int, state: str, local_port: int | None = None, remote_port: int | None = None
) -> int:
    """TCP sockets in `state` held anywhere in `pid`'s process tree."""
    return sum(sockets(m, state, local_port, remote_port) for m in process_tree(pid))


def settled(pid: int, proxy_port: int, origin_port: int, baseline: int) -> bool:
    """No client connection left open (none in CLOSE-WAIT, none established on the
    proxy port), and no more descriptors than `baseline` but for the connections to
    the origin that the sidecar keeps alive for its next fetches."""
    if tree_sockets(pid, CLOSE_WAIT) or tree_sockets(pid, ESTABLISHED, proxy_port):
        return False
    pooled = tree_sockets(pid, ESTABLISHED, remote_port=origin_port)
    return open_fds(pid) - pooled <= baseline
