"""Local stand-ins for a pod's network: origin and sidecar processes on loopback.

Used by `make demo`, the benchmarks and the end-to-end tests alike, so that all of
them start the real programs the same way. The sidecar runs in its own mount
namespace whose /etc/hosts maps the test host names to 127.0.0.1 (root, `unshare`),
so nothing ever leaves this machine.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
START_TIMEOUT = 20.0  # seconds for a process to come up


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment for a child process: PATH and a locale, plus `extra`.

    Nothing CA- or proxy-related is inherited; `PIP_CONFIG_FILE=/dev/null` keeps pip
    from reading a machine-wide pip.conf that names a CA of its own.
    """
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": "/nonexistent",
        "PIP_CONFIG_FILE": "/dev/null",
    }
    env.update(extra)
    return env


# Where free ports are looked for (`free_port`), up to the kernel's ephemeral range: above
# every port a server here is configured with, the test cluster's among them (etcd's 23790
# and 23800, CoreDNS' 18181, Kubernetes' 10248–10259: `tests.cluster.components`). A test
# server that took one of those first kept the cluster from starting.
FIXED_PORTS_FROM = 24_000


def ephemeral_ports() -> range:
    """The ports the kernel picks a connection's local end from."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default
    return range(int(low), int(high) + 1)


# Ports `free_port` handed out in this process: a server may not have bound its port yet
# when the next is asked for (a sidecar's proxy and admin ports are picked together), and
# one of them twice failed its start one time in a few thousand.
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, for a server about to start, and none this
    process handed out before. Taken from below the ephemeral range: a port from that
    range may be taken by any connection's local end between this check and the
    server's bind (a busy machine makes thousands), one below it only by another
    server."""
    below = ephemeral_ports().start
    for _ in range(100 if below > FIXED_PORTS_FROM else 0):
        port = random.randrange(FIXED_PORTS_FROM, below)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:  # no room below the ephemeral range: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def http_get(url: str, timeout: float = 5.0, cafile: Path | None = None) -> tuple[int, bytes]:
    """A direct request (no proxy) to a local admin or control endpoint."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if cafile is not None:
        context = ssl.create_default_context(cafile=str(cafile))
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def private_mounts(mounts: Mapping[str, Path], argv: list[str]) -> list[str]:
    """`argv` run in its own mount namespace with each file `mounts[target]` bound over
    `target` (e.g. a private /etc/hosts, a pod's CA bundle over the system one)."""
    binds = [f'mount --bind "${i}" {target}' for i, target in enumerate(mounts, start=1)]
    script = " && ".join([*binds, f"shift {len(mounts)}", 'exec "$@"'])
    return ["unshare", "-m", "sh", "-c", script, "sh", *map(str, mounts.values()), *argv]


def as_user(uid: int, argv: list[str]) -> list[str]:
    """`argv` run as `uid` (and its group), able to read what root's benchmark made:
    CAP_DAC_READ_SEARCH, kept across exec, so that the interpreter under /root and the
    lab's private directory stay reachable, and nothing else."""
    privileges = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    keep = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return ["setpriv", *privileges, *keep, *argv]


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (a sidecar's workers, nginx's workers). A process or
    thread that ends while the tree is read is left out, with its children: it is gone."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                children = (task / "children").read_text().split()
            except FileNotFoundError:
                continue  # a thread that ended between the listing and the read
            pending.extend(int(child) for child in children)
    return found


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of `pid`'s whole process tree so far, to the
    nanosecond: each process's CPU-time clock, which counts the threads that ended too.
    `/proc/PID/stat` counts in clock ticks, 10 ms a process: a few percent of what a
    benchmark's 1,500 kept-alive hits cost, on each of a sidecar's processes."""
    total = 0.0
    for member in process_tree(pid):
        try:
            total += time.clock_gettime(process_cpu_clock(member))
        except OSError:
            pass  # it ended since the tree was read, and its time with it
    return total


def process_cpu_clock(pid: int) -> int:
    """The id of `pid`'s CPU-time clock, as clock_getcpuclockid(3) makes it (Linux's
    MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)), which Python's `time` does not offer."""
    return (~pid << 3) | 2


