"""Fixtures shared by every test: a clean environment and a session-wide test CA.

This machine (and many developers' shells) set CA and proxy variables; a test of
trust or proxying that inherits them proves nothing. So every test runs with them
removed, and every client process a test starts gets `client_env()`, built from
nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import trustme

# Variables that change which CAs a client trusts or which proxy it uses.
CA_AND_PROXY_VARIABLES = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CONFIG_FILE",
    "http_proxy",
    "https_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
)


def client_env(**extra: str) -> dict[str, str]:
    """A minimal environment for a client process: PATH and a locale, plus `extra`.

    `PIP_CONFIG_FILE=/dev/null` keeps pip from reading this machine's /etc/pip.conf,
    which names a CA of its own.
    """
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": "/nonexistent",
        "PIP_CONFIG_FILE": "/dev/null",
    }
    env.update(extra)
    return env


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in CA_AND_PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture(scope="session")
def origin_ca() -> trustme.CA:
    """The CA that signs every test origin's certificate (trusted via --upstream-ca)."""
    return trustme.CA()
