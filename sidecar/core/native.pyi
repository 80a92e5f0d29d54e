"""The Rust core's API as Python sees it (`sidecar/core/src/`)."""

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

HELLO_PEEK: int
SHARED_LOCK_BYTES: int
CLAIM_SLOTS: int  # claims the table holds at once
CLAIM_WINDOW: int  # slots a key's claim may take, from the one its digest names
REQUEST_PEEK: int
TLS_HANDSHAKE_RECORD: bytes  # the first byte of every TLS connection
HANDSHAKE_DONE: int
WANTS_READ: int
WANTS_WRITE: int

class CertificateRejected(OSError):
    """The origin's certificate failed verification: the handshake was refused."""

class Truncated(OSError):
    """The origin closed the connection without TLS's closure alert (RFC 9112 §9.8)."""

class ClientTls:
    """The client side of TLS towards origins: certificates are verified against the
    roots in `roots_pem` (and only those), and `alpn` is offered; ValueError if it holds
    no certificate rustls can read."""

    def __init__(self, roots_pem: bytes, alpn: list[bytes] = ...) -> None: ...

class TlsConfig:
    """The server side of TLS for one intercepted host: its leaf chain (leaf first) and
    key, in PEM; ValueError if they cannot be read."""

    def __init__(self, chain_pem: bytes, key_pem: bytes) -> None: ...

class SharedLock:
    """The lock of the shared memory file `fd`, SHARED_LOCK_BYTES at byte `at` (made there
    first with `create`, once, before any other process maps it): process-shared, robust
    (a holder that dies leaves it to the next) and recursive; `with lock:` holds it,
    waiting without the GIL while another process does. ValueError if it does not fit
    the file; OSError if the system refuses it."""

    def __init__(self, fd: int, at: int, create: bool = False) -> None: ...
    def __enter__(self) -> None: ...
    def __exit__(self, kind: object, error: object, trace: object) -> None: ...

class KeyRules:
    """The buffer's key of a URL, the rule `sidecar.cache.policy.cache_key` states: a
    plain URL (a lower-case scheme, a host name, maybe a port, a path and query of
    printable ASCII) is read here; any other is split by the caller (`key_of_parts`).
    `families`: each signing family's lower-case parameter names and name prefixes;
    `family_of(host)`: the index of the family a lower-case host belongs to, or None
    (should it raise, the error is reported as unraisable and the host has none)."""

    def __init__(
        self,
        families: list[tuple[list[str], list[str]]],
        family_of: Callable[[str], int | None],
    ) -> None: ...
    def key(self, url: str) -> str | None:
        """The key of a plain URL; None for any other."""
    def key_of_parts(
        self, scheme: str, host: str, port: int | None, path: str, query: str
    ) -> str:
        """The key of a URL split elsewhere: `host` lower-case, no trailing dot."""

class JudgeRules:
    """What a fill keeps of an origin's response in the common case (a 200 of HTTP/1.x
    with one Content-Length of digits, at most one Date, Last-Modified and ETag, those
    dates IMF-fixdates, a Connection of tokens, and no Transfer-Encoding,
    Content-Encoding, Vary, Cache-Control, Expires or Age): never replaying the fields
    in `not_replayed` (lower-case) or beginning with `not_replayed_prefix`, never
    relaying those in `not_relayed`."""

    def __init__(
        self, not_replayed: list[str], not_replayed_prefix: str, not_relayed: list[str]
    ) -> None: ...
    def judge(
        self,
        status: int,
        version: str,
        lines: list[tuple[str, str]],
        requested: float,
        received: float,
    ) -> (
        tuple[
            int,
            tuple[tuple[str, str], ...],
            tuple[tuple[str, str], ...],
            str | None,
            str | None,
            float,
            float,
        ]
        | None
    ):
        """`policy.Kept`'s fields for this response, or None when it is not the common
        case (then Python's to judge)."""

def key_digest(key: bytes) -> bytes:
    """A key's digest, as the index and the table of answers name it: BLAKE2b, 16 bytes."""

def body_matches(fd: int, size: int, digest: str) -> bool:
    """Does the body open as `fd` have `size` bytes and this BLAKE3 `digest` (hex)?
    OSError if it cannot be read; without the GIL."""

def bodies_match(directory: str, bodies: list[tuple[str, int, str]]) -> list[bool]:
    """Which of `bodies` (file name in `directory`, size, digest) match: False for one
    that does not, or cannot be opened or read; without the GIL."""

