"""The shared second tier: misses fetched through parent caches (Squid) of the cluster.

A parent is an HTTP cache shared by every pod, so a 100-pod job pulls each object from
its origin once. The sidecar sends it an absolute-form request for the https URL
(`GET https://host/path HTTP/1.1` on a plain or TLS connection to the parent, never
CONNECT); the parent fetches the origin over TLS, verifying it, and keeps the body.

What may go there (`bypass_reason()`): the parent is a *shared* cache, so RFC 9111
applies in full. A request with credentials never goes there: `Authorization`
(§3.5: a shared cache must not reuse its response), `Cookie`, or a URL signing
parameter (a pre-signed S3/GCS/Azure/CloudFront URL is a bearer credential, and the
parent would key on it and could answer it after it expired); nor do conditional
requests (a revalidation is a question for the origin) and methods other than GET and
HEAD. A response the parent answers with `Cache-Control: private` or `no-store` (which
a shared cache must not store) is relayed, and its object is fetched from the origin
directly from then on.

Which parent: rendezvous hashing of the cache key (`sidecar.origins.rendezvous`), so each
object lives in one parent. A `--parent` whose name resolves to several addresses
(a headless Service) is one parent per address.

The parent never becomes a single point of failure: unreachable, no first byte within
`--parent-timeout`, a 5xx, or a body that breaks off -> that request goes to the
origin directly (a fill resumes there with Range + If-Range, see `sidecar.buffer.segments`),
and the parent is skipped for a backoff that doubles on each failure up to a cap.
Failures are counted by reason; the state change is logged once each way. A request
Squid answers with its own error page (its ACL refuses it, or it cannot reach or verify
that origin) also goes to the origin, without a backoff.

What one worker learns, every worker knows: a parent's failure or recovery and an
object answered privately are told to the others (`News`, relayed by the main
process), so a dead parent costs one timeout per backoff, not one per worker.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from sidecar.cache import policy
from sidecar.metrics import Metrics
from sidecar.origins import rendezvous
from sidecar.wire import tls
from sidecar.wire.client import Pool, Response, UpstreamError, parent_route
from sidecar.wire.fields import Headers, cache_directives, header

logger = logging.getLogger(__name__)

# A parent that failed is skipped this long, doubled on each further failure up to the cap.
BACKOFF_MIN = 5.0  # seconds
BACKOFF_MAX = 300.0  # seconds
# Names of --parent are resolved again this often (a headless Service gains and loses pods).
RESOLVE_INTERVAL = 30.0  # seconds
# Objects found private or no-store through a parent, remembered to go direct next time.
REMEMBERED_PRIVATE = 10_000

# Marks a response that Squid made itself (an error page), not one from the origin.
_SQUID_ERROR = "X-Squid-Error"
_CREDENTIAL_FIELDS = ("Authorization", "Cookie")
_CONDITIONAL_FIELDS = ("If-None-Match", "If-Modified-Since")
# Query parameters that carry a signature or credential, on any host: S3 SigV4 and V2,
# GCS V4 and V2, Azure SAS (`sig`), CloudFront signed URLs. Expiry or date parameters
# alone are not credentials.
_SIGNED_QUERY = frozenset(
    "x-amz-signature x-amz-credential x-amz-security-token awsaccesskeyid"
    " x-goog-signature x-goog-credential googleaccessid signature sig key-pair-id".split()
)

# What a worker tells the others about the parent tier: `{parent, up, skip_until,
# backoff}` (a parent's health; `skip_until` on the monotonic clock, which every
# process of the pod shares) or `{private}` (a key the parents must not be asked for).
News = dict[str, Any]


def bypass_reason(method: str, headers: Iterable[tuple[str, str]], url: str) -> str | None:
    """Why this request must not go through a shared parent; None if it may."""
    if method not in ("GET", "HEAD"):
        return "method"
    fields = list(headers)
    if any(header(fields, name) is not None for name in _CREDENTIAL_FIELDS):
        return "credentials"
    if any(name.lower() in _SIGNED_QUERY for name, _ in parse_qsl(urlsplit(url).query, True)):
        return "signed-url"
    if any(header(fields, name) is not None for name in _CONDITIONAL_FIELDS):
        return "conditional"
    return None


def shared_may_store(headers: Headers) -> bool:
    """RFC 9111 §5.2.2.5 and §5.2.2.7: no-store, and private for a shared cache."""
    directives = cache_directives(headers)
    return "no-store" not in directives and "private" not in directives


@dataclass
class Health:
    """Whether a parent is used, and for how long it is skipped after a failure."""

    up: bool = True
    skip_until: float = 0.0  # monotonic seconds
    backoff: float = 0.0  # the last backoff; 0 while up

    def usable(self, now: float) -> bool:
        return now >= self.skip_until

    def failed(self, now: float) -> bool:
        """Skip the parent for a while; True if it was up until now."""
        self.backoff = min(self.backoff * 2, BACKOFF_MAX) if self.backoff else BACKOFF_MIN
        self.skip_until = now + self.backoff
        was_up, self.up = self.up, False
        return was_up

    def succeeded(self) -> bool:
        """Use the parent again; True if it was down until now."""
        was_down = not self.up
        self.up, self.backoff, self.skip_until = True, 0.0, 0.0
        return was_down

    def news(self) -> News:
        return {"up": self.up, "skip_until": self.skip_until, "backoff": self.backoff}

    def adopt(self, news: News) -> None:
        """Take what another worker found (it asked the parent last)."""
        self.up = bool(news["up"])
        self.skip_until = float(news["skip_until"])
        self.backoff = float(news["backoff"])


@dataclass
class Parent:
    """One parent cache: its name for hashing and metrics, and its own connections."""

    name: str
    url: str  # what requests are sent to (the --parent URL)
    address: str | None  # where it is reached (None: its name did not resolve)
    health: Health = field(default_factory=Health)


def expand(
    urls: Sequence[str], addresses: dict[str, list[str]]
) -> list[tuple[str, str, str | None]]:
    """(name, url, address) of every parent: a URL whose name resolved to several
    addresses is one parent per address, named by it; any other is one parent, at the
    address its name resolved to (None: it did not resolve, try again on connecting)."""
    parents: list[tuple[str, str, str | None]] = []
    for url in urls:
        found = addresses.get(url, [])
        if len(found) <= 1:
            parents.append((url, url, found[0] if found else None))
            continue
        parts = urlsplit(url)
        for address in found:
            host = f"[{address}]" if ":" in address else address
            name = f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
            parents.append((name, url, address))
    return parents


class Parents:
    """The parent tier of one worker: routing, fetching and failure handling."""

    def __init__(
        self,
        urls: Sequence[str],
        trust_file: Path,
        first_byte_timeout: float,
        pool: Pool,
        metrics: Metrics,
        tell: Callable[[News], None] = lambda news: None,
    ) -> None:
        """`trust_file`: CA certificates for https:// parents; `first_byte_timeout`: how
        long a parent may take to answer before the origin is asked instead; `pool`:
        the connections (a body that stalls past its read timeout is broken off);
        `tell`: how what this worker learns reaches the others (see `learn`)."""
        self._urls = list(urls)
        self._ssl = tls.client_config(trust_file)
        self._first_byte_timeout = first_byte_timeout
        self._pool = pool
        self._metrics = metrics
        self._tell = tell
        self._parents: dict[str, Parent] = {}
        self._private: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._via: weakref.WeakKeyDictionary[Response, Parent] = weakref.WeakKeyDictionary()
        self._resolving: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await self._resolve()
        self._resolving = asyncio.create_task(self._keep_resolving())

    async def close(self) -> None:
        if self._resolving is not None:
            self._resolving.cancel()

    def route(self, url: str, method: str, headers: Sequence[tuple[str, str]]) -> Parent | None:
        """The parent this request goes through; None: straight to the origin."""
        reason = bypass_reason(method, headers, url)
        try:
            key = policy.cache_key(url)
        except ValueError:
            reason = "not-http"
        if reason is None and key in self._private:
            reason = "private-response"
        if reason is not None:
            self._metrics.counters.parent_bypasses[reason] += 1
            return None
        parent = self._parents[rendezvous.choose(key, sorted(self._parents))]
        # A parent in backoff is not replaced by the next one: the object would then be
        # stored twice; the origin is the fallback.
        return parent if parent.health.usable(time.monotonic()) else None

    async def fetch(
        self, parent: Parent, url: str, headers: list[tuple[str, str]], method: str
    ) -> Response | None:
        """The parent's response; None when it failed (counted; go to the origin)."""
        self._metrics.counters.parent_requests += 1
        route = parent_route(parent.url, parent.address, self._ssl)
        try:
            async with asyncio.timeout(self._first_byte_timeout):
                response = await self._pool.request(route, method, url, headers)
        except TimeoutError:
            self._failed(parent, "timeout", f"no answer within {self._first_byte_timeout:g}s")
            return None
        except UpstreamError as e:
            self._failed(parent, "unreachable", str(e))
            return None
        if _SQUID_ERROR in response.headers:
            # Squid's own answer to this one request: its ACL does not forward to that
            # host (such as a pod's extra intercepted host), or it could not reach or
            # verify that origin. Not the origin's answer, and not a failing parent:
            # one bad origin must not take the parent away from every other.
            response.release()
            self._metrics.counters.parent_failures["refused"] += 1
            return None
        if response.status >= 500 or response.status == 407:
            response.release()
            reason = f"status-{response.status // 100}xx"
            self._failed(parent, reason, f"it answered {response.status}")
            return None
        if parent.health.succeeded():
            logger.info("parent %s: answering again; misses go through it", parent.name)
            self._publish()
            self._tell({"parent": parent.name, **parent.health.news()})
        if not shared_may_store(response.headers):
            key = policy.cache_key(url)
            self._remember_private(key)
            self._tell({"private": key})
        self._via[response] = parent
        return response

    def broke_off(self, response: Response) -> None:
        """A response's body stopped short: if it came from a parent, skip that parent."""
        parent = self._via.pop(response, None)
        if parent is not None:
            self._failed(parent, "broke-off", "a body from it broke off")

    def came_through_parent(self, response: Response) -> bool:
        return response in self._via

    def learn(self, news: News) -> None:
        """What another worker found out (told with its `tell`)."""
        if "private" in news:
            self._remember_private(news["private"])
        elif (parent := self._parents.get(news["parent"])) is not None:
            parent.health.adopt(news)
            self._publish()

    def _failed(self, parent: Parent, reason: str, detail: str) -> None:
        self._metrics.counters.parent_failures[reason] += 1
        if parent.health.failed(time.monotonic()):
            logger.warning(
                "parent %s failing (%s); fetching from origins directly, retrying it in %gs",
                parent.name,
                detail,
                parent.health.backoff,
            )
            self._publish()
        self._tell({"parent": parent.name, **parent.health.news()})

    def _remember_private(self, key: str) -> None:
        self._private[key] = None
        self._private.move_to_end(key)
        while len(self._private) > REMEMBERED_PRIVATE:
            self._private.popitem(last=False)

    def _publish(self) -> None:
        self._metrics.counters.parent_state = {
            name: int(parent.health.up) for name, parent in self._parents.items()
        }

    async def _keep_resolving(self) -> None:
        while True:
            await asyncio.sleep(RESOLVE_INTERVAL)
            await self._resolve()

    async def _resolve(self) -> None:
        """(Re)build the parents from what their names resolve to now, keeping the
        health of those that stay."""
        addresses = {url: await _addresses(url) for url in self._urls}
        wanted = expand(self._urls, addresses)
        before = set(self._parents)
        kept: dict[str, Parent] = {}
        for name, url, address in wanted:
            parent = self._parents.pop(name, None) or Parent(name, url, address)
            parent.address = address
            kept[name] = parent
        if set(kept) != before:
            logger.info("parents: %s", ", ".join(kept))
        self._parents = kept
        self._publish()


async def _addresses(url: str) -> list[str]:
    """The addresses a parent URL's name resolves to (none when it does not resolve)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return [host]
    except OSError:
        pass
    try:
        found: list[Any] = await asyncio.get_running_loop().getaddrinfo(
            host, parts.port or 80, type=socket.SOCK_STREAM
        )
    except OSError as e:
        logger.warning("parent %s: cannot resolve %s: %s", url, host, e)
        return []
    # One server on both IPv4 and IPv6 is one parent: the addresses of one family count.
    v4 = {entry[4][0] for entry in found if entry[0] == socket.AF_INET}
    return sorted(v4 or {entry[4][0] for entry in found})
