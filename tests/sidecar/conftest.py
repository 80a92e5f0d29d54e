"""Real processes for the sidecar's end-to-end tests.

- origins: `bench.origin` processes on 127.0.0.1 with trustme certificates, named
  `origin.test` (intercepted), `tunnel.test` (not intercepted) and `badcert.test`
  (a certificate from a CA nobody trusts);
- the sidecar: `python -m sidecar` in its own mount namespace (`unshare -m`) whose
  /etc/hosts maps those names to loopback, so nothing ever leaves this machine;
- clients: real curl, wget and Python with a clean environment: the proxy and CA
  variables an injected pod would get, nothing from this machine.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from bench.harness import (
    PYTHON,
    OriginServer,
    Sidecar,
    clean_env,
    free_port,
    port_open,
    start_origin,
    start_process,
    wait_until,
)
from sidecar.core import native

# A bucket's host of the S3 signing family (`cache.policy`), served by the test origin.
SIGNING_HOST = "datasets.s3.amazonaws.com"
TEST_HOSTS = ("origin.test", "tunnel.test", "badcert.test", SIGNING_HOST)
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
CLIENT_TIMEOUT = 60  # seconds for one download

FILES = {"small.bin": 100 * 1024, "medium.bin": 3 * 1024 * 1024, "big.bin": 24 * 1024 * 1024}


@pytest.fixture(scope="session")
def needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: the sidecar runs with a private /etc/hosts")


@pytest.fixture(scope="session")
def hosts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hosts") / "hosts"
    path.write_text("127.0.0.1 localhost " + " ".join(TEST_HOSTS) + "\n")
    return path


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dataset")
    rng = random.Random(1234)
    for name, size in FILES.items():
        (directory / name).write_bytes(rng.randbytes(size))
    return directory


@pytest.fixture(scope="session")
def origin(
    origin_ca: trustme.CA, dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OriginServer]:
    """The dataset host: trusted through the sidecar's --upstream-ca."""
    server = start_origin(
        dataset,
        origin_ca,
        ["origin.test", "tunnel.test", SIGNING_HOST],
        tmp_path_factory.mktemp("origin"),
    )
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def plain_origin(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The dataset host over plain HTTP (`http://origin.test:PORT`): its port."""
    port = free_port()
    argv = [PYTHON, "-m", "bench.origin", "--dir", str(dataset), "--port", str(port)]
    process = start_process(argv, tmp_path_factory.mktemp("plain") / "origin.log")
    wait_until(lambda: port_open(port), "the plain HTTP origin")
    yield port
    process.stop()


@pytest.fixture(scope="session")
def bad_origin(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OriginServer]:
    """An origin whose certificate comes from a CA nobody trusts."""
    server = start_origin(dataset, trustme.CA(), ["badcert.test"], tmp_path_factory.mktemp("bad"))
    yield server
    server.process.stop()


@pytest.fixture
def start_sidecar(
    needs_root: None, origin: OriginServer, hosts_file: Path, tmp_path: Path
) -> Iterator[Callable[..., Sidecar]]:
    """Start a sidecar intercepting origin.test: `start_sidecar("--buffer-size", "8MiB")`."""
    started: list[Sidecar] = []

    def start(*args: str, directory: Path | None = None) -> Sidecar:
        base = directory or tmp_path / f"sidecar{len(started)}"
        base.mkdir(exist_ok=True)
        argv = ["--intercept", "origin.test", "--upstream-ca", str(origin.ca_pem), *args]
        sidecar = Sidecar(base, hosts_file, argv)
        started.append(sidecar)
        sidecar.start()
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop()


@pytest.fixture
def sidecar(start_sidecar: Callable[..., Sidecar]) -> Sidecar:
    return start_sidecar()


# -- clients, each as an unmodified program with only the pod's environment ------------


def pod_env(sidecar: Sidecar) -> dict[str, str]:
    """What the injector gives every app container (proxy-env capture)."""
    bundle = str(sidecar.bundle)
    return clean_env(
        http_proxy=sidecar.proxy,
        https_proxy=sidecar.proxy,
        HTTP_PROXY=sidecar.proxy,
        HTTPS_PROXY=sidecar.proxy,
        no_proxy="localhost,127.0.0.1",
        SSL_CERT_FILE=bundle,
        REQUESTS_CA_BUNDLE=bundle,
        CURL_CA_BUNDLE=bundle,
    )


@dataclass
class Download:
    returncode: int
    body: bytes
    stdout: str
    stderr: str


def curl(sidecar: Sidecar, url: str, *args: str, out: Path | None = None) -> Download:
    return _run_client(["curl", "-sS", "--fail", *args], url, sidecar, out)


def wget(sidecar: Sidecar, url: str, out: Path | None = None) -> Download:
    """GNU wget trusts only the system bundle: mount the pod bundle over it, as the pod does."""
    argv = [
        "unshare", "-m", "sh", "-c",
        'mount --bind "$0" /etc/ssl/certs/ca-certificates.crt && exec "$@"',
        str(sidecar.bundle), "wget", "-q", "--no-config",
    ]  # fmt: skip
    return _run_client(argv, url, sidecar, out, output_flag="-O")


def urllib_get(sidecar: Sidecar, url: str, out: Path | None = None) -> Download:
    script = (
        "import shutil, sys, urllib.request\n"
        "with urllib.request.urlopen(sys.argv[1], timeout=30) as r, open(sys.argv[2], 'wb') as f:\n"
        "    shutil.copyfileobj(r, f)\n"
    )
    return _run_client(["python3", "-I", "-c", script], url, sidecar, out, positional_out=True)


def requests_get(sidecar: Sidecar, url: str, out: Path | None = None) -> Download:
    script = (
        "import sys, requests\n"
        "r = requests.get(sys.argv[1], timeout=30, stream=True)\n"
        "r.raise_for_status()\n"
        "open(sys.argv[2], 'wb').write(r.raw.read())\n"
    )
    return _run_client([PYTHON, "-c", script], url, sidecar, out, positional_out=True)


def _run_client(
    argv: list[str],
    url: str,
    sidecar: Sidecar,
    out: Path | None,
    output_flag: str = "-o",
    positional_out: bool = False,
) -> Download:
    target = out or sidecar.directory / f"download-{time.monotonic_ns()}"
    full = [*argv, url, str(target)] if positional_out else [*argv, output_flag, str(target), url]
    done = subprocess.run(
        full, env=pod_env(sidecar), capture_output=True, timeout=CLIENT_TIMEOUT, cwd="/"
    )
    body = target.read_bytes() if target.exists() else b""
    target.unlink(missing_ok=True)
    return Download(
        done.returncode,
        body,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )


# -- an intercepted tunnel on the core, without the front end's decisions ---------------


class Terminator:
    """The core's way into an intercepted tunnel (`native.Arrival`) for one accepted
    socket `fd`: the CONNECT that comes is answered, and TLS with `config` is terminated
    inside it, whatever the request and the hello say. `stream` resolves to the secured
    stream, started with `protocol` (its bytes), or to the error that ended the
    connection."""

    def __init__(self, fd: int, config: native.TlsConfig, protocol: asyncio.Protocol) -> None:
        loop = asyncio.get_running_loop()
        self.stream: asyncio.Future[native.Stream] = loop.create_future()
        self._config = config
        self._protocol = protocol
        self._arrival = native.Arrival(fd, loop, self)
        self._arrival.start()

    def request(self, head: bytes) -> None:
        end = head.find(b"\r\n\r\n")
        if end < 0:
            self._arrival.peek_later(0.01)
        else:
            self._arrival.answer_connect(end + 4)

    def tunnelled(self, first: bytes) -> None:
        self._arrival.secure(self._config)

    def secured(self) -> None:
        self.stream.set_result(self._arrival.take_stream(self._protocol))

    def ended(self, error: OSError) -> None:
        self.stream.set_exception(error)


def open_tunnel(sock: socket.socket, authority: str) -> None:
    """CONNECT to `authority` on the blocking socket `sock`, and read the answer."""
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionResetError("closed before the CONNECT's answer")
        answer += chunk
    assert answer == ESTABLISHED, answer