class Claims:
    """Which worker fetches which key, and the room each fills alone
    (`sidecar.buffer.claims`): the claims and leases of `workers` workers in the region
    from byte `region` of the shared memory file `fd` (`size(workers)` bytes), each
    call made under the `SharedLock` at byte `lock`, and what it is given to call run
    holding it. Keys are named by their digest (`key_digest`)."""

    def __init__(self, fd: int, lock: int, region: int, workers: int) -> None: ...
    @staticmethod
    def size(workers: int) -> int: ...
    @property
    def commits(self) -> int: ...
    def claim(self, digest: bytes, worker: int) -> tuple[int, int] | None: ...
    def state(self, digest: bytes) -> int: ...
    def release(self, digest: bytes, worker: int, held: int) -> None: ...
    def commit(
        self, digest: bytes, worker: int, held: int, insert: Callable[[], object]
    ) -> bool: ...
    def announce(self, digest: bytes, worker: int, state: int) -> bool: ...
    def invalidate(self, digests: list[bytes]) -> None: ...
    def end(
        self, digest: bytes, worker: int, commit: Callable[[], object] | None = None
    ) -> bool: ...
    def running(self) -> int: ...
    def lease(self, worker: int) -> tuple[int, int, int, int]: ...
    def take(self, worker: int, charged: int) -> int | None: ...
    def grant(self, worker: int, amount: int) -> None: ...
    def fold(self) -> tuple[int, int]: ...
    def revoke(self) -> int: ...
    def forget(self, worker: int, settle: Callable[[int, int, int], object]) -> None: ...

class Answers:
    """The table of answers Python gave to plain GETs of stored objects, in the shared
    memory file `fd`: `size` bytes from byte `start`, entries for `objects` answers and
    an arena their heads and body files' names (in the directory `bodies`) share
    (ValueError if it is under 16 KiB or the table does not fit the file), found by
    their key's digest (`keys` gives a request's key), written only while the index
    generation word at byte `generation` is the one the answer was found under, under
    the `SharedLock` at byte `lock` (one writer at a time); `deciding`: the request
    fields a hit's decision reads (a request with any of them is never answered from
    it)."""

    def __init__(
        self,
        fd: int,
        generation: int,
        lock: int,
        start: int,
        size: int,
        objects: int,
        bodies: str,
        deciding: list[str],
        keys: KeyRules,
        track_touches: bool = False,
    ) -> None: ...
    def forget(self, digest: bytes) -> bool:
        """Forget the answer of the key whose digest this is, if any: its object was
        removed or changed, and the index generation bumped before. True if there was
        one."""
    def record(
        self,
        digest: bytes,
        head: bytes,
        name: bytes,
        size: int,
        born: float | None,
        generation: int,
    ) -> bool:
        """Record the answer to a GET with no deciding field of any URL whose key has
        this `digest` (`key_digest`): `head` the status line and fields up to the Age
        (each line with its CRLF), `name` and `size` the body file, `born` when the
        origin generated it (None: no Age), `generation` the one the object was found
        under; False if not recorded (the generation moved on since, among others)."""
    def touched(self) -> list[str]:
        """The keys this process answered from the table since the last call, with
        `track_touches` (else none)."""
    @property
    def displaced(self) -> int:
        """Answers this process made give way to others while still valid: the table is
        too small for the objects read (`--index-objects`)."""
    @property
    def hits(self) -> int:
        """Requests this process answered from the table."""
    @property
    def bytes(self) -> int:
        """Body bytes of those answers."""

def relayed_bytes() -> int:
    """Bytes this process's streams of bytes forwarded to one another (tunnels and
    upgraded connections, both ways)."""

def accept(listener: int) -> int:
    """A client accepted on the listening socket `listener`: its descriptor,
    non-blocking, close-on-exec, with the listener's options (TCP_NODELAY:
    `proxy.listeners`). BlockingIOError when none waits."""

def forwarded_request(head: bytes) -> bool | None:
    """Is what came first on the proxy port (`head`) a request for the proxy itself to
    forward, the lean server's? Anything but a request whose target is in origin form
    or asterisk form (which mitmproxy answers): an absolute-form request, or bytes whose
    request line the core's parser refuses. None while what came is a method and no
    target has begun."""

class Door:
    """A listener's door for plain HTTP: a client whose first bytes are a plain-HTTP
    request for the lean server (`forwarded_request` on the forward proxy; anything but
    TLS on a `captured` listener) is served by a stream from its accept on, the table
    `answers` first under `scope` (`Stream.answer_from`). Its stream calls `reception`:
    `protocol()` makes the lean server's protocol once the stream needs one (a request
    the table cannot answer, or one the parser refuses), `closed()` hears that the
    connection closed without ever needing it, `watch_stream(stream)` and
    `forget_stream(stream)` start and end the idle watch of a connection the table
    answered while it stays open."""

    def __init__(
        self,
        event_loop: asyncio.AbstractEventLoop,
        captured: bool,
        answers: Answers,
        scope: bytes,
        reception: Any,
    ) -> None: ...
    def serve(self, fd: int) -> bool:
        """Serve the accepted client `fd` if what it sent first is plain HTTP for the
        lean server: True if its stream took the socket over; False, the socket
        untouched and still the caller's, for anything else (or nothing yet)."""