def settle(pid: int, timeout: float = 20.0) -> None:
    """Wait until `pid`'s process tree is idle (under 2% of a core over a quarter of a
    second): what a server does right after it is ready (the sidecar's workers load
    mitmproxy then) is not part of what a benchmark then measures."""
    deadline = time.monotonic() + timeout
    before = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = cpu_seconds(pid)
        if now - before < 0.005:
            return
        before = now
    raise TimeoutError(f"process {pid} still busy after {timeout}s")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Process:
    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_process(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Process:
    handle = open(log, "wb")
    popen = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    handle.close()
    return Process(popen, log)


@dataclass
class OriginServer:
    port: int
    process: Process
    ca_pem: Path

    def url(self, name: str, host: str = "origin.test", **query: object) -> str:
        return f"https://{host}:{self.port}{self.target(name, **query)}"

    def requests(self) -> dict[str, Any]:
        _, body = http_get(f"https://127.0.0.1:{self.port}/__requests", cafile=self.ca_pem)
        return json.loads(body)

    def target(self, name: str, **query: object) -> str:
        """The request target (`/files/name?query`) the origin counts requests by."""
        suffix = "?" + urllib.parse.urlencode(query) if query else ""
        return f"/files/{name}{suffix}"

    def count(self, name: str, **query: object) -> int:
        """Requests seen for this URL, ranged ones included."""
        return self.requests()["requests"].get(self.target(name, **query), 0)

    def gets(self, name: str, **query: object) -> int:
        """GET requests for this URL (every request but HEAD), ranged ones included."""
        seen = self.requests()
        target = self.target(name, **query)
        return seen["requests"].get(target, 0) - seen["heads"].get(target, 0)

    def bytes_sent(self) -> int:
        """Body bytes the origin has sent, to every client, since it started."""
        return int(self.requests()["bytes"])

    def full_fetches(self, name: str, **query: object) -> int:
        """Requests for this URL without a Range header: fetches of the whole object."""
        target = self.target(name, **query)
        seen = self.requests()
        return seen["requests"].get(target, 0) - seen["ranges"].get(target, 0)


def start_origin(
    directory: Path, ca: trustme.CA, names: list[str], tmp: Path, rate: float | None = None
) -> OriginServer:
    cert = ca.issue_cert(*names, "127.0.0.1")
    cert_pem, key_pem, ca_pem = tmp / "origin.pem", tmp / "origin.key", tmp / "origin-ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(key_pem))
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    ca.cert_pem.write_to_path(str(ca_pem))
    port = free_port()
    argv = [PYTHON, "-m", "bench.origin", "--dir", str(directory), "--port", str(port)]
    argv += ["--cert", str(cert_pem), "--key", str(key_pem)]
    if rate:
        argv += ["--rate", str(rate)]
    process = start_process(argv, tmp / "origin.log")
    wait_until(lambda: port_open(port), f"origin on port {port}")
    return OriginServer(port, process, ca_pem)


# The Hugging Face hosts `bench.hub` answers as (all under `*.hf.co`, so the sidecar's
# default intercept list and its Hub rules apply to them).
HUB_HOSTS = ("hub.hf.co", "cas-server.xethub.hf.co", "cas-bridge.xethub.hf.co", "cdn-lfs.hf.co")


@dataclass
class HubServer:
    """A `bench.hub` process: the Hub, its CAS and its CDNs on one port."""

    port: int
    process: Process
    ca_pem: Path

    @property
    def endpoint(self) -> str:
        """What `HF_ENDPOINT` is set to."""
        return f"https://{HUB_HOSTS[0]}:{self.port}"

    def requests(self) -> dict[str, Any]:
        """Counts by kind (`resolve`, `api`, `token`, `reconstruction`, `xorb`, `bridge`,
        `lfs`), `statuses` by `"<kind> <status>"`, `xorbs` by `"<xorb> <range>"`."""
        _, body = http_get(f"https://127.0.0.1:{self.port}/__requests", cafile=self.ca_pem)
        return json.loads(body)

    def refuse_xorbs(self, count: int) -> None:
        """Refuse the next `count` xorb requests with 403, as expired URLs are."""
        url = f"https://127.0.0.1:{self.port}/__refuse?xorbs={count}"
        context = ssl.create_default_context(cafile=str(self.ca_pem))
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )
        with opener.open(urllib.request.Request(url, method="POST"), timeout=5) as response:
            assert response.status == 204


