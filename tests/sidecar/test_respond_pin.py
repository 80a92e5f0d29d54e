"""The fast response path is written against one mitmproxy release: keep the pins in step."""

import re
import tomllib
from pathlib import Path

from mitmproxy import version

from sidecar import respond


def test_the_package_pins_the_mitmproxy_the_fast_path_was_validated_with() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    (pin,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("mitmproxy")]
    assert re.fullmatch(r"mitmproxy==([\d.]+)", pin)
    assert pin == f"mitmproxy=={respond.PINNED_MITMPROXY}"
    assert version.VERSION == respond.PINNED_MITMPROXY


def test_the_http1_server_is_taught_to_skip_responses_we_wrote() -> None:
    from mitmproxy.proxy.layers.http import _http1

    assert getattr(_http1.Http1Server.send, "_burstbuffer", False)
