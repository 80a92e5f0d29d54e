"""HTTP semantics a caching proxy keeps (RFC 9110, RFC 9111), end to end: real origins,
the real sidecar, real clients."""

from __future__ import annotations

import email.utils
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import trustme

from bench.harness import OriginServer, Sidecar, start_origin, wait_until
from tests.sidecar.conftest import curl, wget

pytestmark = pytest.mark.e2e


def served_file(dataset: Path, name: str, body: bytes, *headers: tuple[str, str]) -> Path:
    """A file of the origin, with extra response fields (see bench.origin)."""
    path = dataset / name
    path.write_bytes(body)
    set_fields(path, *headers)
    return path


def set_fields(path: Path, *headers: tuple[str, str]) -> None:
    """The extra response fields of an origin's file (its body, and so its ETag, stay)."""
    path.with_name(path.name + ".headers").write_text(json.dumps([list(h) for h in headers]))


def response_fields(stdout: str) -> dict[str, list[str]]:
    """The fields of the last response head `curl -D -` printed, by lower-case name."""
    heads = [head for head in stdout.replace("\r\n", "\n").split("\n\n") if head.strip()]
    fields: dict[str, list[str]] = {}
    for line in heads[-1].splitlines()[1:]:
        name, _, value = line.partition(":")
        fields.setdefault(name.strip().lower(), []).append(value.strip())
    return fields


def fetch(sidecar: Sidecar, url: str, *args: str) -> tuple[bytes, dict[str, list[str]]]:
    download = curl(sidecar, url, "-D", "-", *args)
    assert download.returncode == 0, download.stderr
    return download.body, response_fields(download.stdout)


