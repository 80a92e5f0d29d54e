"""The core's table of answers (`sidecar/core/src/buffer/answers.rs`) on a real sidecar.

Python decides a hit and records its answer; the same request later, on any
connection and in any worker, is answered by the core from the table, with the same
head (but for the Age of the moment) and the same bytes. Whatever the table cannot
decide goes to Python as before: ranges, conditionals, Cache-Control, a URL whose
object was removed since, a request that waits behind another on its connection.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.harness import OriginServer, Sidecar, clean_env, wait_until
from sidecar.buffer.keeper import TOUCH_INTERVAL
from sidecar.cache import policy
from sidecar.proxy.router import Representation, answer
from sidecar.wire.exchange import Request
from sidecar.wire.fields import Fields
from tests.sidecar.conftest import FILES, SIGNING_HOST, curl
from tests.sidecar.test_strict import BOUND, Client, RawOrigin

pytestmark = pytest.mark.e2e

SMALL = "small.bin"


def by_core(sidecar: Sidecar) -> int:
    return sidecar.stats()["hits_answered_by_core"]


def answered_by_core(sidecar: Sidecar, url: str) -> None:
    """Two downloads of `url` from a sidecar that stored nothing else: a miss, whose
    commit records the answer, and once it is stored the same GET answered by the core
    from its table."""
    assert curl(sidecar, url).returncode == 0
    sidecar.wait_for_entries(1)  # its commit may follow its last byte
    assert curl(sidecar, url).returncode == 0
    assert by_core(sidecar) == 1


def last_head(printed: str) -> str:
    """The origin's response head of those curl printed with `-D -` (the proxy's answer
    to its CONNECT comes first)."""
    return [head for head in printed.split("\r\n\r\n") if head][-1]


def head_of(printed: str) -> dict[str, str]:
    """The fields of that head (names in lower case)."""
    fields = {}
    for line in last_head(printed).splitlines()[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return fields


@pytest.fixture
def two_workers(start_sidecar: Callable[..., Sidecar]) -> Sidecar:
    return start_sidecar("--workers", "2")


def test_a_miss_recorded_at_its_commit_is_answered_by_the_core_in_every_worker_with_the_same_head(
    two_workers: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url(SMALL)
    expected = (dataset / SMALL).read_bytes()
    first = curl(two_workers, url)  # the miss, recorded once it is stored
    assert first.returncode == 0 and first.body == expected
    two_workers.wait_for_entries(1)
    # The router's answer to a request the table leaves to it: the same 200.
    python = curl(two_workers, url, "-D", "-", "-H", "Cache-Control: only-if-cached")
    assert python.returncode == 0 and python.body == expected
    assert by_core(two_workers) == 0
    # Each curl is a new connection: the workers take turns, and all answer it.
    recorded = [curl(two_workers, url, "-D", "-") for _ in range(8)]
    assert all(d.returncode == 0 and d.body == expected for d in recorded)
    stats = two_workers.stats()
    assert (stats["misses"], stats["hits"], stats["hits_answered_by_core"]) == (1, 9, 8)
    assert stats["bytes_from_buffer"] == 9 * FILES[SMALL]
    # The same fields in the same order as the router's answer; the Age as old or older.
    ours = [
        re.sub(r"^age: \d+", "age: N", line.lower())
        for line in last_head(python.stdout).splitlines()
    ]
    for download in recorded:
        theirs = last_head(download.stdout).splitlines()
        assert [re.sub(r"^age: \d+", "age: N", line.lower()) for line in theirs] == ours
        assert int(head_of(download.stdout)["age"]) >= int(head_of(python.stdout)["age"])


def test_a_url_signed_anew_finds_its_keys_answer_in_the_core(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    """A presigned URL carries a new signature each time it is signed; the key drops it
    (`policy.cache_key`), and so does the table's lookup, which the core makes by the
    same rule: a URL signed anew is answered by the core, with the stored bytes."""
    sidecar = start_sidecar("--intercept", f"origin.test,{SIGNING_HOST}")

    def signed(signature: str) -> str:
        query = {"versionId": "7", "X-Amz-Date": signature, "X-Amz-Signature": signature}
        return origin.url(SMALL, host=SIGNING_HOST, **query)

    expected = (dataset / SMALL).read_bytes()
    first = curl(sidecar, signed("one"))
    assert first.returncode == 0 and first.body == expected
    sidecar.wait_for_entries(1)
    for signature in ("two", "three"):
        again = curl(sidecar, signed(signature))
        assert again.returncode == 0 and again.body == expected
    assert by_core(sidecar) == 2
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits"]) == (1, 2)
    # Another version is another key: the origin's, not the table's.
    other = origin.url(SMALL, host=SIGNING_HOST, versionId="8", **{"X-Amz-Signature": "four"})
    assert curl(sidecar, other).body == expected
    assert by_core(sidecar) == 2 and sidecar.stats()["misses"] == 2


@pytest.mark.parametrize(
    ("extra", "status", "size"),
    [
        (("-H", "Range: bytes=0-9"), 206, 10),
        (("-H", "Cache-Control: only-if-cached"), 200, FILES[SMALL]),
        (("-H", "If-Modified-Since: Sat, 01 Jan 2000 00:00:00 GMT"), 200, FILES[SMALL]),
    ],
    ids=["range", "cache-control", "if-modified-since"],
)
def test_a_request_with_a_field_the_decision_reads_goes_to_the_router(
    sidecar: Sidecar,
    origin: OriginServer,
    dataset: Path,
    extra: tuple[str, ...],
    status: int,
    size: int,
) -> None:
    url = origin.url(SMALL)
    answered_by_core(sidecar, url)
    done = curl(sidecar, url, "-D", "-", *extra)
    assert done.returncode == 0
    assert last_head(done.stdout).startswith(f"HTTP/1.1 {status} ")
    assert done.body == (dataset / SMALL).read_bytes()[:size]
    assert by_core(sidecar) == 1


def test_an_etag_match_is_a_304_from_the_router(sidecar: Sidecar, origin: OriginServer) -> None:
    url = origin.url(SMALL)
    answered_by_core(sidecar, url)
    etag = head_of(curl(sidecar, url, "-D", "-").stdout)["etag"]
    assert by_core(sidecar) == 2
    done = curl(sidecar, url, "-D", "-", "-H", f"If-None-Match: {etag}")
    assert last_head(done.stdout).startswith("HTTP/1.1 304 ") and done.body == b""
    assert by_core(sidecar) == 2


def test_a_removed_object_is_fetched_again_not_answered_from_the_table(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url(SMALL)
    answered_by_core(sidecar, url)
    # A write through the proxy invalidates the URL (RFC 9111 §4.4): the object is
    # removed, and its answer with it.
    written = curl(sidecar, url, "-X", "PUT", "--data-binary", f"@{dataset / SMALL}")
    assert written.returncode == 0
    after = curl(sidecar, url)
    assert after.returncode == 0 and after.body == (dataset / SMALL).read_bytes()
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits_answered_by_core"]) == (2, 1)


def test_a_restarted_sidecar_answers_what_its_check_verified_from_the_table_at_once(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path, tmp_path: Path
) -> None:
    """Two objects stored, the sidecar killed, one body spoiled: after the restart's
    check, the first request for the sound one is the core's, with the head Python
    gave before the restart (but for its Age), and the spoiled one is fetched again."""
    directory = tmp_path / "pod"
    directory.mkdir()
    sidecar = start_sidecar(directory=directory)
    urls = {name: origin.url(name, case="answers-restart") for name in ("small.bin", "medium.bin")}
    heads = {}
    for name, url in urls.items():
        assert curl(sidecar, url).body == (dataset / name).read_bytes()
    sidecar.wait_for_entries(2)
    for name, url in urls.items():
        heads[name] = head_of(curl(sidecar, url, "-D", "-").stdout)
    sidecar.stop(signal.SIGKILL)
    for body in (sidecar.buffer_dir / "objects").iterdir():
        if body.stat().st_size == FILES["medium.bin"]:
            body.write_bytes(bytes(FILES["medium.bin"]))

    again = start_sidecar(directory=directory)
    wait_until(lambda: again.stats()["unverified_entries"] == 0, "verification after restart")
    assert again.stats()["entries"] == 1
    printed = curl(again, urls["small.bin"], "-D", "-")
    assert printed.body == (dataset / "small.bin").read_bytes()
    assert by_core(again) == 1
    head = head_of(printed.stdout)
    assert {**head, "age": ""} == {**heads["small.bin"], "age": ""}
    assert curl(again, urls["medium.bin"]).body == (dataset / "medium.bin").read_bytes()
    assert origin.count("medium.bin", case="answers-restart") == 2
    assert origin.count("small.bin", case="answers-restart") == 1
    stats = again.stats()
    assert (stats["misses"], stats["hits_answered_by_core"]) == (1, 1)


def test_a_body_file_gone_behind_the_tables_back_still_downloads_whole(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url(SMALL)
    answered_by_core(sidecar, url)
    for body in (sidecar.buffer_dir / "objects").rglob("*"):
        if body.is_file():
            os.unlink(body)
    again = curl(sidecar, url)
    assert again.returncode == 0 and again.body == (dataset / SMALL).read_bytes()
    assert by_core(sidecar) == 1


@pytest.fixture
def raw_origin() -> Iterator[RawOrigin]:
    origin = RawOrigin()
    yield origin
    origin.close()


GET = "GET {} HTTP/1.1\r\nHost: {}\r\n\r\n"


def recorded_over_raw_connections(sidecar: Sidecar, raw_origin: RawOrigin, name: str) -> None:
    """A miss, recorded at its commit, and an answer from the table for `name` (its
    body: the name), each on a connection of its own, where nothing waits for the
    router (a fill's end may come after its last byte), from a sidecar that stored
    nothing else."""
    body = name.encode()
    raw_origin.responses[name] = b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: "e"\r\n\r\n%s' % (
        len(body),
        body,
    )
    for stored in (0, 1):
        sidecar.wait_for_entries(stored)
        client = Client(sidecar, "lean", raw_origin.port)
        client.send(GET.format(client.target(name), client.authority).encode())
        assert client.replies(1, linger=0).bodies == [body]
        client.close()
    assert by_core(sidecar) == 1


def test_a_connection_per_file_through_the_proxy_is_answered_at_the_door_and_counted_closed(
    sidecar: Sidecar, raw_origin: RawOrigin
) -> None:
    """A data loader's other shape, plain HTTP through the forward proxy: a new
    connection per file, ended by the request or by the client after its answer. Each
    is answered by the core as it is accepted (`native.Door`), and each counts as open
    until it closes, whoever closes it."""
    recorded_over_raw_connections(sidecar, raw_origin, "door")
    for ending in ("Connection: close\r\n", ""):
        for _ in range(3):
            client = Client(sidecar, "forwarded", raw_origin.port)
            head = GET.format(client.target("door"), client.authority)
            client.send(head.replace("\r\n\r\n", f"\r\n{ending}\r\n").encode())
            reply = client.replies(1, linger=0)
            assert reply.bodies == [b"door"]
            if not ending:
                assert sidecar.stats()["client_connections"] == 1  # kept alive
            client.close()
    assert by_core(sidecar) == 7
    assert raw_origin.count("door") == 1
    deadline = time.monotonic() + BOUND
    while sidecar.stats()["client_connections"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sidecar.stats()["client_connections"] == 0


def test_a_body_of_unknown_length_is_recorded_at_its_commit_too(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url(SMALL, chunked=1)
    answered_by_core(sidecar, url)
    again = curl(sidecar, url, "-D", "-")
    assert again.returncode == 0 and again.body == (dataset / SMALL).read_bytes()
    assert "content-length" in head_of(again.stdout)  # the stored length, not chunks
    assert by_core(sidecar) == 2
    assert origin.count(SMALL, chunked=1) == 1


def test_a_request_that_ends_its_connection_is_answered_by_the_core_which_then_closes(
    sidecar: Sidecar, raw_origin: RawOrigin
) -> None:
    recorded_over_raw_connections(sidecar, raw_origin, "closing")
    ending = (
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",  # urllib's
        "GET {} HTTP/1.0\r\nHost: {}\r\n\r\n",
    )
    for request in ending:
        client = Client(sidecar, "lean", raw_origin.port)
        client.send(request.format(client.target("closing"), client.authority).encode())
        reply = client.replies(1)
        client.close()
        assert reply.bodies == [b"closing"] and reply.closed
        assert reply.heads[0]["connection"] == "close"
    assert by_core(sidecar) == 3
    assert raw_origin.count("closing") == 1


def test_pipelined_requests_are_answered_in_order_when_the_table_knows_the_second(
    sidecar: Sidecar, raw_origin: RawOrigin
) -> None:
    recorded_over_raw_connections(sidecar, raw_origin, "recorded")
    raw_origin.responses["slow"] = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow"
    client = Client(sidecar, "lean", raw_origin.port)
    try:
        # A miss the router answers from the origin, and behind it on the connection a
        # request the table knows: the router answers both, in order.
        pipelined = GET.format(client.target("slow"), client.authority) + GET.format(
            client.target("recorded"), client.authority
        )
        client.send(pipelined.encode())
        reply = client.replies(2, linger=0)
        assert reply.statuses == [200] * 2
        assert reply.bodies == [b"slow", b"recorded"]
        assert not reply.closed
        assert by_core(sidecar) == 1
        assert raw_origin.count("recorded") == 1
        # Once the router has answered all it was handed, the table answers again.
        client.send(GET.format(client.target("recorded"), client.authority).encode())
        assert client.replies(3, linger=0).bodies[2:] == [b"recorded"]
        assert by_core(sidecar) == 2
    finally:
        client.close()


class ReadFields(Fields):
    """A request's fields that remember which names a decision read."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[str] = set()

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        self.read.add(name)
        return super().get(name, default)

    def __contains__(self, name: object) -> bool:
        self.read.add(str(name))
        return super().__contains__(name)

    def __getitem__(self, name: str) -> str:
        self.read.add(name)
        return super().__getitem__(name)


def test_every_field_a_hits_decision_reads_is_one_the_core_leaves_to_python() -> None:
    """The decisions `Router.hit_now` makes from a request, given the fields of a
    request that carries every one of them (so that no decision stops early)."""
    lines = (
        ("Range", "bytes=0-1"),
        ("If-Range", '"e"'),
        ("If-Match", '"e"'),
        ("If-None-Match", '"x"'),
        ("If-Modified-Since", "Sat, 01 Jan 2000 00:00:00 GMT"),
        ("If-Unmodified-Since", "Sat, 01 Jan 2050 00:00:00 GMT"),
        ("Cache-Control", "max-age=5"),
        ("Pragma", "no-cache"),
        ("Accept", "*/*"),
    )
    fields = ReadFields.of(lines)
    fields.read.clear()
    request = Request("GET", "https://origin.test/a", lines)
    request.__dict__["fields"] = fields  # what the cached property would hold
    stored = (("ETag", '"e"'), ("Last-Modified", "Sat, 01 Jan 2000 00:00:00 GMT"))
    now = time.time()
    policy.request_may_hit(request.method, request.fields)
    policy.needs_revalidation(False, request.fields)
    policy.only_if_cached(request.fields)
    policy.is_fresh(stored, 60.0, now, request.fields, now)
    policy.answers_preconditions(request.fields, '"e"')
    answer(request, Representation(10, stored, now), now)
    assert fields.read - {"accept"} <= policy.HIT_FIELDS
    assert fields.read >= {"range", "if-range", "if-match", "if-none-match", "cache-control"}


def test_under_lru_what_the_table_answers_counts_as_a_use(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    """Four objects fill the buffer, and their misses record them in the table; the
    table's hits, in order, leave the first the least recently used, and then the table
    answers it once more: the fifth object evicts the second, not the first."""
    size = FILES[SMALL]
    sidecar = start_sidecar("--workers", "1", "--buffer-size", f"{4 * size}", "--eviction", "lru")
    expected = (dataset / SMALL).read_bytes()
    urls = [origin.url(SMALL, case=f"answers-lru-{i}") for i in range(5)]
    for url in urls[:4]:  # the misses
        assert curl(sidecar, url).body == expected
    sidecar.wait_for_entries(4)
    for url in urls[:4]:  # the table's hits
        assert curl(sidecar, url).body == expected
    time.sleep(3 * TOUCH_INTERVAL)  # their uses reported, in that order
    assert curl(sidecar, urls[0]).body == expected
    assert by_core(sidecar) == 5
    time.sleep(3 * TOUCH_INTERVAL)  # the table's use reported
    assert curl(sidecar, urls[4]).body == expected  # a miss, which evicts one
    misses = sidecar.stats()["misses"]
    assert curl(sidecar, urls[0]).body == expected
    assert sidecar.stats()["misses"] == misses
    assert curl(sidecar, urls[1]).body == expected
    assert sidecar.stats()["misses"] == misses + 1


def test_an_eviction_forgets_the_evicted_objects_answer_alone(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    """Four objects fill the buffer, their misses recording them in the table; a fifth
    evicts the first. The other three are still the table's, and the first is a miss."""
    size = FILES[SMALL]
    sidecar = start_sidecar("--workers", "1", "--buffer-size", f"{4 * size}", "--eviction", "lru")
    expected = (dataset / SMALL).read_bytes()
    urls = [origin.url(SMALL, case=f"answers-evicted-{i}") for i in range(5)]
    for url in urls[:4]:
        assert curl(sidecar, url).body == expected
    sidecar.wait_for_entries(4)
    assert curl(sidecar, urls[4]).body == expected  # evicts the least recently used
    for url in urls[1:4]:
        assert curl(sidecar, url).body == expected
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits_answered_by_core"]) == (5, 3)
    assert curl(sidecar, urls[0]).body == expected
    assert sidecar.stats()["misses"] == 6


def test_plain_http_sent_to_the_proxy_is_the_cores_and_another_host_on_it_is_relayed(
    sidecar: Sidecar, raw_origin: RawOrigin
) -> None:
    """A client of the forward proxy itself (plain HTTP, absolute-form targets) on one
    kept-alive connection: its miss recorded at the commit, its repeat answered by the
    core; a request to a host that is not intercepted, on the same connection, relayed
    untouched each time and never stored."""
    raw_origin.responses["forwarded"] = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nforwarded"
    client = Client(sidecar, "forwarded", raw_origin.port)
    elsewhere = f"tunnel.test:{raw_origin.port}"
    try:
        client.send(GET.format(client.target("forwarded"), client.authority).encode())
        assert client.replies(1, linger=0).bodies == [b"forwarded"]
        sidecar.wait_for_entries(1)
        client.send(GET.format(client.target("forwarded"), client.authority).encode())
        assert client.replies(2, linger=0).bodies[1:] == [b"forwarded"]
        assert by_core(sidecar) == 1
        for answered in (3, 4):
            client.send(GET.format(f"http://{elsewhere}/r/elsewhere", elsewhere).encode())
            reply = client.replies(answered, linger=0)
            assert reply.statuses[-1] == 200 and reply.bodies[-1] == b"hello"
        assert not reply.closed
    finally:
        client.close()
    assert raw_origin.count("forwarded") == 1 and raw_origin.count("elsewhere") == 2
    stats = sidecar.stats()
    assert stats["pass_reasons"] == {"not-intercepted": 2}
    assert (stats["misses"], stats["entries"]) == (1, 1)


def read_twice(sidecar: Sidecar, origin: OriginServer, dataset: Path, count: int) -> None:
    """Read `count` small files twice on one kept-alive tunnel, as a data loader's worker
    does its epochs: a miss each, then (each stored by then) a hit each."""
    lines = []
    for index in range(count):
        name = f"epoch-{index}.bin"
        body = index.to_bytes(4, "big") * 16
        (dataset / name).write_bytes(body)
        lines.append(f"{origin.url(name)} {len(body)} {hashlib.sha256(body).hexdigest()}")
    manifest = sidecar.directory / "manifest.txt"
    manifest.write_text("\n".join(lines) + "\n")
    argv = [sys.executable, "-m", "bench.loader_client", "--manifest", str(manifest),
            "--workers", "1", "--shape", "keep-alive", "--cafile", str(sidecar.bundle),
            "--proxy", sidecar.proxy]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, env=clean_env(), timeout=120)
    sidecar.wait_for_entries(count)
    subprocess.run(argv, check=True, capture_output=True, env=clean_env(), timeout=120)


def test_the_table_answers_as_many_objects_as_index_objects_says(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    """The second epoch over 300 objects is all the core's with the default room; with
    room for 64 (80 entries, and an arena for about as many answers), most of it goes to
    Python, and the answers that gave way are counted."""
    roomy = start_sidecar()
    read_twice(roomy, origin, dataset, 300)
    stats = roomy.stats()
    assert (stats["misses"], stats["hits"], stats["hits_answered_by_core"]) == (300, 300, 300)
    assert stats["answers_displaced"] == 0
    assert "burstbuffer_answers_displaced_total 0.0" in roomy.metrics()
    cramped = start_sidecar("--index-objects", "64")
    read_twice(cramped, origin, dataset, 300)
    stats = cramped.stats()
    assert (stats["misses"], stats["hits"]) == (300, 300), stats
    assert stats["hits_answered_by_core"] <= 80, stats
    assert stats["answers_displaced"] >= 300 - 80, stats
