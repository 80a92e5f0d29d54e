"""Stage-in: expansion rules, and prefetching into a real sidecar's buffer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bench.harness import OriginServer, Sidecar, wait_until
from sidecar.buffer.stagein import StageInError, expand, parse_manifest
from sidecar.settings import SettingsError, parse, parse_stage_in
from tests.sidecar.conftest import curl


def test_brace_ranges_and_alternatives_expand_like_a_shell() -> None:
    assert expand("https://h/shard-{000..002}.tar") == [
        "https://h/shard-000.tar",
        "https://h/shard-001.tar",
        "https://h/shard-002.tar",
    ]
    assert expand("https://h/{train,val}-{1..2}.bin") == [
        "https://h/train-1.bin",
        "https://h/train-2.bin",
        "https://h/val-1.bin",
        "https://h/val-2.bin",
    ]
    assert expand("https://h/{3..1}") == ["https://h/3", "https://h/2", "https://h/1"]
    assert expand("https://h/plain") == ["https://h/plain"]
    with pytest.raises(StageInError, match="too many"):
        expand("https://h/{0..9999999}")


def test_manifests_ignore_blank_lines_and_comments() -> None:
    text = "# dataset\nhttps://h/a\n\n  https://h/b  # second\n"
    assert parse_manifest(text) == ["https://h/a", "https://h/b"]


def test_stage_in_specs_split_on_spaces_and_commas_outside_braces() -> None:
    specs = parse_stage_in("https://h/{a,b}.bin, @https://h/list.txt\nhttps://h/c")
    assert specs == ("https://h/{a,b}.bin", "@https://h/list.txt", "https://h/c")
    for bad in ("ftp://h/x", "https://h/{a", "h/x"):
        with pytest.raises(ValueError, match="stage-in"):
            parse_stage_in(bad)
    with pytest.raises(SettingsError, match="--stage-in-parallel"):
        parse(["--buffer-dir", "/b", "--stage-in-parallel", "0"], {})


@pytest.mark.e2e
def test_staged_objects_are_hits_from_the_first_request(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    manifest = dataset / "stage-manifest.txt"
    manifest.write_text(f"# staged\n{origin.url('big.bin', case='staged')}\n")
    brace = origin.url("{small,medium}.bin", case="staged")
    sidecar = start_sidecar(
        "--stage-in", f"{brace} @{origin.url('stage-manifest.txt')}", "--stage-in-parallel", "2"
    )
    wait_until(lambda: sidecar.stats()["stage_in_done"] == 3, "stage-in to finish")
    for name in ("small.bin", "medium.bin", "big.bin"):
        assert curl(sidecar, origin.url(name, case="staged")).body == (dataset / name).read_bytes()
        assert origin.full_fetches(name, case="staged") == 1
    stats = sidecar.stats()
    assert stats["hits"] == 3 and stats["misses"] == 0
    assert stats["stage_in_bytes"] == sum(
        (dataset / n).stat().st_size for n in ("small.bin", "medium.bin", "big.bin")
    )
    assert "stage-in done: 3/3 objects" in sidecar.log()


@pytest.mark.e2e
def test_a_chunked_object_is_staged_too(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("medium.bin", chunked=1)
    sidecar = start_sidecar("--stage-in", url)
    wait_until(lambda: sidecar.stats()["stage_in_done"] == 1, "stage-in to finish")
    assert curl(sidecar, url).body == (dataset / "medium.bin").read_bytes()
    assert origin.count("medium.bin", chunked=1) == 1
    assert sidecar.stats()["hits"] == 1


@pytest.mark.e2e
def test_a_client_joins_an_object_being_staged(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("big.bin", case="stage-join", rate=8_000_000)
    sidecar = start_sidecar("--stage-in", url)
    wait_until(lambda: sidecar.stats()["fills_in_progress"] == 1, "the staged fill to start")
    assert curl(sidecar, url).body == (dataset / "big.bin").read_bytes()
    assert origin.full_fetches("big.bin", case="stage-join", rate=8_000_000) == 1
    assert sidecar.stats()["coalesced"] + sidecar.stats()["hits"] == 1
