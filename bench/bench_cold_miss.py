"""Cold miss: a big file fetched through the sidecar (stored while streamed) vs plain
mitmdump passing it through, both from the unthrottled reference nginx.

Every timed run asks for a new URL (a query string nginx ignores), so each one is a
real miss that fills the buffer. The buffer holds one object and evicts LRU, so each
fill reuses the memory of the object it evicts: in a virtual machine whose memory
the host backs lazily (Firecracker, this machine), tmpfs pages not used recently
cost a host page fault on first write (tmpfs ~0.4 GB/s instead of ~3 GB/s), and a
buffer growing into such memory measures the host, not the sidecar. One untimed
request per proxy first warms its connection to nginx and its leaf certificate.

The sidecar fetches a large cold object over several origin connections by default
(--parallel-fetch); a second sidecar with one connection, like mitmdump, shows what
that costs or gains against an origin that is not throttled.
"""

from __future__ import annotations

import logging

from bench import clients
from bench.lab import HOST, Lab, Profile, expect_stats, in_turn, mb_per_s
from bench.report import Result, Row, Sample, ratio_at_least

logger = logging.getLogger(__name__)

NAME = "cold-miss"


def run(profile: Profile, lab: Lab) -> Result:
    size = profile.large_bytes
    result = Result(NAME, f"Cold miss: {size // 2**20} MiB file from nginx")
    source = lab.make_file("cold.bin", size)
    nginx = lab.nginx()
    fills = {"sidecar": 2 * profile.runs + 1, "one connection": profile.runs + 1}
    one_object = ["--buffer-size", str(size * 3 // 2), "--eviction", "lru"]
    sidecar = lab.sidecar(nginx.ca_pem, *one_object)
    single = lab.sidecar(nginx.ca_pem, *one_object, "--parallel-fetch", "1")
    mitmdump = lab.mitmdump(nginx.ca_pem)
    routes = {
        "mitmdump": lab.through_mitmdump(mitmdump),
        "sidecar": lab.through(sidecar),
        "one connection": lab.through(single),
    }
    for route in routes.values():
        lab.check_download(route, nginx.url(source.name, HOST, "warmup"), source)

    speeds: dict[tuple[str, str], list[float]] = {}
    for run_index in range(profile.runs):
        logger.info("%s: run %d/%d", NAME, run_index + 1, profile.runs)
        for client in ("wget", "curl"):
            url = nginx.url(source.name, HOST, f"cold={client}-{run_index}")
            # The single-connection variant is only there to explain; wget suffices.
            sides = ["mitmdump", "sidecar"] + (["one connection"] if client == "wget" else [])
            for side in in_turn(run_index, sides):
                if client == "wget":
                    seconds = clients.wget(routes[side], url)
                else:
                    seconds = clients.curl(routes[side], url, size)
                speeds.setdefault((side, client), []).append(mb_per_s(size, seconds))
    for name, proxy in (("sidecar", sidecar), ("one connection", single)):
        expect_stats(
            proxy, misses=fills[name], hits=0, passes=0, bytes_from_upstream=fills[name] * size
        )

    for side, client, label, required in (
        ("sidecar", "wget", "miss through the sidecar (stored), wget", ratio_at_least(0.9)),
        ("sidecar", "curl", "miss through the sidecar (stored), curl", ratio_at_least(0.9)),
        ("one connection", "wget", "same, --parallel-fetch 1, wget", None),
    ):
        result.rows.append(
            Row(
                label,
                "MB/s",
                Sample.of(speeds[side, client]),
                Sample.of(speeds["mitmdump", client]),
                "mitmdump pass-through",
                required,
            )
        )
    result.notes.append(
        f"medians of {profile.runs} runs (min–max); mitmdump 12.2.3 with "
        "`-q --set stream_large_bodies=1m`, otherwise its defaults (eager connections, "
        "HTTP/2 offered to clients); the sidecar with its defaults unless said, but a "
        "buffer of 1.5 objects with LRU eviction (each miss evicts the previous object)"
    )
    return result