def test_a_miss_relays_date_age_and_cookies_and_a_hit_keeps_the_date_with_its_own_age(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    body = b"cookie-protected\n" * 100
    served_file(dataset, "cookie.bin", body, ("Age", "100"), ("Set-Cookie", "session=abc"))
    url = origin.url("cookie.bin")
    got, miss = fetch(sidecar, url)
    assert got == body
    assert miss["set-cookie"] == ["session=abc"]
    assert miss["age"] == ["100"]
    assert len(miss["date"]) == 1
    sidecar.wait_for_entries(1)
    time.sleep(1.1)  # the hit's Age must have grown by a second
    got, hit = fetch(sidecar, url)
    assert got == body
    assert "set-cookie" not in hit
    # The Date says when the origin made the response (RFC 9110 §6.6.1); the Age, how
    # long ago that was.
    assert hit["date"] == miss["date"] and len(hit["age"]) == 1
    assert 101 <= int(hit["age"][0]) < 110
    assert sidecar.stats()["hits"] == 1
    # A 304 from the buffer carries them too (RFC 9110 §15.4.5).
    _, not_modified = fetch(sidecar, url, "-H", f"If-None-Match: {hit['etag'][0]}")
    assert "date" in not_modified and "age" in not_modified
    # A stored response that came without a valid Date has the one it got on arrival.
    served_file(dataset, "undated.bin", body, ("Date", ""))
    assert fetch(sidecar, origin.url("undated.bin"))[0] == body
    sidecar.wait_for_entries(2)
    _, undated_hit = fetch(sidecar, origin.url("undated.bin"))
    served_at = email.utils.parsedate_to_datetime(undated_hit["date"][0]).timestamp()
    assert abs(served_at - time.time()) < 5 and len(undated_hit["date"]) == 1


def test_a_write_invalidates_the_stored_object_and_its_location(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    checkpoint = dataset / "checkpoint.bin"
    checkpoint.write_bytes(b"epoch 1\n" * 1000)
    other = dataset / "latest.bin"
    other.write_bytes(b"points at epoch 1\n")
    url, latest = origin.url("checkpoint.bin"), origin.url("latest.bin")
    assert curl(sidecar, url).body == b"epoch 1\n" * 1000
    assert curl(sidecar, latest).body == b"points at epoch 1\n"
    sidecar.wait_for_entries(2)
    put = curl(sidecar, url, "-X", "PUT", "--data-binary", "epoch 2\n")
    assert put.returncode == 0, put.stderr
    assert curl(sidecar, url).body == b"epoch 2\n"
    # A POST whose response names another URL of the same origin invalidates that one.
    other.write_bytes(b"points at epoch 2\n")
    assert curl(sidecar, latest).body == b"points at epoch 1\n"  # still stored
    posted = curl(sidecar, origin.url("checkpoint.bin", location="/files/latest.bin"), "-d", "x")
    assert posted.returncode == 0, posted.stderr
    assert curl(sidecar, latest).body == b"points at epoch 2\n"
    # An error answer to a write invalidates nothing.
    assert curl(sidecar, url).body == b"epoch 2\n"
    sidecar.wait_for_entries(2)
    refused = curl(sidecar, origin.url("checkpoint.bin", status=403), "-X", "DELETE")
    assert refused.returncode != 0
    assert sidecar.stats()["entries"] == 2


def test_a_write_keeps_a_running_fill_from_being_stored_or_joined(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    slow = dataset / "slow.bin"
    slow.write_bytes(b"old" * 400_000)
    url = origin.url("slow.bin", rate=600_000)  # two seconds of body
    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(curl, sidecar, url)
        wait_until(lambda: origin.count("slow.bin", rate=600_000) == 1, "the fill to start")
        put = curl(sidecar, url, "-X", "PUT", "--data-binary", "new")
        assert put.returncode == 0, put.stderr
        assert curl(sidecar, url).body == b"new"  # not the running fill of the old body
        assert reading.result().body == b"old" * 400_000  # began before the write
    assert curl(sidecar, url).body == b"new"
    sidecar.wait_for_entries(1)
    assert curl(sidecar, url).body == b"new"
    assert "not stored" in sidecar.log()


def test_revalidation_takes_one_round_trip_and_a_changed_answer_is_the_new_fill(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--revalidate")
    path = dataset / "revalidated.bin"
    path.write_bytes(b"version 1\n" * 100)
    url = origin.url("revalidated.bin")
    assert curl(sidecar, url).body == b"version 1\n" * 100
    sidecar.wait_for_entries(1)
    path.write_bytes(b"version 2\n" * 100)
    assert curl(sidecar, url).body == b"version 2\n" * 100  # the 200 of the revalidation
    assert origin.count("revalidated.bin") == 2
    sidecar.wait_for_entries(1)
    assert curl(sidecar, url).body == b"version 2\n" * 100  # a 304: the new object stored
    assert origin.count("revalidated.bin") == 3
    assert sidecar.stats()["hits"] == 1
    # Without validators, each revalidation is one plain GET, and its answer the new fill.
    bare = origin.url("revalidated.bin", novalidators=1)
    for round_trips in (1, 2, 3):
        assert curl(sidecar, bare).body == b"version 2\n" * 100
        assert origin.count("revalidated.bin", novalidators=1) == round_trips
        sidecar.wait_for_entries(2)


def test_a_304_updates_the_stored_fields(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--revalidate")
    body = b"manifest\n" * 100
    path = served_file(dataset, "manifest.bin", body, ("Cache-Control", "max-age=60"))
    url = origin.url("manifest.bin")
    assert fetch(sidecar, url)[1]["cache-control"] == ["max-age=60"]
    sidecar.wait_for_entries(1)
    set_fields(path, ("Cache-Control", "max-age=3600"), ("X-Revision", "7"))
    for _ in range(3):  # the updated copy is what every worker serves from then on
        got, fields = fetch(sidecar, url)
        assert got == body
        assert fields["cache-control"] == ["max-age=3600"]
        assert fields["x-revision"] == ["7"]
        assert fields["content-length"] == [str(len(body))]
    assert origin.full_fetches("manifest.bin") == 4  # one fill, three 304s
    assert sidecar.stats()["hits"] == 3


def test_a_request_after_a_response_ended_is_a_hit_of_the_committed_object(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    # The second request of each pair follows the first on the same connection at once:
    # it must find the object stored (and so revalidate it), never join the fill.
    sidecar = start_sidecar("--revalidate")
    for number in range(5):
        name = f"ordered-{number}.bin"
        (dataset / name).write_bytes(b"%d\n" % number * 300_000)
        url = origin.url(name)
        out = sidecar.directory / f"first-{number}"
        both = curl(sidecar, url, "-o", str(out), url)
        assert both.returncode == 0, both.stderr
        assert both.body == out.read_bytes() == b"%d\n" % number * 300_000
        assert origin.count(name) == 2, f"request {number} was not revalidated"


def test_early_hints_reach_http_1_1_clients_only(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    # A miss (the fill's request), then a pass (a response that is not stored).
    for url in (origin.url("small.bin", hints=1), origin.url("small.bin", hints=1, nostore=1)):
        download = curl(sidecar, url, "-D", "-")
        assert download.returncode == 0, download.stderr
        hints = download.stdout.find("HTTP/1.1 103 Early Hints\r\n")
        assert 0 < hints < download.stdout.find("HTTP/1.1 200 OK\r\n"), download.stdout
        assert "Link: </files/style.css>; rel=preload\r\n" in download.stdout
        assert download.body == (dataset / "small.bin").read_bytes()
    old = curl(sidecar, origin.url("small.bin", hints=1, cold=1), "-D", "-", "--http1.0")
    assert old.returncode == 0, old.stderr
    assert " 103 " not in old.stdout and "Link:" not in old.stdout


def test_http_freshness_hosts_follow_max_age_no_cache_and_heuristic_freshness(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--http-freshness", "origin.test")
    served_file(dataset, "fresh.bin", b"fresh\n" * 100, ("Cache-Control", "max-age=600"))
    served_file(dataset, "short.bin", b"short\n" * 100, ("Cache-Control", "max-age=1"))
    served_file(dataset, "always.bin", b"always\n" * 100, ("Cache-Control", "no-cache"))
    old = served_file(dataset, "old.bin", b"old\n" * 100)
    os.utime(old, (time.time() - 100_000, time.time() - 100_000))  # fresh for 10,000 s
    served_file(dataset, "bare.bin", b"bare\n" * 100)  # without validators: never fresh
    names: dict[str, dict[str, object]] = {
        "fresh.bin": {},
        "short.bin": {},
        "always.bin": {},
        "old.bin": {},
        "bare.bin": {"novalidators": 1},
    }
    for name, query in names.items():
        assert curl(sidecar, origin.url(name, **query)).body == (dataset / name).read_bytes()
    sidecar.wait_for_entries(5)
    time.sleep(1.1)  # short.bin is stale now
    for name, query in names.items():
        assert curl(sidecar, origin.url(name, **query)).body == (dataset / name).read_bytes()
    seen = {name: origin.count(name, **query) for name, query in names.items()}
    expected = {"fresh.bin": 1, "short.bin": 2, "always.bin": 2, "old.bin": 1, "bare.bin": 2}
    assert seen == expected
    # A client's max-age=0 asks for validation; the validated object stays fresh.
    assert curl(sidecar, origin.url("old.bin"), "-H", "Cache-Control: max-age=0").returncode == 0
    assert origin.count("old.bin") == 2
    assert curl(sidecar, origin.url("old.bin")).body == b"old\n" * 100
    assert origin.count("old.bin") == 2


def test_a_stale_object_is_served_when_the_origin_is_down_unless_it_must_revalidate(
    start_sidecar: Callable[..., Sidecar],
    origin_ca: trustme.CA,
    dataset: Path,
    tmp_path: Path,
) -> None:
    sidecar = start_sidecar("--http-freshness", "origin.test")
    served_file(dataset, "lenient.bin", b"lenient\n", ("Cache-Control", "max-age=0"))
    strict = ("Cache-Control", "max-age=0, must-revalidate")
    served_file(dataset, "strict.bin", b"strict\n", strict)
    down = start_origin(dataset, origin_ca, ["origin.test"], tmp_path)
    for name in ("lenient.bin", "strict.bin"):
        assert curl(sidecar, down.url(name)).body == (dataset / name).read_bytes()
    sidecar.wait_for_entries(2)
    down.process.stop()
    assert curl(sidecar, down.url("lenient.bin")).body == b"lenient\n"
    refused = curl(sidecar, down.url("strict.bin"), "-w", "%{http_code}")
    assert refused.returncode != 0 and refused.stdout.endswith("504")


def test_a_body_longer_than_its_content_length_is_relayed_as_announced_and_never_stored(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    # The origin follows each body with a forged response on the same connection: a
    # proxy that took it for part of the body, or reused the connection, would serve it.
    body = (dataset / "medium.bin").read_bytes()
    for query in ({"overlong": 1}, {"overlong": 1, "nostore": 1}):  # a fill, a pass
        for client in (wget, curl):
            got = client(sidecar, origin.url("medium.bin", **query))
            assert got.returncode == 0, got.stderr
            assert got.body == body, query
        assert origin.gets("medium.bin", **query) == 2  # nothing was stored
    assert sidecar.stats()["entries"] == 0
    # Later requests to the origin get its answers, not the forgery.
    assert curl(sidecar, origin.url("small.bin")).body == (dataset / "small.bin").read_bytes()
    log = sidecar.log()
    assert log.count("the origin sent more than its Content-Length") == 4, log
    assert "Traceback" not in log


def test_a_body_longer_than_its_content_length_over_plain_http_is_not_stored_either(
    sidecar: Sidecar, plain_origin: int, dataset: Path
) -> None:
    # Plain HTTP reaches the router through mitmproxy, then the same upstream client.
    url = f"http://origin.test:{plain_origin}/files/medium.bin?overlong=1"
    for _ in range(2):
        got = curl(sidecar, url)
        assert got.returncode == 0, got.stderr
        assert got.body == (dataset / "medium.bin").read_bytes()
    assert sidecar.stats()["entries"] == 0
    assert sidecar.stats()["misses"] == 2
    assert sidecar.log().count("the origin sent more than its Content-Length") == 2


def test_http_freshness_reads_only_valid_http_dates_and_the_first_age(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--http-freshness", "origin.test")
    hour = time.gmtime(time.time() + 3600)
    fixdate = time.strftime("%a, %d %b %Y %H:%M:%S GMT", hour)
    expires = {  # RFC 9110 §5.6.7: three formats; anything else is already expired
        "imf.bin": (fixdate, 1),
        "rfc850.bin": (time.strftime("%A, %d-%b-%y %H:%M:%S GMT", hour), 1),
        "asctime.bin": (time.strftime("%a %b %e %H:%M:%S %Y", hour), 1),
        "utc.bin": (fixdate.replace("GMT", "UTC"), 2),
        "short-year.bin": (time.strftime("%a, %d %b %y %H:%M:%S GMT", hour), 2),
        "no-comma.bin": (fixdate.replace(",", ""), 2),
        "dashes.bin": (time.strftime("%a, %d-%b-%Y %H:%M:%S GMT", hour), 2),
    }
    for name, (value, _) in expires.items():
        served_file(dataset, name, name.encode() * 10, ("Expires", value))
    # RFC 9111 §5.1: a list-based Age counts by its first member.
    max_age = ("Cache-Control", "max-age=3600")
    served_file(dataset, "old-age.bin", b"old\n" * 10, max_age, ("Age", "7200, 0"))
    served_file(dataset, "young-age.bin", b"young\n" * 10, max_age, ("Age", "0, 7200"))
    expected = {name: requests for name, (_, requests) in expires.items()}
    expected |= {"old-age.bin": 2, "young-age.bin": 1}
    for name in expected:
        assert curl(sidecar, origin.url(name)).body == (dataset / name).read_bytes()
    sidecar.wait_for_entries(len(expected))
    for name in expected:
        assert curl(sidecar, origin.url(name)).body == (dataset / name).read_bytes()
    assert {name: origin.count(name) for name in expected} == expected


def test_a_client_s_max_stale_min_fresh_and_only_if_cached_are_honoured(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--http-freshness", "origin.test")
    served_file(dataset, "lax.bin", b"lax\n" * 10, ("Cache-Control", "max-age=1"))
    strict = ("Cache-Control", "max-age=1, must-revalidate")
    served_file(dataset, "must.bin", b"must\n" * 10, strict)
    served_file(dataset, "long.bin", b"long\n" * 10, ("Cache-Control", "max-age=600"))
    names = ("lax.bin", "must.bin", "long.bin")
    for name in names:
        assert curl(sidecar, origin.url(name)).body == (dataset / name).read_bytes()
    sidecar.wait_for_entries(3)
    time.sleep(1.1)  # lax.bin and must.bin are stale now

    def ask(name: str, cache_control: str) -> int:
        download = curl(sidecar, origin.url(name), "-H", f"Cache-Control: {cache_control}")
        assert download.returncode == 0, download.stderr
        assert download.body == (dataset / name).read_bytes()
        return origin.count(name)

    assert ask("lax.bin", "max-stale=60") == 1  # RFC 9111 §5.2.1.2
    assert ask("lax.bin", "max-stale") == 1
    assert ask("must.bin", "max-stale=60") == 2  # must-revalidate: never served stale
    assert ask("long.bin", "min-fresh=60") == 1  # RFC 9111 §5.2.1.3
    assert ask("long.bin", "min-fresh=6000") == 2
    # RFC 9111 §5.2.1.7: a stored response that may answer, else 504.
    assert ask("long.bin", "only-if-cached") == 2
    for url in (origin.url("lax.bin"), origin.url("small.bin", case="never-fetched")):
        refused = curl(sidecar, url, "-H", "Cache-Control: only-if-cached", "-w", "%{http_code}")
        assert refused.returncode != 0 and refused.stdout.endswith("504")
    assert origin.count("lax.bin") == 1 and origin.count("small.bin", case="never-fetched") == 0


def test_if_modified_since_is_compared_with_the_date_of_a_response_without_last_modified(
    sidecar: Sidecar, origin: OriginServer
) -> None:
    url = origin.url("small.bin", novalidators=1, case="ims")
    _, miss = fetch(sidecar, url)
    assert "last-modified" not in miss and "etag" not in miss
    sidecar.wait_for_entries(1)
    date = email.utils.parsedate_to_datetime(miss["date"][0]).timestamp()
    for since, status in ((date, "304"), (date + 60, "304"), (date - 60, "200")):
        header = f"If-Modified-Since: {email.utils.formatdate(since, usegmt=True)}"
        answered = curl(sidecar, url, "-H", header, "-w", "%{http_code}")
        assert answered.stdout.endswith(status), (since - date, answered.stdout)
    assert origin.count("small.bin", novalidators=1, case="ims") == 1


def test_a_content_range_on_a_200_is_kept_and_gives_way_to_a_part_s_own(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    # RFC 9111 §3.1: every field is stored; the field means nothing on a 200 (RFC 9110
    # §14.4) but is the origin's to send.
    body = b"0123456789" * 10
    served_file(dataset, "odd-range.bin", body, ("Content-Range", "bytes 0-9/10"))
    url = origin.url("odd-range.bin")
    for _ in ("miss", "hit"):
        got, fields = fetch(sidecar, url)
        assert got == body and fields["content-range"] == ["bytes 0-9/10"]
        sidecar.wait_for_entries(1)
    got, part = fetch(sidecar, url, "-r", "5-9")
    assert got == b"56789" and part["content-range"] == ["bytes 5-9/100"]
    download = curl(sidecar, url, "-D", "-", "-H", f"If-None-Match: {fields['etag'][0]}")
    assert " 304 " in download.stdout and "content-range" not in response_fields(download.stdout)
    assert sidecar.stats()["hits"] == 3
