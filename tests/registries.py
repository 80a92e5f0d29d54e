"""How tests reach package registries: with this machine's own settings.

Some tests install the clients they run: Node 22 with npm, the image's dependencies with
pip inside `docker build`, Debian roots with debootstrap. Those package managers are not
under test; they need what this machine gives its own package managers to reach their
registries: a CA (behind a TLS-inspecting proxy), an index or mirror, a proxy. The
clients under test never get any of it: every test runs with the CA and proxy variables
removed (tests/conftest.py), and each client gets an environment built from nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

# Read at import, before any test removes the CA and proxy variables from its environment.
_MACHINE_ENV = dict(os.environ)
# What package managers read for trust, index and proxy (npm from NODE_EXTRA_CA_CERTS and
# npm_config_*, pip from PIP_*, debootstrap's wget and apt from the proxy variables).
_SETTINGS = re.compile(
    r"SSL_CERT_FILE|SSL_CERT_DIR|NODE_EXTRA_CA_CERTS|PIP_\w+|npm_config_\w+|NPM_CONFIG_\w+"
    r"|http_proxy|https_proxy|no_proxy|HTTP_PROXY|HTTPS_PROXY|NO_PROXY"
)
DEBIAN_ARCHIVE = "http://deb.debian.org/debian"  # Debian's own redirector
_DEBIAN_URI = re.compile(r"(?:^deb\s+(?:\[[^\]]*\]\s+)?|^URIs:.*?)(https?://\S+/debian)/?(?:\s|$)")


def package_manager_env(**extra: str) -> dict[str, str]:
    """The environment for a package manager: this process's, with the machine's trust,
    index and proxy settings put back, and `extra`."""
    settings = {name: value for name, value in _MACHINE_ENV.items() if _SETTINGS.fullmatch(name)}
    return {**os.environ, **settings, **extra}


def debian_archive(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive this machine's apt uses (the first `.../debian` of its sources,
    one-line or deb822), for debootstrap; Debian's redirector where apt names none."""
    sources = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]
    for path in sources:
        if path.suffix not in (".list", ".sources") or not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            match = _DEBIAN_URI.search(line.strip())
            if match:
                return match.group(1)
    return DEBIAN_ARCHIVE


def apt_proxy() -> dict[str, str]:
    """apt's own HTTP proxy setting (`Acquire::http::Proxy`) as the variable debootstrap
    reads, if apt has one and the machine's environment names none."""
    if any(_MACHINE_ENV.get(name) for name in ("http_proxy", "HTTP_PROXY")):
        return {}
    try:
        shown = subprocess.run(
            ["apt-config", "shell", "PROXY", "Acquire::http::Proxy"],
            capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
    except FileNotFoundError:
        return {}
    match = re.fullmatch(r"PROXY='(.+)'\s*", shown)
    return {"http_proxy": match.group(1)} if match else {}
