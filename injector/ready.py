"""Waiting for the sidecar in classic-sidecar mode (clusters without native sidecars).

These run inside the pod, from the same image as the sidecar:
- `wait` is the sidecar's postStart hook: the kubelet starts the next container only
  once it returns, so the app never starts before the proxy.
- `prime` is the first init container: it runs the sidecar until its /healthz turns 200
  (the CA and the trust files then exist in their volumes) and stops it, so the pod's own
  init containers find the trust files they mount.
"""

from __future__ import annotations

import http.client
import logging
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence

logger = logging.getLogger(__name__)

# A sidecar that does not stop within this after SIGTERM is killed.
_STOP_GRACE = 30.0
_POLL_INTERVAL = 0.2


def healthz_url(host: str, port: int) -> str:
    """The sidecar's /healthz URL (an IPv6 address is bracketed)."""
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/healthz"


def _healthy(url: str) -> bool:
    # No proxy: this process runs in the sidecar's container, whatever its environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, http.client.HTTPException):  # refused, reset, timed out, garbled
        return False


def wait_healthy(url: str, timeout: float, gave_up: Callable[[], bool] = lambda: False) -> bool:
    """Poll `url` until it answers 200 (True), the timeout passes or `gave_up()` (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not gave_up():
        if _healthy(url):
            return True
        time.sleep(_POLL_INTERVAL)
    return False


def prime(command: Sequence[str], url: str, timeout: float) -> int:
    """Run `command` until `url` is healthy, then stop it; 0 on success."""
    process = subprocess.Popen(list(command))
    try:
        healthy = wait_healthy(url, timeout, gave_up=lambda: process.poll() is not None)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(_STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    if not healthy:
        logger.error("the sidecar did not become healthy at %s (exit %s)", url, process.returncode)
        return 1
    logger.info("the sidecar created the CA and trust files")
    return 0
