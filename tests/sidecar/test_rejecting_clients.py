"""Clients that bring their own roots, through the real sidecar (proxy variables).

Each client trusts the test origin's CA only, whatever the pod's bundle and variables
say: Python with an SSLContext of its own (`cafile`), a Go binary with an x509.CertPool
of its own, curl with `--cacert`, a JVM with a trust store of its own. Each refuses the
pod CA's certificate, so its first download fails, as it would without the sidecar's
memory; the sidecar remembers it by its ClientHello and tunnels its retries to the
origin untouched, where they succeed (the origin's own certificate is the only one it
can accept), uncached. wget, which trusts the pod's bundle, is still intercepted and
served from the buffer. The capture modes that mitmproxy terminates are covered by the
pod-run tests (tests/injector/test_podrun.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.harness import OriginServer, Sidecar, wait_until
from certs.bundle import trust_store
from tests.buildcache import go_build
from tests.sidecar.conftest import CLIENT_TIMEOUT, pod_env, wget

pytestmark = pytest.mark.e2e

REASON = "client-rejected-ca"
# How the sidecar tells of a client it remembers (once per client and host).
REFUSED = "refused the pod CA's certificate for origin.test"
RETRIES = 3
CLIENTS = ("python", "go", "curl", "java")
PYTHON_OWN_ROOTS = (
    "import ssl, sys, urllib.request\n"
    "context = ssl.create_default_context(cafile=sys.argv[3])\n"
    "opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))\n"
    "with opener.open(sys.argv[1], timeout=30) as r, open(sys.argv[2], 'wb') as f:\n"
    "    f.write(r.read())\n"
)
# The client table's own programs (tests/injector/test_podrun.py).
CLIENTS_DIR = Path(__file__).parents[1] / "injector" / "clients"


def client_argv(
    client: str, sidecar: Sidecar, origin: OriginServer
) -> Callable[[str, str], list[str]]:
    """The command that downloads a URL to a file with `client`, trusting the origin's CA
    only; skips when this machine lacks the client."""
    ca = str(origin.ca_pem)
    if client == "python":
        return lambda url, out: ["python3", "-I", "-c", PYTHON_OWN_ROOTS, url, out, ca]
    if client == "go":
        binary = go_build(CLIENTS_DIR / "fetch.go", {"PATH": os.defpath})
        if not isinstance(binary, Path):
            pytest.skip(binary)
        return lambda url, out: [str(binary), url, out, ca]
    if client == "curl":
        return lambda url, out: ["curl", "-sS", "--fail", "--cacert", ca, "-o", out, url]
    if shutil.which("java") is None:
        pytest.skip("Java: no JDK here (.ci/system-deps installs openjdk-17-jdk-headless as root)")
    store = sidecar.directory / "origin-trust.p12"
    store.write_bytes(trust_store(origin.ca_pem.read_bytes()))
    java = ["java", f"-Djavax.net.ssl.trustStore={store}", "-Djavax.net.ssl.trustStoreType=PKCS12"]
    java += ["-Dhttps.proxyHost=127.0.0.1", f"-Dhttps.proxyPort={sidecar.proxy_port}"]
    return lambda url, out: [*java, str(CLIENTS_DIR / "Fetch.java"), url, out]


def download(sidecar: Sidecar, argv: list[str], out: Path) -> tuple[int, bytes, str]:
    """(exit status, what was written, stderr) of one run of a client, with only the pod's
    environment (the proxy variables, the pod's bundle, which it does not read)."""
    done = subprocess.run(
        argv, env=pod_env(sidecar), capture_output=True, timeout=CLIENT_TIMEOUT, cwd="/"
    )
    body = out.read_bytes() if out.exists() else b""
    out.unlink(missing_ok=True)
    return done.returncode, body, done.stderr.decode(errors="replace")


@pytest.mark.parametrize("client", CLIENTS)
def test_a_client_with_roots_of_its_own_is_tunnelled_from_its_retry_on(
    client: str, start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    # Two workers: a retry may land on either, and each must know the client.
    sidecar = start_sidecar("--workers", "2")
    argv = client_argv(client, sidecar, origin)
    expected = (dataset / "small.bin").read_bytes()
    url, out = origin.url("small.bin", case=client), sidecar.directory / f"{client}.out"
    status, _, stderr = download(sidecar, argv(url, str(out)), out)
    assert status != 0, "the pod CA's certificate was accepted"
    # A retry waits until the sidecar has read the refusal, as a retry after a backoff
    # does: one sent at once may reach another worker first, on a loaded machine.
    wait_until(lambda: REFUSED in sidecar.log(), "the refusal remembered")
    for _ in range(RETRIES):
        status, body, stderr = download(sidecar, argv(url, str(out)), out)
        assert status == 0, stderr[-3000:]
        assert body == expected
    stats = sidecar.stats()
    assert stats["tunnel_reasons"] == {REASON: RETRIES}, stats
    assert stats["hits"] == stats["misses"] == stats["entries"] == 0, stats  # uncached
    assert origin.gets("small.bin", case=client) == RETRIES
    exported = f'burstbuffer_tunnels_by_reason_total{{reason="{REASON}"}} {RETRIES}.0'
    assert exported in sidecar.metrics()
    log = sidecar.log()
    assert log.count(REFUSED) == 1, log
    assert f"{sidecar.trust_dir}" in log and "ca-bundle.p12" in log

    # A client that trusts the pod CA is still intercepted: a miss, then a hit.
    trusting = origin.url("small.bin", case=f"{client}-trusting")
    for _ in range(2):
        done = wget(sidecar, trusting)
        assert done.returncode == 0, done.stderr
        assert done.body == expected
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits"]) == (1, 1), stats
    assert stats["tunnel_reasons"] == {REASON: RETRIES}, stats
    assert origin.gets("small.bin", case=f"{client}-trusting") == 1
