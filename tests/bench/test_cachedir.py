"""The cache folder the tests and benchmarks keep their downloads and builds in."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cachedir import cache_dir


@pytest.mark.parametrize("xdg", [None, "", "relative/cache"])
def test_on_a_new_machine_the_folder_is_made_under_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, xdg: str | None
) -> None:
    # A new machine's HOME has no .cache; an empty or relative XDG_CACHE_HOME is ignored
    # (the XDG base directory specification), never a folder in the working directory.
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    folder = cache_dir("node-22")
    assert folder == home / ".cache" / "burstbuffer" / "node-22" and folder.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_an_absolute_xdg_cache_home_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "burstbuffer" and cache_dir().is_dir()
    assert cache_dir("stored", "packed-rows").is_dir()  # nested, with its parents
