"""A Hugging Face Hub of our own, for the tests and the benchmarks: the Hub, its Xet CAS,
the Xet CDN and the LFS CDN in one HTTPS process, told apart by the request's Host.

It serves the repositories of a directory, `DIR/models/<owner>/<name>/...` and
`DIR/datasets/<owner>/<name>/...`, at one commit each (revision `main` or that commit's
hash). Files of at most `--plain-max` bytes are plain git files; larger ones are LFS
files, stored in Xet (cut into xorbs by `bench.xet`, chunks shared between files stored
once) unless they match a `--no-xet` glob. What the real clients (`huggingface_hub`,
`hf_xet`) call, as the Hub answers it:

the Hub (`--hub-host`, e.g. `hub.hf.co`: `HF_ENDPOINT=https://hub.hf.co:PORT`)
    `HEAD|GET /<repo>/resolve/<rev>/<path>` (`/datasets/<repo>/...` for datasets):
    a plain file is 200 with its bytes; an LFS file is a 302 to a whole-file URL signed
    for a while (`Expires`, `Policy`, `Signature`, `Key-Pair-Id`, CloudFront's names) on
    the LFS CDN, or for a Xet file on the Xet CDN's bridge, with `X-Linked-Etag`
    (its SHA-256), `X-Linked-Size`, and for Xet files `X-Xet-Hash` and a `Link` to the
    token endpoint (`rel="xet-auth"`); every answer has `X-Repo-Commit` and `ETag`.
    `GET /api/<type>s/<repo>[/revision/<rev>]` (repository info, `siblings`),
    `GET /api/<type>s/<repo>/tree/<rev>[/<path>]` (`recursive`), `POST .../paths-info/<rev>`.
    `GET /api/<type>s/<repo>/xet-read-token/<rev>`: an access token for the CAS that
    expires in `--expiry` seconds, in the body (`accessToken`, `exp`, `casUrl`: what
    `hf_xet` reads) and in `X-Xet-Access-Token`, `X-Xet-Token-Expiration`,
    `X-Xet-Cas-Url` (what `huggingface_hub` reads).
the CAS (`--cas-host`, `cas-server.xethub.hf.co`)
    `GET /v1/reconstructions/<file hash>` and `/v2/...`, with `Authorization: Bearer
    <token>` (401 without a valid, unexpired one) and an optional `Range` of the file:
    the terms (xorb, chunk range, length) and, per xorb, the chunk ranges to fetch, each
    with its own URL on the CDN signed for exactly its byte range and `--expiry` seconds
    (v1 `fetch_info`, v2 `xorbs`, as xet-core's `cas_types` has them); with
    `--multirange`, v2 has one URL per xorb signed for all its ranges of the file
    (`bytes=A-B,C-D`). 416 past the end.
the Xet CDN (`--cdn-host`, `cas-bridge.xethub.hf.co`)
    `GET /xorbs/default/<xorb>?X-Xet-Signed-Range=bytes%3DA-B&Expires=..&Policy=..
    &Signature=..&Key-Pair-Id=..`: 206 with those bytes, only when the signature (HMAC
    over the path, the signed range and the expiry) holds, the URL has not expired and
    the request's `Range` is exactly the signed range; anything else is 403, an
    unranged GET included. A URL signed for several ranges answers exactly those
    (multipart/byteranges) or any one of them alone (what `hf_xet` asks for unless
    `HF_XET_CLIENT_ENABLE_MULTIRANGE_FETCHING` is set).
    `/xet-bridge-us/<repo>/<sha256>?...`: a Xet file whole (what clients without Xet
    get), signed without a range.
the LFS CDN (`--lfs-host`, `cdn-lfs.hf.co`)
    `GET /repos/<a>/<b>/<repo>/<sha256>?...`: an LFS file whole, signed without a range.

Whole-file URLs answer HEAD, GET and single `Range`s (206). `GET /__requests` (any host)
returns JSON counts of the requests seen by kind (`resolve`, `api`, `token`,
`reconstruction`, `xorb`, `bridge`, `lfs`), `statuses` by `"<kind> <status>"`, `xorbs`
by `"<xorb> <range>"` for the CDN's xorb requests (`multiranges`: those for several
at once), and `bytes` sent by kind;
`POST /__refuse?xorbs=N` makes the next N xorb requests that would be served 403s,
as URLs that expired during a download are. `--access-log` prints a JSON line per
request (never its query nor its credentials).
"""

