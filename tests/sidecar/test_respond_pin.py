"""The fast response path is written against one mitmproxy release: keep the pins in step.

mitmproxy is imported in a child process: its dependencies raise deprecation warnings
at import time, which this suite turns into errors.
"""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
from mitmproxy import version
from mitmproxy.proxy.layers.http import _http1
from sidecar.mitm import PINNED_MITMPROXY, respond
assert version.VERSION == PINNED_MITMPROXY, (version.VERSION, PINNED_MITMPROXY)
assert getattr(_http1.Http1Server.send, "_burstbuffer", False), "the HTTP/1 patch is missing"
print(PINNED_MITMPROXY)
"""


def test_the_fast_path_loads_on_the_mitmproxy_the_package_pins() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (pin,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("mitmproxy")]
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert pin == f"mitmproxy=={done.stdout.strip()}"
