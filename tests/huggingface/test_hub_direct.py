"""The real Hugging Face clients against the Hub of `bench.hub`, without the sidecar: the
test Hub is one the clients accept, and its CDN refuses what the real one refuses."""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path

import pytest

from bench import xet
from bench.harness import HubServer
from tests.huggingface.conftest import (
    DATASET,
    MODEL,
    SHORT_EXPIRY,
    Clients,
    Counter,
    cas_get,
    digests,
    direct_clients,
    first_fetch,
    get,
    read_token,
    reconstruction,
    resolve_headers,
    wait_past,
    xorb_ranges,
)

pytestmark = [pytest.mark.e2e, pytest.mark.root]

XET_FILES = ["model.safetensors", "model-v2.safetensors", "vocab.txt"]


def test_hf_hub_download_with_xet(direct: Clients, repos: Path) -> None:
    """Xet files come from the CAS and the CDN's xorbs, never from the bridge."""
    names = ["config.json", *XET_FILES, "tokenizer.bin"]
    with Counter(direct.hub) as seen:
        run = direct.download(MODEL, names)
    assert run.returncode == 0, run.stderr
    expected = digests(repos, MODEL)
    assert run.files == {name: expected[name] for name in names}
    assert seen.value["reconstruction"] == len(XET_FILES)
    assert seen.value.status("xorb", 206) == seen.value["xorb"] > 0
    assert seen.value["bridge"] == 0
    assert seen.value.status("lfs", 200) == 1  # tokenizer.bin: plain LFS


def test_hf_hub_download_without_xet(direct: Clients, repos: Path) -> None:
    """`HF_HUB_DISABLE_XET=1`: the same files, whole, from the redirects' signed URLs."""
    names = ["config.json", *XET_FILES, "tokenizer.bin"]
    with Counter(direct.hub) as seen:
        run = direct.download(MODEL, names, xet=False)
    assert run.returncode == 0, run.stderr
    expected = digests(repos, MODEL)
    assert run.files == {name: expected[name] for name in names}
    assert seen.value["xorb"] == seen.value["reconstruction"] == seen.value["token"] == 0
    assert seen.value.status("bridge", 200) == len(XET_FILES)
    assert seen.value.status("lfs", 200) == 1


@pytest.mark.parametrize("repo_type", ["model", "dataset"])
def test_snapshot_download(direct: Clients, repos: Path, repo_type: str) -> None:
    repo = MODEL if repo_type == "model" else DATASET
    with Counter(direct.hub) as seen:
        run = direct.download(repo, repo_type=repo_type)
    assert run.returncode == 0, run.stderr
    assert run.files == digests(repos, repo, repo_type)
    assert seen.value["api"] >= 2  # the revision, then its tree
    assert seen.value.status("xorb", 403) == 0


def test_shared_xorbs(direct: Clients, hub: HubServer) -> None:
    """v2's weights name three of v1's xorbs, whole (what the sidecar tests rely on)."""
    v1 = xorb_ranges(hub, MODEL, "model.safetensors")
    v2 = xorb_ranges(hub, MODEL, "model-v2.safetensors")
    assert len(v1 & v2) == 3
    assert len(v2 - v1) >= 1


def test_v1_reconstructions(direct: Clients, repos: Path) -> None:
    """A client told to use the v1 reconstruction API gets the same files."""
    with Counter(direct.hub) as seen:
        run = direct.download(
            MODEL, ["model.safetensors"], HF_XET_CLIENT_RECONSTRUCTION_API_VERSION="1"
        )
    assert run.returncode == 0, run.stderr
    assert run.files["model.safetensors"] == digests(repos, MODEL)["model.safetensors"]
    assert seen.value.status("reconstruction", 200) == 1


# -- the CDN and the CAS refuse what the real ones refuse -------------------------------