class Arrival:
    """A client of the lean front end until its first request: the accepted socket `fd`
    (taken over), driven by `event_loop`. It peeks at what the client sends and asks
    `handler` at each step: `request(head)` (at most REQUEST_PEEK bytes waiting),
    `tunnelled(first)` (what came first inside the tunnel, at most HELLO_PEEK bytes),
    `secured()` (the handshake is done), `ended(error)` (the client left or the
    handshake failed; closed). The handler answers with the methods below. A `captured`
    connection (hostAliases, transparent) sends no CONNECT: `tunnelled(first)` comes
    first."""

    def __init__(
        self,
        fd: int,
        event_loop: asyncio.AbstractEventLoop,
        handler: Any,
        captured: bool = False,
    ) -> None: ...
    def start(self) -> None:
        """Look at what has come, and watch for the rest."""
    def readable(self) -> None: ...
    def writable(self) -> None: ...
    def peek_later(self, delay: float) -> None:
        """Peek again in `delay` seconds (part of what is needed has come)."""
    def answer_connect(self, head_length: int) -> None:
        """Take the CONNECT head, answer it, and wait for the tunnel's first bytes."""
    def secure(self, config: TlsConfig) -> None:
        """Start the server side of TLS on the hello that came; `secured` or `ended`
        follows."""
    def take_stream(self, protocol: object, requests: bool = False) -> Stream:
        """The connection as a stream (plain inside the tunnel, or secured; or a client
        of the forward proxy itself, its first request unread), started with `protocol`
        as `Stream.start` starts one."""
    def detach(self) -> int:
        """The socket, with what the client sent still in it."""
    def abort(self) -> None:
        """Close now; the handler hears nothing more."""

class Stream:
    """A connection: the socket `fd` (taken over), driven by `event_loop`, plain until
    `secure` starts the client side of TLS (towards an origin), or made by an `Arrival`
    or a `Door` (a client of the lean front end); the slice of `asyncio.Transport` its protocols
    use."""

    def __init__(self, fd: int, event_loop: asyncio.AbstractEventLoop) -> None: ...
    def secure(self, config: ClientTls, server_name: str) -> None:
        """Start the client side of TLS towards `server_name` (a DNS name or an IP
        address the certificate must name) on a plain stream with nothing queued."""
    def handshake(self) -> int:
        """One TLS handshake step: HANDSHAKE_DONE, WANTS_READ or WANTS_WRITE; OSError
        when it fails, CertificateRejected when the origin's certificate does not
        verify."""
    def alpn(self) -> bytes | None: ...
    def start(
        self, protocol: asyncio.Protocol, requests: bool = False, responses: bool = False
    ) -> None:
        """`protocol.connection_made(self)`, then read: with `requests`, the HTTP/1.1
        requests parsed from the bytes are handed over, each as
        `protocol.request_received(method, target, version, fields, hosts,
        transfer_encoding, keep_alive, upgrade, has_body)`, `body_received(data)` and
        `message_complete()`, or `request_refused(status, reason)` (then nothing more);
        with `responses`, the responses to the requests `expect_response` announces, as
        `protocol.response_received(version, status, reason, fields, transfer_encoding,
        keep_alive, until_close)`, `body_received(data)` and `message_complete()`, or
        `response_refused(reason)`, and `unasked_received()` for bytes past the last
        response (then nothing more); bytes that are not messages (after an upgrade's
        head, or without either) as `data_received(data)`."""
    def answer_from(self, answers: Answers, scope: bytes) -> None:
        """Answer the requests `answers` can without handing them to the protocol, while
        it has none to answer (`idle`). `scope`: the origin's URL up to the path (a
        tunnel's), its scheme alone (`http://`: a captured connection's requests' Host
        names it), or empty (the forward proxy's clients: each target is the URL)."""
    def idle(self) -> None:
        """The protocol has answered every request it was handed."""
    @property
    def answered_at(self) -> float:
        """When the table last answered on this connection (`time.monotonic()`; 0.0:
        never)."""
    def expect_response(self, method: str) -> None:
        """A request with `method` is about to be sent: its response is parsed next."""
    def forward_to(self, to: Stream, chunked: bool = False, head: bytes | None = None) -> None:
        """What this stream reads goes to `to`, not to the protocol, after `head` (in one
        write with the first of it): all its bytes (a stream of bytes), or the rest of
        the current response's body, in chunks of its own framing with `chunked` (the
        protocol still hears of its end). The protocol of `to` pauses this stream's
        reading while `to` is full."""
    def end_forward(self) -> None:
        """The body being forwarded ended with the connection (which the core's framing
        does not tell): send what is still owed, the head and the last chunk."""
    @property
    def forwarded(self) -> int:
        """Bytes forwarded so far (a body's without its framing)."""
    def readable(self) -> None: ...
    def writable(self) -> None: ...
    def write(self, data: bytes) -> None: ...
    def writelines(self, parts: Sequence[bytes]) -> None:
        """`parts` in order, as one write (a head and its first body bytes together)."""
    def send_file(self, head: bytes, fd: int, start: int, end: int) -> None:
        """Send `head`, then bytes [start, end) of file `fd`, which the stream takes over."""
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def is_reading(self) -> bool: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...
    def is_closing(self) -> bool: ...
    def can_write_eof(self) -> bool: ...
    def write_eof(self) -> None: ...
    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        """Hand the connection to another protocol, which gets bytes."""
    def get_protocol(self) -> asyncio.BaseProtocol: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...
    def get_write_buffer_size(self) -> int: ...
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...
    def fileno(self) -> int: ...

