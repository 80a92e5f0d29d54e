"""The classic-sidecar helpers `wait` and `prime`, against real local processes."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from injector import ready


class _Healthz(BaseHTTPRequestHandler):
    healthy_after = 0.0

    def do_GET(self) -> None:
        ok = self.path == "/healthz" and time.monotonic() >= self.healthy_after
        self.send_response(200 if ok else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def admin() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_healthz_url() -> None:
    assert ready.healthz_url("10.0.0.7", 3129) == "http://10.0.0.7:3129/healthz"
    assert ready.healthz_url("fd00::7", 3129) == "http://[fd00::7]:3129/healthz"


def test_wait_polls_until_healthy(admin: ThreadingHTTPServer) -> None:
    _Healthz.healthy_after = time.monotonic() + 0.6
    url = ready.healthz_url("127.0.0.1", admin.server_address[1])
    started = time.monotonic()
    assert ready.wait_healthy(url, timeout=10)
    assert 0.5 < time.monotonic() - started < 5


def test_wait_gives_up(admin: ThreadingHTTPServer) -> None:
    _Healthz.healthy_after = time.monotonic() + 3600
    url = ready.healthz_url("127.0.0.1", admin.server_address[1])
    assert not ready.wait_healthy(url, timeout=0.5)


def test_prime_stops_the_command_once_healthy(admin: ThreadingHTTPServer) -> None:
    _Healthz.healthy_after = 0.0
    url = ready.healthz_url("127.0.0.1", admin.server_address[1])
    started = time.monotonic()
    assert ready.prime([sys.executable, "-c", "import time; time.sleep(60)"], url, 10) == 0
    assert time.monotonic() - started < 10  # stopped, not waited for


def test_prime_fails_when_the_command_exits_first() -> None:
    url = ready.healthz_url("127.0.0.1", 9)  # nothing listens there
    started = time.monotonic()
    assert ready.prime([sys.executable, "-c", "raise SystemExit(3)"], url, 30) == 1
    assert time.monotonic() - started < 10