from __future__ import annotations

import argparse
import base64
import collections
import fnmatch
import hashlib
import hmac
import json
import os
import re
import ssl
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from bench import xet

PLAIN_MAX = 10 * 1024  # bytes: the largest file kept in git rather than LFS
EXPIRY = 3600  # seconds a token or a signed URL is valid for (about the Hub's)
KEY_PAIR_ID = "K3RPWS32NSSJCE"  # CloudFront's name for the signing key
LAST_MODIFIED = "2026-01-01T00:00:00.000Z"
_RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")
_REPO_TYPES = {"models": "model", "datasets": "dataset"}
_LOGGED = ("Range", "User-Agent", "Accept", "Accept-Encoding", "If-None-Match", "If-Range")


@dataclass(frozen=True)
class RepoFile:
    path: str  # in the repository
    disk: Path
    size: int
    oid: str  # git blob id: of the file, or of its LFS pointer
    sha256: str | None  # LFS files only
    xet: xet.XetFile | None  # Xet files only

    def tree_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": self.oid, "size": self.size}
        entry["path"] = self.path
        if self.sha256 is not None:
            pointer = len(_pointer(self.sha256, self.size))
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": pointer}
        if self.xet is not None:
            entry["xetHash"] = self.xet.hash
        return entry


@dataclass(frozen=True)
class Repo:
    type: str  # "model" or "dataset"
    id: str  # owner/name
    commit: str
    files: dict[str, RepoFile]

    @property
    def key(self) -> str:
        """A name for the repository in CDN paths."""
        return hashlib.sha256(f"{self.type}s/{self.id}".encode()).hexdigest()[:24]

    def directories(self) -> set[str]:
        found: set[str] = set()
        for path in self.files:
            parts = path.split("/")[:-1]
            found.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        return found

    def info(self, blobs: bool) -> dict[str, Any]:
        siblings = []
        for f in self.files.values():
            sibling: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                sibling.update(size=f.size, blobId=f.oid)
                if f.sha256 is not None:
                    pointer = len(_pointer(f.sha256, f.size))
                    sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": pointer}
            siblings.append(sibling)
        return {
            "_id": self.key,
            "id": self.id,
            "modelId" if self.type == "model" else "name": self.id,
            "author": self.id.split("/")[0],
            "sha": self.commit,
            "lastModified": LAST_MODIFIED,
            "createdAt": LAST_MODIFIED,
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
        }


def _pointer(sha256: str, size: int) -> bytes:
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _file_digests(path: Path) -> tuple[str, str]:
    """The git blob id and the SHA-256 of a file, read in pieces."""
    size = path.stat().st_size
    git, sha = hashlib.sha1(b"blob %d\0" % size), hashlib.sha256()
    with path.open("rb") as f:
        while piece := f.read(1 << 20):
            git.update(piece)
            sha.update(piece)
    return git.hexdigest(), sha.hexdigest()