def test_cdn_serves_the_signed_range_only(hub: HubServer, repos: Path) -> None:
    fetch = first_fetch(hub, MODEL, "model.safetensors")
    url, signed = fetch["url"], fetch["signed"]
    status, body, headers = get(hub, url, Range=signed)
    assert status == 206
    assert headers["Content-Range"].startswith(signed.replace("=", " ") + "/")
    # Whole chunks in the Xet format: here uncompressed, the file's first bytes.
    data = (repos / "models" / MODEL / "model.safetensors").read_bytes()
    assert body[:8] == bytes([0]) + (xet.CHUNK_SIZE).to_bytes(3, "little") + bytes(
        [xet.SCHEME_NONE]
    ) + (xet.CHUNK_SIZE).to_bytes(3, "little")
    assert body[8 : 8 + xet.CHUNK_SIZE] == data[: xet.CHUNK_SIZE]
    first, last = map(int, signed.removeprefix("bytes=").split("-"))
    assert get(hub, url)[0] == 403  # unranged
    assert get(hub, url, Range=f"bytes={first}-{last - 1}")[0] == 403  # a sub-range
    assert get(hub, url, Range=f"bytes={first}-")[0] == 403
    assert get(hub, url, Range=f"{signed},{last + 1}-{last + 2}")[0] == 403
    assert get(hub, url, method="HEAD")[0] == 403
    forged = url.replace(
        urllib.parse.quote(signed, safe=""),
        urllib.parse.quote(f"bytes={first}-{last - 1}", safe=""),
    )
    assert forged != url
    assert get(hub, forged, Range=f"bytes={first}-{last - 1}")[0] == 403  # signature
    unsigned = url.split("?")[0] + "?" + urllib.parse.urlencode({"X-Xet-Signed-Range": signed})
    assert get(hub, unsigned, Range=signed)[0] == 403


def test_cdn_refuses_an_expired_url(short_hub: HubServer) -> None:
    fetch = first_fetch(short_hub, MODEL, "model.safetensors")
    assert get(short_hub, fetch["url"], Range=fetch["signed"])[0] == 206
    expires = int(
        dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(fetch["url"]).query))["Expires"]
    )
    wait_past(expires + 1 - time.time())
    status, body, _ = get(short_hub, fetch["url"], Range=fetch["signed"])
    assert status == 403
    assert b"expired" in body


def test_cas_needs_an_unexpired_token(short_hub: HubServer) -> None:
    file_hash = resolve_headers(short_hub, MODEL, "model.safetensors")["X-Xet-Hash"]
    path = f"/v2/reconstructions/{file_hash}"
    assert cas_get(short_hub, path, None)[0] == 401
    assert cas_get(short_hub, path, "xet_1_forged")[0] == 401
    token = read_token(short_hub, MODEL)
    assert token["exp"] <= time.time() + SHORT_EXPIRY + 1
    assert cas_get(short_hub, path, token["accessToken"])[0] == 200
    wait_past(token["exp"] + 1 - time.time())
    assert cas_get(short_hub, path, token["accessToken"])[0] == 401


def test_cas_answers_a_range_of_the_file(hub: HubServer) -> None:
    """The terms of bytes 100,000 to 200,000 (mid-chunk both): whole chunks 1 to 3, the
    offset into the first, one fetch of exactly those chunks' bytes."""
    file_hash = resolve_headers(hub, MODEL, "model.safetensors")["X-Xet-Hash"]
    token = read_token(hub, MODEL)["accessToken"]
    status, body = cas_get(
        hub, f"/v1/reconstructions/{file_hash}", token, Range="bytes=100000-199999"
    )
    assert status == 200
    answer = json.loads(body)
    assert answer["offset_into_first_range"] == 100_000 - xet.CHUNK_SIZE
    [term] = answer["terms"]
    assert term["range"] == {"start": 1, "end": 4}
    [fetch] = answer["fetch_info"][term["hash"]]
    step = xet.CHUNK_SIZE + xet.HEADER_LENGTH
    assert fetch["url_range"] == {"start": step, "end": 4 * step - 1}
    too_far = cas_get(hub, f"/v1/reconstructions/{file_hash}", token, Range="bytes=99999999-")
    assert too_far[0] == 416


# -- a xorb named twice by one file: multi-range URLs ---------------------------------

MULTIRANGE = "HF_XET_CLIENT_ENABLE_MULTIRANGE_FETCHING"


def test_adapter_names_two_ranges_of_one_xorb(hub: HubServer) -> None:
    answer = reconstruction(hub, MODEL, "peft/adapter.safetensors")
    weights = reconstruction(hub, MODEL, "model.safetensors")
    first_xorb = weights["terms"][0]["hash"]
    assert [t["range"] for t in answer["terms"] if t["hash"] == first_xorb] == [
        {"start": 0, "end": 2},
        {"start": 5, "end": 7},
    ]
    assert len(answer["xorbs"][first_xorb]) == 2  # a URL for each range


