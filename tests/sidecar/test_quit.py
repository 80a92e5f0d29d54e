"""POST /quitquitquit stops the sidecar as SIGTERM does (exit status 0), for the pod's own
containers only: the sidecar runs in a network namespace of its own, as in a pod, with its
admin endpoints on a "pod IP" (an address of the namespace's own, like the one the
kubelet probes); a request from that address is refused, one from 127.0.0.1 stops it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import PYTHON, ROOT, Process, clean_env, start_process, wait_until
from sidecar.runtime.admin import is_loopback_peer, listen_hosts

pytestmark = pytest.mark.e2e

POD_IP = "198.51.100.7"
# The namespace is the sidecar's alone: the pod's own ports cannot be in use there.
ADMIN_PORT = 3129
QUIT = "/quitquitquit"


def status_of(sidecar: Process, method: str, url: str) -> int:
    """The status of one request made from inside the sidecar's network namespace (as
    from another container of its pod), with curl; 0 when nothing answered."""
    data = ["--data", ""] if method == "POST" else []
    done = subprocess.run(
        ["nsenter", f"--net=/proc/{sidecar.popen.pid}/ns/net", "curl", "-s", "-o", "/dev/null",
         "-w", "%{http_code}", "-X", method, *data, url],
        env=clean_env(), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return int(done.stdout or 0)


def url(host: str, path: str) -> str:
    return f"http://{host}:{ADMIN_PORT}{path}"


@pytest.fixture
def pod_sidecar(needs_root: None, tmp_path: Path) -> Iterator[Process]:
    """A ready sidecar alone in a network namespace whose loopback device also holds
    POD_IP, its `--admin-host` (as the injector sets it)."""
    network = f'ip link set lo up && ip addr add {POD_IP}/32 dev lo && exec "$@"'
    argv = [
        "unshare", "-n", "sh", "-c", network, "sh",
        PYTHON, "-m", "sidecar", "--workers", "1",
        "--admin-host", POD_IP, "--admin-port", str(ADMIN_PORT),
        "--buffer-dir", str(tmp_path / "buffer"), "--ca-dir", str(tmp_path / "ca"),
        "--trust-dir", str(tmp_path / "trust"),
    ]  # fmt: skip
    (tmp_path / "buffer").mkdir()
    sidecar = start_process(argv, tmp_path / "sidecar.log", clean_env(PYTHONPATH=str(ROOT)))
    try:
        wait_until(
            lambda: (
                sidecar.popen.poll() is None
                and status_of(sidecar, "GET", url(POD_IP, "/healthz")) == 200
            ),
            "the sidecar's /healthz on the pod IP",
        )
        yield sidecar
    finally:
        sidecar.stop()


def test_a_post_from_loopback_stops_the_sidecar_with_status_0(pod_sidecar: Process) -> None:
    assert status_of(pod_sidecar, "GET", url("127.0.0.1", "/healthz")) == 200
    assert status_of(pod_sidecar, "POST", url("127.0.0.1", QUIT)) == 200
    assert pod_sidecar.popen.wait(timeout=10) == 0
    log = pod_sidecar.output()
    assert f"stopping: asked by POST {QUIT}" in log
    assert "Traceback" not in log


def test_only_a_post_from_loopback_stops_it(pod_sidecar: Process) -> None:
    # From the pod IP (another pod, or the kubelet, would come from elsewhere: further
    # still), and with another method: refused, and the sidecar serves on.
    assert status_of(pod_sidecar, "POST", url(POD_IP, QUIT)) == 403
    assert status_of(pod_sidecar, "GET", url("127.0.0.1", QUIT)) == 405
    assert status_of(pod_sidecar, "PUT", url("127.0.0.1", QUIT)) == 405
    assert status_of(pod_sidecar, "GET", url(POD_IP, "/healthz")) == 200
    assert pod_sidecar.popen.poll() is None


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", ("127.0.0.1",)),
        ("::1", ("::1",)),
        ("localhost", ("localhost",)),
        ("0.0.0.0", ("0.0.0.0",)),
        ("::", ("::",)),
        ("10.244.0.7", ("10.244.0.7", "127.0.0.1")),
        ("fd00::7", ("fd00::7", "127.0.0.1")),
        ("sidecar.example", ("sidecar.example", "127.0.0.1")),
    ],
)
def test_the_admin_endpoints_also_listen_on_loopback_unless_covered(
    host: str, expected: tuple[str, ...]
) -> None:
    assert listen_hosts(host) == expected


@pytest.mark.parametrize(
    ("peer", "loopback"),
    [
        (("127.0.0.1", 40000), True),
        (("127.9.9.9", 40000), True),
        (("::1", 40000, 0, 0), True),
        (("::ffff:127.0.0.1", 40000, 0, 0), True),
        (("10.244.0.7", 40000), False),
        (("::ffff:10.244.0.7", 40000, 0, 0), False),
        (("fe80::1%eth0", 40000, 0, 2), False),
        ("", False),
        (None, False),
    ],
)
def test_only_loopback_peers_count_as_the_pods_own(peer: object, loopback: bool) -> None:
    assert is_loopback_peer(peer) is loopback