def load_repos(
    directory: Path, store: xet.Store, plain_max: int, no_xet: list[str]
) -> dict[tuple[str, str], Repo]:
    """Every repository under `directory`, its Xet files added to `store`."""
    repos = {}
    for folder, repo_type in _REPO_TYPES.items():
        for repo_dir in sorted(directory.glob(f"{folder}/*/*")):
            if not repo_dir.is_dir():
                continue
            files = {}
            for disk in sorted(p for p in repo_dir.rglob("*") if p.is_file()):
                path = disk.relative_to(repo_dir).as_posix()
                size = disk.stat().st_size
                git, sha = _file_digests(disk)
                if size <= plain_max:
                    files[path] = RepoFile(path, disk, size, git, None, None)
                    continue
                stored = None
                if not any(fnmatch.fnmatch(path, glob) for glob in no_xet):
                    stored = store.add(disk)
                files[path] = RepoFile(path, disk, size, _git_oid(_pointer(sha, size)), sha, stored)
            listing = "".join(f"{f.path} {f.oid}\n" for f in files.values())
            repo_id = repo_dir.relative_to(directory / folder).as_posix()
            commit = hashlib.sha1(f"{repo_type} {repo_id}\n{listing}".encode()).hexdigest()
            repos[(repo_type, repo_id)] = Repo(repo_type, repo_id, commit, files)
    return repos


@dataclass(frozen=True)
class Hosts:
    hub: str
    cas: str
    cdn: str
    lfs: str
    port: int

    def url(self, host: str, path: str) -> str:
        return f"https://{host}:{self.port}{path}"


