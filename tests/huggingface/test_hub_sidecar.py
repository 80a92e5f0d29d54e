"""The real Hugging Face clients through the real sidecar (`proxy-env` capture), against
the Hub of `bench.hub`: every download has the right bytes; a repeat in the same pod
(a new worker: the client's own cache empty) is all hits, not one request reaching the
CDN, while the Hub's API, token and reconstruction calls reach the Hub each time; a file
that shares xorbs with one already downloaded costs only its own; a repeat after every
URL and token expired still works and is still all hits; so is one from a restarted
sidecar on the same buffer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bench.harness import HubServer, Sidecar
from tests.huggingface.conftest import (
    DATASET,
    MODEL,
    SHORT_EXPIRY,
    Clients,
    Counter,
    Seen,
    digests,
    through,
    train_rows_digest,
    wait_past,
    xorb_ranges,
)

pytestmark = [pytest.mark.e2e, pytest.mark.root]

WEIGHTS = "model.safetensors"
CDN_KINDS = ("xorb", "bridge", "lfs")  # what the CDNs serve


def cdn_requests(seen: Seen) -> dict[str, int]:
    return {kind: seen[kind] for kind in CDN_KINDS if seen[kind]}


def check(run_files: dict[str, str], repos: Path, repo: str, repo_type: str = "model") -> None:
    expected = digests(repos, repo, repo_type)
    assert run_files == {name: expected[name] for name in run_files}
    assert run_files


@pytest.fixture
def pod(
    start_sidecar: Callable[..., Sidecar], hub: HubServer, tmp_path: Path
) -> tuple[Sidecar, Clients]:
    sidecar = start_sidecar(hub)
    return sidecar, through(sidecar, hub, tmp_path)


def test_xet_download_twice_is_all_hits(pod: tuple[Sidecar, Clients], repos: Path) -> None:
    sidecar, clients = pod
    with Counter(clients.hub) as first:
        run = clients.download(MODEL, [WEIGHTS, "vocab.txt"])
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert first.value["xorb"] > 0
    assert first.value.status("xorb", 403) == 0, "a request the CDN must refuse was sent"

    with Counter(clients.hub) as second:
        run = clients.download(MODEL, [WEIGHTS, "vocab.txt"])
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert cdn_requests(second.value) == {}, second.value.xorbs
    # What expires passes: a token, then each file's reconstruction, from the Hub itself.
    assert second.value["token"] >= 1
    assert second.value.status("reconstruction", 200) == 2


def test_lfs_download_twice_is_all_hits(pod: tuple[Sidecar, Clients], repos: Path) -> None:
    """Without Xet (`HF_HUB_DISABLE_XET=1`): whole files from signed redirect URLs, a
    Xet file's from the bridge and a plain LFS file's from the LFS CDN."""
    _, clients = pod
    names = ["config.json", WEIGHTS, "tokenizer.bin"]
    with Counter(clients.hub) as first:
        run = clients.download(MODEL, names, xet=False)
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert cdn_requests(first.value) == {"bridge": 1, "lfs": 1}

    with Counter(clients.hub) as second:
        run = clients.download(MODEL, names, xet=False)
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert cdn_requests(second.value) == {}


@pytest.mark.parametrize(
    ("repo_type", "client_env"),
    [("model", {}), ("dataset", {}), ("model", {"HF_XET_HIGH_PERFORMANCE": "1"})],
    ids=["model", "dataset", "model-high-performance"],
)
def test_snapshot_twice_is_all_hits(
    pod: tuple[Sidecar, Clients], repos: Path, repo_type: str, client_env: dict[str, str]
) -> None:
    """`HF_XET_HIGH_PERFORMANCE` (what `HF_HUB_ENABLE_HF_TRANSFER` became): more ranges
    at once, the same ones."""
    _, clients = pod
    repo = MODEL if repo_type == "model" else DATASET
    with Counter(clients.hub) as first:
        run = clients.download(repo, repo_type=repo_type, **client_env)
    assert run.returncode == 0, run.stderr
    assert run.files == digests(repos, repo, repo_type)
    assert first.value.status("xorb", 403) == 0, "a request the CDN must refuse was sent"

    with Counter(clients.hub) as second:
        run = clients.download(repo, repo_type=repo_type, **client_env)
    assert run.returncode == 0, run.stderr
    assert run.files == digests(repos, repo, repo_type)
    assert cdn_requests(second.value) == {}, second.value.xorbs
    # The revision and its tree (revisions move) and what expires reach the Hub again.
    assert second.value["api"] == first.value["api"] >= 2
    assert second.value["token"] >= 1
    assert second.value["reconstruction"] == first.value["reconstruction"] >= 1


def test_shared_xorbs_cost_only_new_ones(
    pod: tuple[Sidecar, Clients], hub: HubServer, repos: Path
) -> None:
    """v2's weights share three whole xorbs with v1's: once v1 is downloaded, v2 costs
    the CDN its other xorbs only."""
    _, clients = pod
    v1, v2 = xorb_ranges(hub, MODEL, WEIGHTS), xorb_ranges(hub, MODEL, "model-v2.safetensors")
    assert len(v1 & v2) == 3
    with Counter(clients.hub) as first:
        run = clients.download(MODEL, [WEIGHTS])
    assert run.returncode == 0, run.stderr
    assert set(first.value.xorbs) == v1

    with Counter(clients.hub) as second:
        run = clients.download(MODEL, ["model-v2.safetensors"])
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert set(second.value.xorbs) == v2 - v1
    assert all(count == 1 for count in second.value.xorbs.values()), second.value.xorbs


def test_xet_repeat_after_expiry_is_all_hits(
    start_sidecar: Callable[..., Sidecar], short_hub: HubServer, repos: Path, tmp_path: Path
) -> None:
    """Once every token and URL the first download got has expired, the same download
    works (a replayed token or reconstruction would now be refused) and is all hits."""
    clients = through(start_sidecar(short_hub), short_hub, tmp_path)
    run = clients.download(MODEL, [WEIGHTS, "vocab.txt"])
    assert run.returncode == 0, run.stderr
    wait_past(SHORT_EXPIRY + 1)

    with Counter(short_hub) as again:
        run = clients.download(MODEL, [WEIGHTS, "vocab.txt"])
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert again.value.status("reconstruction", 200) == 2
    assert again.value.status("reconstruction", 401) == 0, "an expired token was replayed"
    assert cdn_requests(again.value) == {}, again.value.statuses


def test_lfs_repeat_after_expiry_is_all_hits(
    start_sidecar: Callable[..., Sidecar], short_hub: HubServer, repos: Path, tmp_path: Path
) -> None:
    clients = through(start_sidecar(short_hub), short_hub, tmp_path)
    names = [WEIGHTS, "tokenizer.bin"]
    run = clients.download(MODEL, names, xet=False)
    assert run.returncode == 0, run.stderr
    wait_past(SHORT_EXPIRY + 1)

    with Counter(short_hub) as again:
        run = clients.download(MODEL, names, xet=False)
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert cdn_requests(again.value) == {}, again.value.statuses


def test_restarted_sidecar_serves_hits(
    start_sidecar: Callable[..., Sidecar], hub: HubServer, repos: Path, tmp_path: Path
) -> None:
    """A restarted sidecar (same buffer directory) answers the repeat from its buffer."""
    sidecar = start_sidecar(hub)
    run = through(sidecar, hub, tmp_path / "before").download(MODEL)
    assert run.returncode == 0, run.stderr
    sidecar.stop()

    restarted = start_sidecar(hub, directory=sidecar.directory)
    with Counter(hub) as again:
        run = through(restarted, hub, tmp_path / "after").download(MODEL)
    assert run.returncode == 0, run.stderr
    assert run.files == digests(repos, MODEL)
    assert cdn_requests(again.value) == {}, again.value.xorbs
    assert again.value["reconstruction"] >= 1


def test_single_ranges_of_a_multirange_url_twice(
    start_sidecar: Callable[..., Sidecar], multirange_hub: HubServer, repos: Path, tmp_path: Path
) -> None:
    """A URL signed for two ranges of one xorb (the real Hub's v2 has "typically one
    entry per xorb"), asked for each range alone (`hf_xet`'s default): the file is right,
    no request the CDN must refuse is sent, and the repeat, the same ranged requests
    signed again, is all hits."""
    clients = through(start_sidecar(multirange_hub), multirange_hub, tmp_path)
    name = "peft/adapter.safetensors"
    with Counter(multirange_hub) as first:
        run = clients.download(MODEL, [name])
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert first.value.status("xorb", 403) == 0, "a request the CDN must refuse was sent"

    with Counter(multirange_hub) as second:
        run = clients.download(MODEL, [name])
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert cdn_requests(second.value) == {}, second.value.xorbs


def test_multirange_requests_twice(
    start_sidecar: Callable[..., Sidecar], multirange_hub: HubServer, repos: Path, tmp_path: Path
) -> None:
    """`HF_XET_CLIENT_ENABLE_MULTIRANGE_FETCHING`: both ranges in one request, answered
    multipart/byteranges. Through the sidecar it is answered or passed, correctly: the
    file is right, nothing the CDN must refuse is sent, and only the multi-range request
    may reach the CDN again."""
    clients = through(start_sidecar(multirange_hub), multirange_hub, tmp_path)
    env = {"HF_XET_CLIENT_ENABLE_MULTIRANGE_FETCHING": "true"}
    name = "peft/adapter.safetensors"
    for _ in range(2):
        multiranges = multirange_hub.requests()["multiranges"]
        with Counter(multirange_hub) as seen:
            run = clients.download(MODEL, [name], **env)
        assert run.returncode == 0, run.stderr
        check(run.files, repos, MODEL)
        assert seen.value.status("xorb", 403) == 0, "a request the CDN must refuse was sent"
    assert multirange_hub.requests()["multiranges"] - multiranges == seen.value["xorb"] <= 1


def test_a_refused_xorb_request_is_refreshed_through_the_sidecar(
    pod: tuple[Sidecar, Clients], hub: HubServer, repos: Path
) -> None:
    """A 403 from the CDN mid-download (an expired URL): the client's second ask for the
    reconstruction reaches the CAS and gets new URLs, the refusal is not stored, and the
    repeat is all hits."""
    _, clients = pod
    hub.refuse_xorbs(1)
    try:
        with Counter(hub) as first:
            run = clients.download(MODEL, [WEIGHTS])
    finally:
        hub.refuse_xorbs(0)
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert first.value.status("xorb", 403) == 1
    assert first.value.status("reconstruction", 200) == 2

    with Counter(hub) as second:
        run = clients.download(MODEL, [WEIGHTS])
    assert run.returncode == 0, run.stderr
    check(run.files, repos, MODEL)
    assert cdn_requests(second.value) == {}, second.value.statuses


def test_hf_file_system_twice_is_all_hits(pod: tuple[Sidecar, Clients], repos: Path) -> None:
    """HfFileSystem's ranged reads of Parquet files (how `datasets` reads the Hub), twice:
    the right bytes, and the repeat reaches no CDN."""
    _, clients = pod
    expected = digests(repos, DATASET, "dataset")
    parquet = {k: v for k, v in expected.items() if k.endswith(".parquet")}
    run = clients.download(DATASET, repo_type="dataset", fs=True)
    assert run.returncode == 0, run.stderr
    assert run.files == parquet

    with Counter(clients.hub) as second:
        run = clients.download(DATASET, repo_type="dataset", fs=True)
    assert run.returncode == 0, run.stderr
    assert run.files == parquet
    assert cdn_requests(second.value) == {}, second.value.statuses


def test_load_dataset_twice_is_all_hits(pod: tuple[Sidecar, Clients], repos: Path) -> None:
    """`datasets.load_dataset` of a Hub dataset's Parquet files, by two new workers: both
    read the rows of the files, and the second reaches no CDN."""
    _, clients = pod
    expected = {"train": train_rows_digest(repos, DATASET)}
    with Counter(clients.hub) as first:
        run = clients.download(DATASET, repo_type="dataset", load=True)
    assert run.returncode == 0, run.stderr
    assert run.files == expected
    assert cdn_requests(first.value), first.value.statuses
    with Counter(clients.hub) as second:
        run = clients.download(DATASET, repo_type="dataset", load=True)
    assert run.returncode == 0, run.stderr
    assert run.files == expected
    assert cdn_requests(second.value) == {}, second.value.statuses
