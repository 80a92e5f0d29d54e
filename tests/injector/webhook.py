"""A real `burstbuffer-injector serve` process for tests, and a TLS client for it."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

INJECTOR = Path(sys.executable).parent / "burstbuffer-injector"
SERVER_NAMES = ("burstbuffer-injector.burstbuffer.svc", "127.0.0.1")
_LISTENING = re.compile(r"serving https on 127\.0\.0\.1 port (\d+)")


def write_pair(
    ca: trustme.CA, directory: Path, cert_name: str = "tls.crt", key_name: str = "tls.key"
) -> None:
    """A serving certificate from `ca`, written atomically (as a Secret volume updates)."""
    issued = ca.issue_cert(*SERVER_NAMES)
    for name, blob in ((cert_name, b"".join(p.bytes() for p in issued.cert_chain_pems)),
                       (key_name, issued.private_key_pem.bytes())):  # fmt: skip
        partial = directory / f".{name}.tmp"
        partial.write_bytes(blob)
        os.replace(partial, directory / name)


@dataclass
class Webhook:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def context(self, ca: trustme.CA) -> ssl.SSLContext:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        return context

    def connection(
        self, ca: trustme.CA, context: ssl.SSLContext | None = None
    ) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=context or self.context(ca), timeout=10
        )

    def request(
        self,
        ca: trustme.CA,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        connection = self.connection(ca)
        try:
            headers = {"Content-Type": content_type} if body is not None else {}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def review(self, ca: trustme.CA, review: dict[str, Any]) -> dict[str, Any]:
        status, body = self.request(ca, "POST", "/mutate", json.dumps(review).encode())
        assert status == 200, body
        answer = json.loads(body)
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == review["request"]["uid"]
        return answer["response"]  # type: ignore[no-any-return]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def start_webhook(directory: Path, *extra: str) -> Webhook:
    """`serve` on 127.0.0.1 with the pair in `directory`; returns once it listens."""
    log = directory / "injector.log"
    argv = [str(INJECTOR), "serve", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--tls-cert", str(directory / "tls.crt"), "--tls-key", str(directory / "tls.key")]
    with open(log, "wb") as output:
        process = subprocess.Popen([*argv, *extra], stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = _LISTENING.search(log.read_text())
        if match:
            return Webhook(process, int(match.group(1)), log)
        if process.poll() is not None:
            raise AssertionError(f"the injector exited {process.returncode}: {log.read_text()}")
        time.sleep(0.05)
    process.kill()
    process.wait()
    raise AssertionError(f"the injector did not start: {log.read_text()}")
