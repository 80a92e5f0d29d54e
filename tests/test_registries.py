"""The package managers' settings the client-installing tests use (tests/registries.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import registries


def test_package_managers_get_the_machines_trust_that_tests_remove(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = {
        "NODE_EXTRA_CA_CERTS": "/etc/ssl/inspecting-proxy.pem",
        "PIP_INDEX_URL": "https://pypi.example.test/simple",
        "npm_config_registry": "https://npm.example.test/",
        "HTTPS_PROXY": "http://proxy.example.test:3128",
        "AWS_SECRET_ACCESS_KEY": "not a package manager's",
    }
    monkeypatch.setattr(registries, "_MACHINE_ENV", machine)
    assert "NODE_EXTRA_CA_CERTS" not in os.environ  # removed for every test (conftest.py)
    env = registries.package_manager_env(HOME="/tmp/home")
    assert {name: env.get(name) for name in machine} == {
        **machine,
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY"),
    }
    assert env["HOME"] == "/tmp/home" and env["PATH"] == os.environ["PATH"]


@pytest.mark.parametrize(
    ("name", "text", "archive"),
    [
        (
            "debian.sources",
            "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n"
            "URIs: http://mirror.example.test/debian\nSuites: bookworm\n\n"
            "Types: deb\nURIs: http://mirror.example.test/debian-security\n",
            "http://mirror.example.test/debian",
        ),
        (
            "mirror.list",
            "# deb http://old.example.test/debian bookworm main\n"
            "deb http://mirror.example.test/debian-security bookworm-security main\n"
            "deb [signed-by=/usr/share/keyrings/k.gpg] https://mirror.example.test/debian/ "
            "bookworm main\n",
            "https://mirror.example.test/debian",
        ),
        ("other.list", "deb http://apt.example.test/repo stable main\n", registries.DEBIAN_ARCHIVE),
    ],
)
def test_debootstrap_uses_the_archive_apt_uses(
    tmp_path: Path, name: str, text: str, archive: str
) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / name).write_text(text)
    assert registries.debian_archive(tmp_path) == archive


def test_without_sources_debootstrap_uses_debians_redirector(tmp_path: Path) -> None:
    assert registries.debian_archive(tmp_path) == registries.DEBIAN_ARCHIVE