class Signer:
    """Signed URLs and access tokens, valid for `expiry` seconds, under one secret."""

    def __init__(self, expiry: float) -> None:
        self.expiry = expiry
        self._secret = os.urandom(32)

    def _mac(self, *fields: str) -> str:
        digest = hmac.new(self._secret, "\n".join(fields).encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def sign(self, url: str, signed_range: str | None = None) -> str:
        """`url` (no query) with CloudFront's fields, and the Xet CDN's signed range."""
        path = urllib.parse.urlsplit(url).path
        expires = str(int(time.time() + self.expiry))
        policy = {
            "Statement": [
                {"Resource": url, "Condition": {"DateLessThan": {"AWS:EpochTime": int(expires)}}}
            ]
        }
        query = {}
        if signed_range is not None:
            query["X-Xet-Signed-Range"] = signed_range
        query["Expires"] = expires
        query["Policy"] = base64.b64encode(json.dumps(policy).encode()).decode()
        query["Signature"] = self._mac(path, signed_range or "", expires)
        query["Key-Pair-Id"] = KEY_PAIR_ID
        return f"{url}?{urllib.parse.urlencode(query)}"

    def check(self, path: str, query: Any) -> str | None:
        """Why a signed URL is refused (None: it is not): a bad signature, or expired."""
        expires, signature = query.get("Expires", ""), query.get("Signature", "")
        wanted = self._mac(path, query.get("X-Xet-Signed-Range", ""), expires)
        if not hmac.compare_digest(signature, wanted) or query.get("Key-Pair-Id") != KEY_PAIR_ID:
            return "bad signature"
        if not expires.isdigit() or int(expires) < time.time():
            return "expired"
        return None

    def token(self) -> tuple[str, int]:
        exp = int(time.time() + self.expiry)
        return f"xet_{exp}_{self._mac('token', str(exp))}", exp

    def token_valid(self, token: str) -> bool:
        parts = token.split("_", 2)
        if len(parts) != 3 or parts[0] != "xet" or not parts[1].isdigit():
            return False
        good = hmac.compare_digest(parts[2], self._mac("token", parts[1]))
        return good and int(parts[1]) >= time.time()


class Hub:
    def __init__(
        self,
        repos: dict[tuple[str, str], Repo],
        store: xet.Store,
        hosts: Hosts,
        signer: Signer,
        access_log: bool = False,
        multirange: bool = False,
    ) -> None:
        self.access_log = access_log
        self.multirange = multirange
        self.repos = repos
        self.store = store
        self.hosts = hosts
        self.signer = signer
        self.by_sha256 = {
            f.sha256: f for r in repos.values() for f in r.files.values() if f.sha256 is not None
        }
        self.requests: collections.Counter[str] = collections.Counter()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.xorb_ranges: collections.Counter[str] = collections.Counter()
        self.bytes_sent: collections.Counter[str] = collections.Counter()
        self.multiranges = 0  # xorb requests for several ranges at once
        self.refuse_xorbs = 0  # xorb requests still to refuse (`POST /__refuse?xorbs=N`)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count])
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        return app

    @web.middleware
    async def _count(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        kind = request.get("kind")
        if kind is not None:
            self.requests[kind] += 1
            self.statuses[f"{kind} {response.status}"] += 1
        if self.access_log:  # never the query (signatures) nor Authorization (tokens)
            line = {"kind": kind, "method": request.method, "host": request.host}
            line.update(path=request.path, status=response.status)
            line.update({k: request.headers[k] for k in _LOGGED if k in request.headers})
            print(json.dumps(line), flush=True)
        return response

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/__refuse" and request.method == "POST":
            # The next N xorb requests are refused as expired URLs are: a 403, which
            # `hf_xet` answers by asking the CAS for the reconstruction again.
            self.refuse_xorbs = int(request.query.get("xorbs", "1"))
            return web.Response(status=204)
        if request.path == "/__requests":
            return web.json_response(
                {
                    "requests": self.requests,
                    "statuses": self.statuses,
                    "xorbs": self.xorb_ranges,
                    "bytes": self.bytes_sent,
                    "multiranges": self.multiranges,
                }
            )
        host = (request.host or "").rsplit(":", 1)[0].lower()
        if host == self.hosts.cas:
            return await self.cas(request)
        if host == self.hosts.cdn:
            return await self.cdn(request)
        if host == self.hosts.lfs:
            request["kind"] = "lfs"
            return await self.whole_file(request, "/repos/")
        return await self.hub(request)

    # -- the Hub ---------------------------------------------------------------------

    async def hub(self, request: web.Request) -> web.StreamResponse:
        parts = request.path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 4 and parts[1] in _REPO_TYPES:
            repo_type, rest = _REPO_TYPES[parts[1]], parts[2:]
            repo = self.repos.get((repo_type, "/".join(rest[:2])))
            request["kind"] = "token" if len(rest) > 2 and rest[2] == "xet-read-token" else "api"
            if repo is None:
                return _error(404, "RepoNotFound", "Repository not found")
            return await self.api(request, repo, rest[2:])
        repo_type = "model"
        if parts[0] == "datasets":
            repo_type, parts = "dataset", parts[1:]
        if len(parts) >= 5 and parts[2] == "resolve":
            request["kind"] = "resolve"
            repo = self.repos.get((repo_type, "/".join(parts[:2])))
            if repo is None:
                return _error(404, "RepoNotFound", "Repository not found")
            return await self.resolve(request, repo, parts[3], "/".join(parts[4:]))
        return _error(404, None, "Not found")

    def _revision(self, repo: Repo, revision: str) -> web.Response | None:
        if revision in ("main", repo.commit):
            return None
        return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    async def resolve(
        self, request: web.Request, repo: Repo, revision: str, path: str
    ) -> web.StreamResponse:
        if (refused := self._revision(repo, revision)) is not None:
            return refused
        f = repo.files.get(path)
        if f is None:
            refused = _error(404, "EntryNotFound", f"{path} does not exist")
            refused.headers["X-Repo-Commit"] = repo.commit
            return refused
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{f.oid}"', "Accept-Ranges": "bytes"}
        if f.sha256 is None:
            headers["Content-Type"] = "application/octet-stream"
            return await _send_file(request, f.disk, f.size, headers, self.bytes_sent, "resolve")
        headers["X-Linked-Etag"] = f'"{f.sha256}"'
        headers["X-Linked-Size"] = str(f.size)
        if f.xet is None:
            sha = f.sha256
            location = self.hosts.url(
                self.hosts.lfs, f"/repos/{sha[:2]}/{sha[2:4]}/{repo.key}/{sha}"
            )
        else:
            location = self.hosts.url(self.hosts.cdn, f"/xet-bridge-us/{repo.key}/{f.sha256}")
            token_path = f"/api/{repo.type}s/{repo.id}/xet-read-token/{repo.commit}"
            reconstruction = self.hosts.url(self.hosts.cas, f"/v1/reconstructions/{f.xet.hash}")
            headers["X-Xet-Hash"] = f.xet.hash
            headers["Link"] = (
                f'<{self.hosts.url(self.hosts.hub, token_path)}>; rel="xet-auth", '
                f'<{reconstruction}>; rel="xet-reconstruction-info"'
            )
        headers["Location"] = self.signer.sign(location)
        return web.Response(status=302, headers=headers)

    async def api(self, request: web.Request, repo: Repo, rest: list[str]) -> web.Response:
        if not rest or rest[0] == "revision":
            if rest and (refused := self._revision(repo, "/".join(rest[1:]))) is not None:
                return refused
            return web.json_response(repo.info(blobs="blobs" in request.query))
        action, revision, path = rest[0], rest[1] if len(rest) > 1 else "", "/".join(rest[2:])
        if (refused := self._revision(repo, revision)) is not None:
            return refused
        if action == "xet-read-token":
            token, exp = self.signer.token()
            cas = self.hosts.url(self.hosts.cas, "")
            headers = {
                "X-Xet-Access-Token": token,
                "X-Xet-Token-Expiration": str(exp),
                "X-Xet-Cas-Url": cas,
            }
            body = {"accessToken": token, "exp": exp, "casUrl": cas}
            return web.json_response(body, headers=headers)
        if action == "tree" and request.method == "GET":
            recursive = request.query.get("recursive", "").lower() in ("1", "true")
            return web.json_response(self._tree(repo, path, recursive))
        if action == "paths-info" and request.method == "POST":
            if request.content_type == "application/json":
                wanted = (await request.json()).get("paths", [])
            else:
                wanted = (await request.post()).getall("paths", [])
            return web.json_response(self._paths_info(repo, [str(p) for p in wanted]))
        return _error(404, None, "Not found")

    def _tree(self, repo: Repo, path: str, recursive: bool) -> Any:
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        if prefix and prefix[:-1] not in repo.directories():
            return _error(404, "EntryNotFound", f"{path} does not exist")

        def listed(name: str) -> bool:
            return name.startswith(prefix) and (recursive or "/" not in name[len(prefix) :])

        entries: list[dict[str, Any]] = [
            {"type": "directory", "oid": _git_oid(d.encode()), "size": 0, "path": d}
            for d in sorted(repo.directories())
            if listed(d)
        ]
        entries += [f.tree_entry() for p, f in repo.files.items() if listed(p)]
        return entries

    def _paths_info(self, repo: Repo, paths: list[str]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        directories = repo.directories()
        for path in paths:
            path = path.strip("/")
            if path in repo.files:
                found.append(repo.files[path].tree_entry())
            elif path in directories:
                found.append(
                    {"type": "directory", "oid": _git_oid(path.encode()), "size": 0, "path": path}
                )
        return found

    # -- the CAS ---------------------------------------------------------------------

    async def cas(self, request: web.Request) -> web.Response:
        match = re.fullmatch(r"/v([12])/reconstructions/([0-9a-f]{64})", request.path)
        if match is None or request.method != "GET":
            return _error(404, None, "Not found")
        request["kind"] = "reconstruction"
        authorization = request.headers.get("Authorization", "")
        if not authorization.startswith("Bearer ") or not self.signer.token_valid(
            authorization[7:]
        ):
            return web.json_response({"error": "invalid or expired token"}, status=401)
        version, file_hash = match.groups()
        if file_hash not in self.store.files:
            return _error(404, None, "File not found")
        first, end = 0, None
        if "Range" in request.headers:
            wanted = _RANGE_RE.match(request.headers["Range"])
            if wanted is None:
                return web.Response(status=416, text="bad range\n")
            first = int(wanted.group(1))
            end = int(wanted.group(2)) + 1 if wanted.group(2) else None
        try:
            plan = self.store.reconstruct(file_hash, first, end)
        except xet.RangeNotSatisfiable:
            return web.Response(status=416, text="range starts past the end\n")
        terms = [
            {"hash": t.xorb, "unpacked_length": t.length, "range": {"start": t.start, "end": t.end}}
            for t in plan.terms
        ]
        body: dict[str, Any] = {
            "offset_into_first_range": plan.offset_into_first_range,
            "terms": terms,
        }
        urls = {}
        for xorb, fetches in plan.fetches.items():
            for _, _, byte_start, byte_end in fetches:
                signed_range = f"bytes={byte_start}-{byte_end - 1}"
                urls[(xorb, byte_start)] = self.signer.sign(
                    self.hosts.url(self.hosts.cdn, f"/xorbs/default/{xorb}"), signed_range
                )
        if version == "1":
            body["fetch_info"] = {
                xorb: [
                    {
                        "range": {"start": a, "end": b},
                        "url": urls[(xorb, bs)],
                        "url_range": {"start": bs, "end": be - 1},
                    }
                    for a, b, bs, be in fetches
                ]
                for xorb, fetches in plan.fetches.items()
            }
        elif not self.multirange:  # one URL per range, signed for that range
            body["xorbs"] = {
                xorb: [
                    {"url": urls[(xorb, bs)], "ranges": [_descriptor(a, b, bs, be)]}
                    for a, b, bs, be in fetches
                ]
                for xorb, fetches in plan.fetches.items()
            }
        else:  # one URL per xorb, signed for all its ranges
            body["xorbs"] = {}
            for xorb, fetches in plan.fetches.items():
                signed_range = "bytes=" + ",".join(f"{bs}-{be - 1}" for _, _, bs, be in fetches)
                url = self.hosts.url(self.hosts.cdn, f"/xorbs/default/{xorb}")
                body["xorbs"][xorb] = [
                    {
                        "url": self.signer.sign(url, signed_range),
                        "ranges": [_descriptor(*fetch) for fetch in fetches],
                    }
                ]
        return web.json_response(body)

    # -- the CDNs --------------------------------------------------------------------

    async def cdn(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/xet-bridge-us/"):
            request["kind"] = "bridge"
            return await self.whole_file(request, "/xet-bridge-us/")
        match = re.fullmatch(r"/xorbs/default/([0-9a-f]{64})", request.path)
        if match is None:
            return _error(404, None, "Not found")
        request["kind"] = "xorb"
        refusal = self.signer.check(request.path, request.query)
        signed = request.query.get("X-Xet-Signed-Range", "")
        xorb = self.store.xorbs.get(match.group(1))
        spans = _spans(signed)
        asked = request.headers.get("Range")
        # The signed value itself; where it signs several ranges, also any one of them
        # alone (what a client that does not send multi-range requests asks for).
        allowed = {signed} | ({f"bytes={a}-{b}" for a, b in spans} if len(spans) > 1 else set())
        if refusal is None and not spans:
            refusal = "no signed range"
        if refusal is None and request.method != "GET":
            refusal = f"{request.method} not allowed"
        if refusal is None and asked not in allowed:
            refusal = f"Range {asked!r} is not the signed {signed!r}"
        if refusal is None and (xorb is None or any(b >= xorb.size for _, b in spans)):
            refusal = "no such xorb range"
        if refusal is None and self.refuse_xorbs > 0:
            self.refuse_xorbs -= 1
            refusal = "expired (refused on request: POST /__refuse)"
        if refusal is not None:
            return _forbidden(refusal)
        assert xorb is not None and asked is not None
        wanted = _spans(asked)
        for first, last in wanted:
            self.xorb_ranges[f"{xorb.hash} {first}-{last}"] += 1
        self.multiranges += len(wanted) > 1
        headers = {"ETag": f'"{xorb.hash}"', "Accept-Ranges": "bytes"}
        if len(wanted) == 1:
            [(first, last)] = wanted
            headers["Content-Type"] = "application/octet-stream"
            headers["Content-Range"] = f"bytes {first}-{last}/{xorb.size}"
            headers["Content-Length"] = str(last - first + 1)
            parts = [(b"", first, last)]
            tail = b""
        else:  # RFC 9110 14.6: multipart/byteranges, a part per range
            boundary = hashlib.sha1(signed.encode()).hexdigest()
            parts = [
                (
                    f"--{boundary}\r\nContent-Type: application/octet-stream\r\n"
                    f"Content-Range: bytes {a}-{b}/{xorb.size}\r\n\r\n".encode(),
                    a,
                    b,
                )
                for a, b in wanted
            ]
            tail = f"\r\n--{boundary}--\r\n".encode()
            parts = [
                (head if i == 0 else b"\r\n" + head, a, b) for i, (head, a, b) in enumerate(parts)
            ]
            headers["Content-Type"] = f"multipart/byteranges; boundary={boundary}"
            length = sum(len(h) + b - a + 1 for h, a, b in parts) + len(tail)
            headers["Content-Length"] = str(length)
        response = web.StreamResponse(status=206, headers=headers)
        await response.prepare(request)
        for head, first, last in parts:
            await response.write(head)
            for piece in self.store.read(xorb.hash, first, last):
                await response.write(piece)
                self.bytes_sent["xorb"] += len(piece)
        await response.write(tail)
        await response.write_eof()
        return response

    async def whole_file(self, request: web.Request, prefix: str) -> web.StreamResponse:
        """An LFS or bridge URL: the whole file, signed without a range."""
        if request.method not in ("GET", "HEAD"):
            return _forbidden(f"{request.method} not allowed")
        refusal = self.signer.check(request.path, request.query)
        if refusal is None and "X-Xet-Signed-Range" in request.query:
            refusal = "a signed range on a whole-file URL"
        f = self.by_sha256.get(request.path.rsplit("/", 1)[-1])
        if refusal is None and (f is None or not request.path.startswith(prefix)):
            refusal = "no such object"
        if refusal is not None:
            return _forbidden(refusal)
        assert f is not None and f.sha256 is not None
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": f'"{f.sha256}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": f'inline; filename="{f.path.rsplit("/", 1)[-1]}"',
        }
        return await _send_file(request, f.disk, f.size, headers, self.bytes_sent, request["kind"])


def _spans(field: str) -> list[tuple[int, int]]:
    """The ranges of a `bytes=A-B,C-D` value (both ends given), or none if it is not one."""
    if not field.startswith("bytes="):
        return []
    spans = []
    for part in field.removeprefix("bytes=").split(","):
        first, _, last = part.partition("-")
        if not (first.isdigit() and last.isdigit()) or int(first) > int(last):
            return []
        spans.append((int(first), int(last)))
    return spans


def _descriptor(chunk_start: int, chunk_end: int, byte_start: int, byte_end: int) -> Any:
    """A v2 range descriptor: chunks end-exclusive, bytes end-inclusive."""
    chunks = {"start": chunk_start, "end": chunk_end}
    return {"chunks": chunks, "bytes": {"start": byte_start, "end": byte_end - 1}}


def _error(status: int, code: str | None, message: str) -> web.Response:
    headers = {"X-Error-Code": code, "X-Error-Message": message} if code else {}
    return web.json_response({"error": message}, status=status, headers=headers)


def _forbidden(reason: str) -> web.Response:
    """CloudFront's refusal: 403 with a short XML body that says why."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Error><Code>AccessDenied</Code><Message>{reason}</Message></Error>"
    )
    return web.Response(status=403, text=body, content_type="text/xml")


async def _send_file(
    request: web.Request,
    disk: Path,
    size: int,
    headers: dict[str, str],
    sent: collections.Counter[str],
    kind: str,
) -> web.StreamResponse:
    """The file whole (200) or one range of it (206), streamed."""
    first, last, status = 0, size - 1, 200
    if "Range" in request.headers:
        wanted = _RANGE_RE.match(request.headers["Range"])
        if wanted is not None:
            first = int(wanted.group(1))
            last = min(int(wanted.group(2)), size - 1) if wanted.group(2) else size - 1
            if first >= size or first > last:
                return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
            status = 206
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    headers["Content-Length"] = str(last - first + 1)
    response = web.StreamResponse(status=status, headers=headers)
    await response.prepare(request)
    if request.method != "HEAD":
        for piece in _read(disk, first, last):
            await response.write(piece)
            sent[kind] += len(piece)
    await response.write_eof()
    return response


def _read(disk: Path, first: int, last: int) -> Iterator[bytes]:
    with disk.open("rb") as f:
        f.seek(first)
        left = last + 1 - first
        while left > 0 and (piece := f.read(min(256 * 1024, left))):
            left -= len(piece)
            yield piece


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dir", type=Path, required=True, help="models/ and datasets/ of repositories"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--public-port", type=int, help="the port in the URLs it hands out (default --port)"
    )
    parser.add_argument(
        "--cert", type=Path, required=True, help="PEM certificate chain for every host name"
    )
    parser.add_argument("--key", type=Path, required=True, help="PEM private key")
    parser.add_argument("--hub-host", default="hub.hf.co")
    parser.add_argument("--cas-host", default="cas-server.xethub.hf.co")
    parser.add_argument("--cdn-host", default="cas-bridge.xethub.hf.co")
    parser.add_argument("--lfs-host", default="cdn-lfs.hf.co")
    parser.add_argument(
        "--expiry", type=float, default=EXPIRY, help="seconds tokens and URLs are valid"
    )
    parser.add_argument(
        "--plain-max", type=int, default=PLAIN_MAX, help="largest plain git file, bytes"
    )
    parser.add_argument(
        "--no-xet", default="", help="comma-separated globs of LFS files not in Xet"
    )
    parser.add_argument("--chunk-size", type=int, default=xet.CHUNK_SIZE, help="bytes per chunk")
    parser.add_argument("--xorb-size", type=int, default=xet.XORB_SIZE, help="most bytes per xorb")
    parser.add_argument(
        "--xorb-dir", type=Path, help="where xorbs are written (default: a temporary directory)"
    )
    parser.add_argument("--access-log", action="store_true", help="a JSON line per request")
    parser.add_argument(
        "--multirange", action="store_true", help="v2: one URL per xorb, signed for all its ranges"
    )
    args = parser.parse_args()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    xorb_dir = args.xorb_dir or Path(tempfile.mkdtemp(prefix="hub-xorbs-"))
    store = xet.Store(xorb_dir, args.chunk_size, args.xorb_size)
    no_xet = [glob for glob in args.no_xet.split(",") if glob]
    repos = load_repos(args.dir, store, args.plain_max, no_xet)
    hosts = Hosts(
        args.hub_host, args.cas_host, args.cdn_host, args.lfs_host, args.public_port or args.port
    )
    hub = Hub(repos, store, hosts, Signer(args.expiry), args.access_log, args.multirange)
    print(
        json.dumps({"listening": f"{args.host}:{args.port}", "xorbs": len(store.xorbs)}), flush=True
    )
    web.run_app(
        hub.app(), host=args.host, port=args.port, ssl_context=context, print=None, access_log=None
    )


if __name__ == "__main__":
    main()
