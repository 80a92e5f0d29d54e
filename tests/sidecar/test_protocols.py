"""Clients that are not HTTP/1.1 downloads, through the real sidecar (proxy variables).

A gRPC client (ALPN `h2` only) to an intercepted host is tunnelled to the origin
untouched; a WebSocket upgrade is relayed, then the connection is a byte tunnel; a
refused upgrade reaches the client as the origin sent it. A client offering both `h2`
and `http/1.1` is still served over HTTP/1.1, from the buffer. The origins are real
(grpcio, websockets; `tests/protocol_origin.py`), and so are the clients, each a
process with only the pod's environment. The capture modes are covered by the pod-run
client table (tests/injector/test_podrun.py).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from bench.harness import PYTHON, Process, Sidecar, free_port, start_process, wait_until
from tests.sidecar.conftest import CLIENT_TIMEOUT, curl, pod_env

sys.path.insert(0, str(Path(__file__).parents[1]))
from protocol_origin import GRPC_CLIENT, REFUSED_BODY, REFUSED_PATH, WS_CLIENT  # noqa: E402

pytestmark = pytest.mark.e2e

ALPN_REASON = "alpn-without-http/1.x"


@dataclass
class ProtocolOrigin:
    grpc_port: int
    ws_port: int
    process: Process


@pytest.fixture(scope="module")
def protocol_origin(
    origin_ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProtocolOrigin]:
    """gRPC and WebSocket servers for origin.test (intercepted), on loopback."""
    tmp = tmp_path_factory.mktemp("protocols")
    cert = origin_ca.issue_cert("origin.test")
    cert.private_key_pem.write_to_path(str(tmp / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp / "cert.pem"))
    grpc_port, ws_port = free_port(), free_port()
    argv = [PYTHON, str(Path(__file__).parents[1] / "protocol_origin.py")]
    argv += ["--grpc", f"127.0.0.1:{grpc_port}", "--ws", f"127.0.0.1:{ws_port}"]
    argv += ["--cert", str(tmp / "cert.pem"), "--key", str(tmp / "key.pem")]
    process = start_process(argv, tmp / "origin.log")
    wait_until(lambda: "ready" in process.output(), "the gRPC and WebSocket origins")
    yield ProtocolOrigin(grpc_port, ws_port, process)
    process.stop()


def run_client(sidecar: Sidecar, script: str, target: str) -> str:
    done = subprocess.run(
        [PYTHON, "-c", script, target, str(sidecar.bundle)],
        env=pod_env(sidecar),
        capture_output=True,
        timeout=CLIENT_TIMEOUT,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return done.stdout.decode().strip()


def test_a_grpc_client_is_tunnelled_untouched(
    sidecar: Sidecar, protocol_origin: ProtocolOrigin
) -> None:
    target = f"origin.test:{protocol_origin.grpc_port}"
    assert run_client(sidecar, GRPC_CLIENT, target) == "echo:hello"
    assert run_client(sidecar, GRPC_CLIENT, target) == "echo:hello"
    stats = sidecar.stats()
    assert stats["tunnelled_connections"] == 2, stats
    assert stats["tunnel_reasons"] == {ALPN_REASON: 2}, stats
    assert stats["tunnelled_bytes"] > 2 * len("echo:hello"), stats
    assert stats["hits"] == stats["misses"] == stats["passes"] == stats["entries"] == 0, stats
    exported = f'burstbuffer_tunnels_by_reason_total{{reason="{ALPN_REASON}"}} 2.0'
    assert exported in sidecar.metrics()
    # Named once by each worker that saw it, whatever the number of connections.
    assert sidecar.log().count("tunnelled untouched: origin.test,") in (1, 2), sidecar.log()


def test_a_websocket_is_relayed_both_ways_after_the_origins_101(
    sidecar: Sidecar, protocol_origin: ProtocolOrigin
) -> None:
    url = f"wss://origin.test:{protocol_origin.ws_port}/echo"
    assert run_client(sidecar, WS_CLIENT, url) == "hello"
    stats = sidecar.stats()
    assert stats["pass_reasons"] == {"upgrade": 1}, stats
    assert stats["hits"] == stats["misses"] == stats["entries"] == 0, stats
    # The 1 MiB message went out and came back through the relay.
    assert stats["tunnelled_bytes"] > 2 * 2**20, stats
    assert "pass (upgrade) GET https://origin.test" in sidecar.log()


def test_a_refused_upgrade_reaches_the_client_as_the_origin_sent_it(
    sidecar: Sidecar, protocol_origin: ProtocolOrigin
) -> None:
    url = f"wss://origin.test:{protocol_origin.ws_port}{REFUSED_PATH}"
    assert run_client(sidecar, WS_CLIENT, url) == f"refused 403 {REFUSED_BODY.strip()}"
    stats = sidecar.stats()
    assert stats["pass_reasons"] == {"upgrade": 1} and stats["entries"] == 0, stats


def test_a_client_offering_h2_and_http11_is_still_served_from_the_buffer(
    sidecar: Sidecar, origin: object
) -> None:
    url = origin.url("small.bin", case="h2-offered")  # type: ignore[attr-defined]
    for _ in range(2):
        done = curl(sidecar, url, "--http2", "-w", "%{http_version}")
        assert done.returncode == 0, done.stderr
        assert done.stdout == "1.1"
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits"]) == (1, 1), stats
    assert stats["tunnelled_connections"] == 0, stats


def test_an_upgrade_to_an_origin_that_is_down_is_answered_502(sidecar: Sidecar) -> None:
    url = f"wss://origin.test:{free_port()}/echo"  # nothing listens there
    reply = run_client(sidecar, WS_CLIENT, url)
    assert reply.startswith("refused 502 burstbuffer: upgrade failed: cannot connect"), reply
    stats = sidecar.stats()
    assert stats["upstream_errors"] == 1 and stats["pass_reasons"] == {"upgrade": 1}, stats
