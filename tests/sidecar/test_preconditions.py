"""Preconditions (If-Match, If-Unmodified-Since) answered from the buffer, and the S3
clients that send them: boto3's `download_file` and the AWS CLI, against the test origin
as an S3-compatible endpoint (path-style, bucket `files`), never a real S3."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import PYTHON, OriginServer, Sidecar
from tests.sidecar.conftest import CLIENT_TIMEOUT, curl, pod_env

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
NAME = "medium.bin"  # 3 MiB: three 1 MiB parts for the S3 transfer manager
MIB = 2**20


def status_of(sidecar: Sidecar, url: str, *headers: str) -> str:
    args = [arg for h in headers for arg in ("-H", h)]
    done = curl(sidecar, url, *args, "-o", "/dev/null", "-w", "%{http_code}")
    return done.stdout


def test_if_match_and_if_unmodified_since_are_answered_from_the_buffer(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("small.bin", case="preconditions")
    expected = (dataset / "small.bin").read_bytes()
    # A miss evaluates the precondition against the response its fill received.
    assert status_of(sidecar, url, 'If-Match: "not-it"') == "412"
    sidecar.wait_for_entries(1)
    head = curl(sidecar, url, "-I").body.decode()
    etag = next(line.split(":", 1)[1].strip() for line in head.splitlines()
                if line.lower().startswith("etag:"))  # fmt: skip
    last_modified = next(line.split(":", 1)[1].strip() for line in head.splitlines()
                         if line.lower().startswith("last-modified:"))  # fmt: skip

    ranged = curl(sidecar, url, "-H", f"If-Match: {etag}", "-r", "10-19")
    assert ranged.returncode == 0 and ranged.body == expected[10:20]
    assert status_of(sidecar, url, "If-Match: *") == "200"
    assert status_of(sidecar, url, f"If-Match: W/{etag}") == "412"  # strong comparison
    assert status_of(sidecar, url, f"If-Unmodified-Since: {last_modified}") == "200"
    assert status_of(sidecar, url, "If-Unmodified-Since: Sun, 06 Nov 1994 08:49:37 GMT") == "412"
    # If-Match decides alone: a failing If-Unmodified-Since beside a matching tag is ignored.
    both = (f"If-Match: {etag}", "If-Unmodified-Since: Sun, 06 Nov 1994 08:49:37 GMT")
    assert status_of(sidecar, url, *both) == "200"

    assert origin.gets("small.bin", case="preconditions") == 1
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits"]) == (1, 7), stats
    assert stats["pass_reasons"] == {}, stats  # nothing went upstream but the fill


def test_preconditions_on_an_object_without_a_strong_etag_go_to_the_origin(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("small.bin", novalidators=1)
    assert curl(sidecar, url).body == (dataset / "small.bin").read_bytes()
    sidecar.wait_for_entries(1)
    # The origin says 412 (it has no ETag to match); the buffer could not have known.
    assert status_of(sidecar, url, 'If-Match: "x"') == "412"
    assert origin.gets("small.bin", novalidators=1) == 2
    stats = sidecar.stats()
    assert stats["pass_reasons"] == {"origin-precondition": 1}, stats


# --- S3 clients ------------------------------------------------------------------------

BOTO3_DOWNLOAD = f"""
import sys, boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
endpoint, key, out = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=endpoint, config=Config(s3={{"addressing_style": "path"}}))
parts = TransferConfig(multipart_threshold={MIB}, multipart_chunksize={MIB}, max_concurrency=4)
s3.download_file("files", key, out, Config=parts)
"""


def s3_env(sidecar: Sidecar, tmp_path: Path) -> dict[str, str]:
    """The pod's environment, plus what any S3 user sets: keys, region, a config file
    with path-style addressing and 1 MiB parts (ranged GETs with If-Match)."""
    config = tmp_path / "aws-config"
    config.write_text(
        "[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n"
        "  multipart_threshold = 1MB\n  multipart_chunksize = 1MB\n"
    )
    return {
        **pod_env(sidecar),
        "AWS_CA_BUNDLE": str(sidecar.bundle),
        "AWS_CONFIG_FILE": str(config),
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


S3_CLIENTS = {
    "boto3 download_file": lambda endpoint, out: [
        PYTHON, "-c", BOTO3_DOWNLOAD, endpoint, NAME, out,
    ],
    "aws s3 cp": lambda endpoint, out: [
        str(BIN / "aws"), "s3", "cp", "--only-show-errors", "--endpoint-url", endpoint,
        f"s3://files/{NAME}", out,
    ],
    "aws s3api get-object": lambda endpoint, out: [
        str(BIN / "aws"), "s3api", "get-object", "--endpoint-url", endpoint,
        "--bucket", "files", "--key", NAME, out,
    ],
}  # fmt: skip


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_s3_clients_miss_once_then_hit(
    client: str, sidecar: Sidecar, origin: OriginServer, dataset: Path, tmp_path: Path
) -> None:
    endpoint = f"https://origin.test:{origin.port}"
    env = s3_env(sidecar, tmp_path)
    before = origin.gets(NAME)  # the session's origin serves every client's test
    for copy in ("first", "second"):
        out = tmp_path / copy
        done = subprocess.run(
            S3_CLIENTS[client](endpoint, str(out)),
            env=env, capture_output=True, timeout=CLIENT_TIMEOUT, cwd="/",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        assert out.read_bytes() == (dataset / NAME).read_bytes(), copy
    # The origin sent the object once (HEADs of the transfer manager aside).
    assert origin.gets(NAME) - before == 1
    stats = sidecar.stats()
    assert stats["misses"] == 1, stats
    assert stats["hits"] >= 1, stats
    assert set(stats["pass_reasons"]) <= {"method"}, stats  # HEAD requests only
