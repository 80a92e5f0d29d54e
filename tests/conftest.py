"""Fixtures shared by every test: a clean environment and a session-wide test CA.

This machine (and many developers' shells) set CA and proxy variables; a test of
trust or proxying that inherits them proves nothing. So every test runs with them
removed, and every client process a test starts gets `client_env()`, built from
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trustme
from hypothesis import settings

# A clean environment for client processes: see bench.harness.clean_env.
from bench.harness import clean_env as client_env  # noqa: F401

# `--hypothesis-profile=deep`: a long run of the property tests that take their number of
# examples from the profile (the parser's differential fuzzer,
# tests/sidecar/test_parser_differential.py, runs a few thousand without it); meant for
# that file, since every test that sets no number of its own takes it too.
settings.register_profile("deep", max_examples=50_000)

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


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in CA_AND_PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture(scope="session")
def origin_ca() -> trustme.CA:
    """The CA that signs every test origin's certificate (trusted via --upstream-ca)."""
    return trustme.CA()