def start_hub(
    directory: Path, ca: trustme.CA, tmp: Path, *args: str, port: int | None = None
) -> HubServer:
    """Start `bench.hub` over the repositories of `directory` (`models/<owner>/<name>`,
    `datasets/...`) with a certificate from `ca` for every Hub host; `args` are its
    other flags (`--expiry 3`, `--xorb-size ...`). Waits until it has cut its files into
    xorbs and listens."""
    cert = ca.issue_cert(*HUB_HOSTS, "127.0.0.1")
    cert_pem, key_pem, ca_pem = tmp / "hub.pem", tmp / "hub.key", tmp / "hub-ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(key_pem))
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    ca.cert_pem.write_to_path(str(ca_pem))
    port = port or free_port()
    argv = [PYTHON, "-m", "bench.hub", "--dir", str(directory), "--port", str(port)]
    argv += ["--cert", str(cert_pem), "--key", str(key_pem), "--xorb-dir", str(tmp / "xorbs")]
    process = start_process([*argv, *args], tmp / "hub.log")

    def up() -> bool:
        if process.popen.poll() is not None:
            raise RuntimeError(f"bench.hub exited:\n{process.output()}")
        return port_open(port)

    wait_until(up, f"bench.hub on port {port}", timeout=300)  # ~20 MiB/s cut into xorbs
    return HubServer(port, process, ca_pem)


@dataclass
class Sidecar:
    directory: Path
    hosts_file: Path
    args: list[str]
    resolv_conf: Path | None = None  # its /etc/resolv.conf (this machine's if None)
    # Its UID (root if None), as the image's USER runs it; the lab's files stay
    # readable to it (CAP_DAC_READ_SEARCH), its own directory is its.
    user: int | None = None
    proxy_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    process: Process | None = None

    @property
    def buffer_dir(self) -> Path:
        return self.directory / "buffer"

    @property
    def ca_dir(self) -> Path:
        return self.directory / "ca"

    @property
    def trust_dir(self) -> Path:
        return self.directory / "trust"

    @property
    def bundle(self) -> Path:
        return self.trust_dir / "ca-bundle.crt"

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def start(self) -> None:
        self.launch()
        try:
            wait_until(self.healthy, "the sidecar's /healthz")
        except TimeoutError:
            raise TimeoutError(f"sidecar did not become healthy:\n{self.log()}") from None

    def launch(self) -> None:
        """Start the process without waiting for it to become healthy."""
        argv = [
            PYTHON, "-m", "sidecar",
            "--listen-port", str(self.proxy_port),
            "--admin-port", str(self.admin_port),
            "--buffer-dir", str(self.buffer_dir),
            "--ca-dir", str(self.ca_dir),
            "--trust-dir", str(self.trust_dir),
            *self.args,
        ]  # fmt: skip
        env = clean_env(PYTHONPATH=str(ROOT))
        if self.user is not None:
            os.chown(self.directory, self.user, self.user)
            argv = as_user(self.user, argv)
        mounts = {"/etc/hosts": self.hosts_file}
        if self.resolv_conf is not None:
            mounts["/etc/resolv.conf"] = self.resolv_conf
        argv = private_mounts(mounts, argv)
        self.process = start_process(argv, self.directory / "sidecar.log", env)

    @property
    def pid(self) -> int:
        """The sidecar's own process id (`unshare` and `sh` exec into it)."""
        assert self.process is not None
        return self.process.popen.pid

    def healthy(self) -> bool:
        assert self.process is not None
        if self.process.popen.poll() is not None:
            raise RuntimeError(f"sidecar exited:\n{self.log()}")
        try:
            return http_get(f"http://127.0.0.1:{self.admin_port}/healthz")[0] == 200
        except OSError:
            return False

    def stats(self) -> dict[str, int]:
        status, body = http_get(f"http://127.0.0.1:{self.admin_port}/stats")
        assert status == 200
        return json.loads(body)

    def metrics(self) -> str:
        """The Prometheus text of /metrics."""
        status, body = http_get(f"http://127.0.0.1:{self.admin_port}/metrics")
        assert status == 200
        return body.decode()

    def wait_for_entries(self, count: int) -> None:
        """Wait until `count` objects are committed (a commit may follow the last byte)."""
        wait_until(lambda: self.stats()["entries"] == count, f"{count} stored objects")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            self.process.stop(sig)

    def log(self) -> str:
        return self.process.output() if self.process else ""
