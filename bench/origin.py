"""A local HTTPS origin for the demo, the benchmarks and the tests.

It serves the files of one directory under `/files/<name>` like a dataset host:
ETag, Last-Modified, single Range requests, If-Range, If-None-Match, If-Match, HEAD;
as an S3-compatible endpoint with path-style addressing, `files` is a bucket. Query
parameters turn on the behaviours a cache must survive:

    rate=N        throttle this response to N bytes/s (a far host's per-connection cap)
    drop=N        close the connection after N body bytes, on the first request only
    dropalways=N  the same, on every request
    stall=N       go silent for 30 s after N body bytes, on the first request only
    novalidators  send neither ETag nor Last-Modified (a body that cannot be resumed)
    noranges      ignore Range (always 200)
    lie=N         announce N more bytes in Content-Length than are sent, then close
    overlong      send a forged response (`FORGED`) right after the body, in the same
                  write as the body's last bytes, and keep the connection open
    gzip          claim Content-Encoding: gzip whatever the client asked
    nostore       Cache-Control: no-store
    hints         send a 103 (Early Hints) with a Link field before the response
    chunked       send the 200 chunked, without Content-Length (ranges still served)
    status=N      answer N with a short text body
    loop          redirect (302) to this very URL, forever
    wrong206      answer a plain GET with 206 and a Content-Range for the whole body
    badrange      answer a Range request with the bytes one past those asked for

Writes: `PUT` replaces the file with the request body (204), `DELETE` removes it (204),
`POST` answers 201 with `Location: <location>` when asked with `location=<target>`.

A file `<name>.headers` beside a file holds a JSON list of [name, value] pairs: extra
response fields sent with its 200s and 304s (read on every request, so a test can
change them between requests).

`GET /__requests` returns JSON counts of the requests seen, by request target
(`/files/a?x=1`), with `ranges` counting those that carried a Range header, `heads`
the HEAD requests, and `bytes` the body bytes sent in all.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import email.utils
import hashlib
import json
import os
import re
import ssl
import time
from pathlib import Path

from aiohttp import web

CHUNK = 256 * 1024
# What `overlong` sends after a body: a whole response, which a client that reused the
# connection would take for the answer to its next request.
FORGED = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
STALL = 30.0  # seconds an origin asked to stall stays silent
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


class Origin:
    def __init__(self, directory: Path, default_rate: float | None) -> None:
        self.directory = directory
        self.default_rate = default_rate
        self.requests: collections.Counter[str] = collections.Counter()
        self.ranges: collections.Counter[str] = collections.Counter()
        self.heads: collections.Counter[str] = collections.Counter()
        self.bytes_sent = 0
        self._dropped: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/__requests", self.counts)
        app.router.add_route("*", "/files/{name}", self.serve)
        return app

    async def counts(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "requests": self.requests,
                "ranges": self.ranges,
                "heads": self.heads,
                "bytes": self.bytes_sent,
            }
        )

    async def serve(self, request: web.Request) -> web.StreamResponse:
        target = request.path_qs
        self.requests[target] += 1
        if "Range" in request.headers:
            self.ranges[target] += 1
        if request.method == "HEAD":
            self.heads[target] += 1
        q = request.query
        if "status" in q:
            return web.Response(status=int(q["status"]), text=f"status {q['status']}\n")
        if "loop" in q:
            raise web.HTTPFound(location=target)
        path = self.directory / request.match_info["name"]
        if request.method not in ("GET", "HEAD"):
            return await _write(request, path)
        if not path.is_file():
            raise web.HTTPNotFound(text="no such file\n")
        stat = path.stat()
        size = stat.st_size
        headers = {"Content-Type": "application/octet-stream"}
        etag = '"' + hashlib.sha1(f"{path.name}{size}{stat.st_mtime_ns}".encode()).hexdigest() + '"'
        last_modified = email.utils.formatdate(stat.st_mtime, usegmt=True)
        if "novalidators" not in q:
            headers["ETag"] = etag
            headers["Last-Modified"] = last_modified
        if "noranges" not in q:
            headers["Accept-Ranges"] = "bytes"
        if "gzip" in q:
            headers["Content-Encoding"] = "gzip"
        if "nostore" in q:
            headers["Cache-Control"] = "no-store"
        if_match = request.headers.get("If-Match")
        if if_match not in (None, "*") and ("novalidators" in q or if_match != etag):
            return web.Response(status=412)
        if "hints" in q and request.transport is not None:
            # aiohttp has no API for interim responses: written ahead of the response.
            request.transport.write(
                b"HTTP/1.1 103 Early Hints\r\nLink: </files/style.css>; rel=preload\r\n\r\n"
            )
        extra = _extra_headers(path)
        if "novalidators" not in q and request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=[("ETag", etag), *extra])

        start, end, status = 0, size, 200
        wanted = _RANGE_RE.match(request.headers.get("Range", ""))
        if_range = request.headers.get("If-Range")
        if wanted and "noranges" not in q and if_range in (None, etag, last_modified):
            first, last = wanted.groups()
            if first:
                start, end = int(first), min(int(last) + 1 if last else size, size)
            elif last:
                start, end = max(size - int(last), 0), size
            if start >= size:
                return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
            status = 206
            if "badrange" in q:
                start, end = min(start + 1, size - 1), min(end + 1, size)
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        elif "wrong206" in q:
            status = 206
            headers["Content-Range"] = f"bytes 0-{size - 1}/{size}"

        announced = end - start + int(q.get("lie", 0))
        if "chunked" not in q or status != 200:
            headers["Content-Length"] = str(announced)
        response = web.StreamResponse(status=status, headers=[*headers.items(), *extra])
        await response.prepare(request)
        if request.method == "HEAD":
            return response

        drop_at = stall_at = None
        if "stall" in q and target not in self._dropped:
            self._dropped.add(target)
            stall_at = int(q["stall"])
        if "dropalways" in q:
            drop_at = int(q["dropalways"])
        elif "drop" in q and target not in self._dropped:
            self._dropped.add(target)
            drop_at = int(q["drop"])
        rate = float(q["rate"]) if "rate" in q else self.default_rate
        if "overlong" in q and request.transport is not None:
            # The last bytes and the excess in one write, once the rest has gone out:
            # one segment, so the client reads them together.
            last = max(end - 1024, start)
            await self._send_body(request, response, path, start, last, None, None, rate)
            await asyncio.sleep(0.05)
            with path.open("rb") as file:
                file.seek(last)
                request.transport.write(file.read(end - last) + FORGED)
            return response
        await self._send_body(request, response, path, start, end, drop_at, stall_at, rate)
        if "lie" in q:
            _abort(request)
        return response

    async def _send_body(
        self,
        request: web.Request,
        response: web.StreamResponse,
        path: Path,
        start: int,
        end: int,
        drop_at: int | None,
        stall_at: int | None,
        rate: float | None,
    ) -> None:
        began = time.monotonic()
        sent = 0
        fd = os.open(path, os.O_RDONLY)
        try:
            while start + sent < end:
                size = min(CHUNK, end - start - sent)
                if rate:
                    size = min(size, max(int(rate / 20), 1))
                if drop_at is not None and sent + size > drop_at:
                    await response.write(os.pread(fd, drop_at - sent, start + sent))
                    await asyncio.sleep(0.05)
                    _abort(request)
                    return
                if stall_at is not None and sent + size > stall_at:
                    await response.write(os.pread(fd, stall_at - sent, start + sent))
                    await asyncio.sleep(STALL)
                    _abort(request)
                    return
                chunk = os.pread(fd, size, start + sent)
                await response.write(chunk)
                sent += len(chunk)
                self.bytes_sent += len(chunk)
                if rate:
                    ahead = sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
        finally:
            os.close(fd)


async def _write(request: web.Request, path: Path) -> web.Response:
    if request.method == "PUT":
        partial = path.with_name(path.name + ".partial")
        partial.write_bytes(await request.read())
        partial.replace(path)  # readers of the old file keep reading the old bytes
        return web.Response(status=204)
    if request.method == "DELETE":
        path.unlink(missing_ok=True)
        return web.Response(status=204)
    location = request.query.get("location")
    return web.Response(status=201, headers={"Location": location} if location else None)


def _extra_headers(path: Path) -> list[tuple[str, str]]:
    extra = path.with_name(path.name + ".headers")
    return [(k, v) for k, v in json.loads(extra.read_text())] if extra.is_file() else []


def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="directory of files to serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", type=Path, help="PEM certificate chain (omit for plain HTTP)")
    parser.add_argument("--key", type=Path, help="PEM private key")
    parser.add_argument("--rate", type=float, help="default per-response throttle, bytes/s")
    args = parser.parse_args()
    context = None
    if args.cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.cert, args.key)
    origin = Origin(args.dir, args.rate)
    print(json.dumps({"listening": f"{args.host}:{args.port}"}), flush=True)
    web.run_app(
        origin.app(),
        host=args.host,
        port=args.port,
        ssl_context=context,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
