"""What the image tests share: an HTTPS origin on the pod network, and pods injected by
`burstbuffer-injector render` (the real entry point)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trustme
import yaml

from bench.harness import free_port, http_get
from injector import names

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def start_origin(
    node_ip: str, ca: trustme.CA, host: str, data: bytes, tmp: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """bench.origin on the node's address on the pod network, its certificate from `ca`
    for `host`, serving `data` as /files/data.bin: (process, its base URL). Its files
    (and the CA as origin-ca.pem) are kept in `tmp`."""
    (tmp / "files").mkdir(parents=True)
    (tmp / "files" / "data.bin").write_bytes(data)
    cert = ca.issue_cert(host, node_ip)
    cert.private_key_pem.write_to_path(str(tmp / "origin.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp / "origin.pem"))
    ca.cert_pem.write_to_path(str(tmp / "origin-ca.pem"))
    port = free_port()
    argv = [sys.executable, "-m", "bench.origin", "--dir", str(tmp / "files")]
    argv += ["--host", node_ip, "--port", str(port)]
    argv += ["--cert", str(tmp / "origin.pem"), "--key", str(tmp / "origin.key")]
    with open(tmp / "origin.log", "wb") as log:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, (tmp / "origin.log").read_text()
        try:
            http_get(f"https://{node_ip}:{port}/__requests", cafile=tmp / "origin-ca.pem")
            return process, f"https://{node_ip}:{port}"
        except OSError:
            time.sleep(0.1)
    process.terminate()
    raise AssertionError("the test origin did not start")


def origin_requests(base: str, cafile: Path) -> dict[str, int]:
    status, body = http_get(f"{base}/__requests", cafile=cafile)
    assert status == 200
    return json.loads(body)["requests"]  # type: ignore[no-any-return]


def render(pod: dict[str, Any], config: str, tmp: Path) -> dict[str, Any]:
    """`burstbuffer-injector render` with the injector configuration `config`, the
    command a user runs."""
    (tmp / "config.yaml").write_text(config)
    argv = [str(VENV_BIN / "burstbuffer-injector"), "render", "--config", str(tmp / "config.yaml")]
    done = subprocess.run(
        argv, input=yaml.safe_dump(pod).encode(), capture_output=True, timeout=60, check=True
    )
    rendered = yaml.safe_load(done.stdout)
    assert isinstance(rendered, dict)
    return rendered


def sidecar_of(pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod["spec"]
    return next(
        c for c in (spec.get("initContainers") or []) + spec["containers"]
        if c["name"] == names.CONTAINER
    )  # fmt: skip


def admin_port_of(sidecar: dict[str, Any]) -> int:
    """The container port the injected sidecar serves /healthz, /metrics and /stats on."""
    return int(
        next(p["containerPort"] for p in sidecar["ports"] if p["name"] == names.ADMIN_PORT_NAME)
    )


def plain_pod(name: str, intercept: str, script: str, image: str) -> dict[str, Any]:
    """A pod whose app container, UID 1000, runs `script` with an `out` emptyDir on /out,
    asking for the hosts `intercept` (comma-separated) to be intercepted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": {names.INTERCEPT: intercept}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "containers": [
                {
                    "name": "app",
                    "image": image,
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                }
            ],
            "volumes": [{"name": "out", "emptyDir": {}}],
        },
    }
