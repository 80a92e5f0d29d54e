"""The benchmark clients: unmodified wget and curl, timed, with nothing from this machine.

Each client runs with `clean_env()` plus only what a pod would set (the proxy and
CURL_CA_BUNDLE), in its own mount namespace whose /etc/hosts names the test hosts;
wget trusts only the system bundle, so the route's bundle is mounted over it, as an
injected pod does. Direct and proxied runs go through the same wrapper, so both pay
the same few milliseconds of `unshare`.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import clean_env, private_mounts

SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CLIENT_TIMEOUT = 900  # seconds for one client run (the throttled cold download is ~50 s)
# Per-transfer figures curl prints, one line per URL.
CURL_WRITE_OUT = "%{http_code} %{size_download} %{num_connects} %{time_total}\n"


class ClientFailed(RuntimeError):
    """A client exited with an error or received something other than the whole file."""


@dataclass(frozen=True)
class Route:
    """How a client reaches a server: the CA bundle it trusts, the proxy it uses."""

    bundle: Path
    hosts: Path  # the client's /etc/hosts
    proxy: str | None = None  # None: straight to the server

    def env(self, **extra: str) -> dict[str, str]:
        proxies = {"https_proxy": self.proxy, "http_proxy": self.proxy} if self.proxy else {}
        return clean_env(**proxies, **extra)


@dataclass(frozen=True)
class Transfer:
    """One of curl's transfers: status, body bytes, new connections, seconds."""

    status: int
    size: int
    connects: int
    seconds: float


def wget(route: Route, url: str, out: Path | str = "/dev/null") -> float:
    """Seconds GNU wget takes to download `url` into `out` (one try, no retries)."""
    argv = ["wget", "-q", "--no-config", "--tries=1", "-O", str(out), url]
    mounts = {"/etc/hosts": route.hosts, SYSTEM_BUNDLE: route.bundle}
    started = time.perf_counter()
    _run(private_mounts(mounts, argv), route.env())
    return time.perf_counter() - started


def curl(route: Route, url: str, size: int, out: Path | str = "/dev/null") -> float:
    """Seconds curl takes to download `url` (`size` bytes expected) into `out`."""
    started = time.perf_counter()
    (transfer,) = curl_many(route, [url], out)
    elapsed = time.perf_counter() - started
    _check(transfer, size)
    return elapsed


def curl_many(route: Route, urls: list[str], out: Path | str = "/dev/null") -> list[Transfer]:
    """One curl invocation fetching `urls` in order; curl reuses its connection (or its
    proxy tunnel) between them when it can."""
    with tempfile.NamedTemporaryFile("w", suffix=".curlrc") as config:
        # Long URL lists go in a config file rather than on the command line.
        config.writelines(f'url = "{url}"\noutput = "{out}"\n' for url in urls)
        config.flush()
        argv = ["curl", "-sS", "--fail", "-w", CURL_WRITE_OUT, "-K", config.name]
        env = route.env(CURL_CA_BUNDLE=str(route.bundle))
        stdout = _run(private_mounts({"/etc/hosts": route.hosts}, argv), env)
    transfers = [_parse_transfer(line) for line in stdout.splitlines()]
    if len(transfers) != len(urls):
        raise ClientFailed(f"curl reported {len(transfers)} transfers for {len(urls)} URLs")
    return transfers


def check_transfers(transfers: list[Transfer], size: int) -> None:
    """Every transfer was a 200 of `size` bytes."""
    for transfer in transfers:
        _check(transfer, size)


def _check(transfer: Transfer, size: int) -> None:
    if transfer.status != 200 or transfer.size != size:
        raise ClientFailed(f"expected 200 with {size} bytes, got {transfer}")


def _parse_transfer(line: str) -> Transfer:
    status, size, connects, seconds = line.split()
    return Transfer(int(status), int(size), int(connects), float(seconds))


def _run(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, timeout=CLIENT_TIMEOUT, cwd="/")
    if done.returncode != 0:
        raise ClientFailed(
            f"{' '.join(argv[-8:])} exited with {done.returncode}: "
            f"{done.stderr.decode(errors='replace').strip()}"
        )
    return done.stdout.decode()