@pytest.mark.parametrize("multirange", [False, True], ids=["single-ranges", "multi-range"])
def test_multirange_urls(
    multirange_hub: HubServer, hub_hosts: Path, tmp_path: Path, repos: Path, multirange: bool
) -> None:
    """One URL signed for both ranges: `hf_xet` asks for both at once when told to
    (multipart/byteranges), else for each alone; both get the file."""
    clients = direct_clients(multirange_hub, hub_hosts, tmp_path)
    before = multirange_hub.requests()["multiranges"]
    env = {MULTIRANGE: "true"} if multirange else {}
    run = clients.download(MODEL, ["peft/adapter.safetensors"], **env)
    assert run.returncode == 0, run.stderr
    assert (
        run.files["peft/adapter.safetensors"] == digests(repos, MODEL)["peft/adapter.safetensors"]
    )
    assert multirange_hub.requests()["multiranges"] - before == int(multirange)


def test_cdn_multirange_url_answers_its_ranges_only(multirange_hub: HubServer) -> None:
    answer = reconstruction(multirange_hub, MODEL, "peft/adapter.safetensors")
    first_xorb = answer["terms"][0]["hash"]
    [fetch] = answer["xorbs"][first_xorb]
    spans = [(r["bytes"]["start"], r["bytes"]["end"]) for r in fetch["ranges"]]
    signed = "bytes=" + ",".join(f"{a}-{b}" for a, b in spans)
    status, body, headers = get(multirange_hub, fetch["url"], Range=signed)
    assert status == 206
    assert headers["Content-Type"].startswith("multipart/byteranges; boundary=")
    assert body.count(b"Content-Range: bytes ") == 2
    (a, b), (c, d) = spans
    assert get(multirange_hub, fetch["url"], Range=f"bytes={c}-{d}")[0] == 206
    assert get(multirange_hub, fetch["url"], Range=f"bytes={a}-{d}")[0] == 403
    assert get(multirange_hub, fetch["url"], Range=f"bytes={c}-{d},{a}-{b}")[0] == 403
    assert get(multirange_hub, fetch["url"])[0] == 403


def test_a_refused_xorb_request_refreshes_the_reconstruction(direct: Clients, repos: Path) -> None:
    """What `hf_xet` does with a 403 from the CDN (an expired URL): it asks the CAS for
    the reconstruction again, and fetches with the new URLs."""
    direct.hub.refuse_xorbs(1)
    try:
        with Counter(direct.hub) as seen:
            run = direct.download(MODEL, ["model.safetensors"])
    finally:
        direct.hub.refuse_xorbs(0)
    assert run.returncode == 0, run.stderr
    assert run.files["model.safetensors"] == digests(repos, MODEL)["model.safetensors"]
    assert seen.value.status("xorb", 403) == 1
    assert seen.value.status("reconstruction", 200) == 2


def test_compressible_chunks_are_lz4(hub: HubServer) -> None:
    """vocab.txt's chunks go out LZ4-compressed (and the client got its bytes right,
    above): the chunk headers of its first fetch say scheme 1, smaller than the chunk."""
    fetch = first_fetch(hub, MODEL, "vocab.txt")
    status, body, _ = get(hub, fetch["url"], Range=fetch["signed"])
    assert status == 206
    schemes, position = [], 0
    while position < len(body):
        header = body[position : position + xet.HEADER_LENGTH]
        compressed = int.from_bytes(header[1:4], "little")
        schemes.append((header[4], compressed < int.from_bytes(header[5:8], "little")))
        position += xet.HEADER_LENGTH + compressed
    assert position == len(body)
    assert schemes and all(s == (xet.SCHEME_LZ4, True) for s in schemes)


def test_hf_file_system_reads_parquet(direct: Clients, repos: Path) -> None:
    """HfFileSystem (how `datasets.load_dataset` reads a Hub dataset): the tree API, then
    ranged reads of each Parquet file through its resolve redirect."""
    with Counter(direct.hub) as seen:
        run = direct.download(DATASET, repo_type="dataset", fs=True)
    assert run.returncode == 0, run.stderr
    expected = digests(repos, DATASET, "dataset")
    assert run.files == {k: v for k, v in expected.items() if k.endswith(".parquet")}
    assert seen.value.status("bridge", 206) >= 2  # ranged reads of the Xet-backed files