class Tee:
    """A body on its way from an origin into the buffer, its digest (as `Digest`'s)
    taken as it arrives, and sent on at once to the clients that follow it: a small one
    kept whole in memory, a larger one written into its partial file."""

    def __init__(self, size: int, fd: int | None = None, cap: int | None = None) -> None:
        """`fd`: the partial file, written at each piece's place (the tee keeps a
        descriptor of its own); `cap`: followers get no byte at or past it until
        `publish` (None: the whole body)."""
    def take_body(self, stream: Stream) -> None:
        """The rest of the body of the response `stream` is reading comes into this tee,
        not to the stream's protocol (which still hears of its end)."""
    def write(self, data: bytes) -> None:
        """The body's next bytes (those that came before the origin's stream fed it);
        all of a small body at once is kept as this very object, not copied."""
    def follow(self, stream: Stream, head: bytes, start: int, end: int) -> None:
        """Send `head` on `stream`, then bytes [start, end) of the body as they arrive."""
    def publish(self, n: int) -> None:
        """Followers may have the body's bytes up to `n`, which the file holds (the last
        byte at the commit, or bytes other connections wrote); nothing for a body kept
        in memory."""
    def stop_at(self, n: int) -> None:
        """Write no byte of the body at or past `n` (the rest goes over other
        connections)."""
    on_progress: Callable[[int], None] | None
    """Told how many bytes are written, after each piece a larger body's tee writes."""
    @property
    def received(self) -> int: ...
    @property
    def published(self) -> int:
        """How many bytes of the body its followers have been offered."""
    @property
    def error(self) -> str | None:
        """Why the file could not be written, if it could not (the tee stops there)."""
    def body(self) -> bytes | None:
        """The whole body kept in memory; None while some is missing, or in a file."""
    def hexdigest(self) -> str | None:
        """The whole body's digest (hex); None while some is missing."""
    def digest(self) -> Digest:
        """The digest of the bytes received so far, to be continued."""

class Digest:
    """The digest stored bodies are checked against: BLAKE3, updated in order (without
    the GIL for large pieces)."""

    def __init__(self) -> None: ...
    def update(self, data: bytes) -> None: ...
    def hexdigest(self) -> str:
        """The digest of every byte so far, 64 lowercase hex digits."""

class Message:
    """One HTTP/1.1 message as the core's parser framed it (`frame`)."""

    method: str
    """A request's; empty for a response."""
    target: bytes
    version: str
    """As the start line gave it: `1.1`, `1.0`, `0.9` for a request line without one."""
    status: int
    """A response's; 0 for a request."""
    reason: str
    fields: list[tuple[str, str]]
    """Names as sent, values without surrounding whitespace, both Latin-1."""
    keep_alive: bool
    upgrade: bool
    """A request's upgrade; a response's 101."""
    until_close: bool
    """A response whose body the connection's end delimits."""
    body: bytes
    end: int | None
    """The offset, in all the bytes fed, just past the message's last byte; None while
    it has not ended."""

class Framed:
    """What the core's parser made of the bytes `frame` fed it."""

    messages: list[Message]
    refused: tuple[int, str] | None
    """The status and the reason of the refusal that ended the reading, if one did."""
    stopped: bool
    """Nothing more would be read (an upgrade, a CONNECT, a message that closes the
    connection, a refusal)."""
    rest: bytes
    """The bytes not read."""

def frame(pieces: Sequence[bytes], responses: bool = False) -> Framed:
    """The requests (or, with `responses`, the responses to GETs, each sent as soon as
    the response before ended) that `pieces`, received one after the other, make: the
    core's parser for the tests, which nothing of the sidecar calls."""
