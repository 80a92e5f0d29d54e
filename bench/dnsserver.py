"""A tiny DNS server for pod runs and benchmarks: A records from a dict, over UDP (RFC 1035).

The pod's cluster DNS, as far as the tests and benchmarks need one: with the hostAliases
capture the sidecar resolves origins through DNS only (never /etc/hosts, which maps them
to itself), so the origin's name must be in DNS. Names in the dict get their A record;
other types for those names get an empty answer; every other name is NXDOMAIN.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Mapping

_A, _IN = 1, 1
_NXDOMAIN = 3


def _question(query: bytes) -> tuple[str, int, int]:
    """(name, type, offset just past the question) of a query's first question."""
    labels, offset = [], 12
    while query[offset]:
        length = query[offset]
        labels.append(query[offset + 1 : offset + 1 + length].decode("ascii").lower())
        offset += 1 + length
    qtype, _qclass = struct.unpack("!HH", query[offset + 1 : offset + 5])
    return ".".join(labels), qtype, offset + 5


def answer(query: bytes, records: Mapping[str, str]) -> bytes:
    """The response to one query."""
    (ident,) = struct.unpack("!H", query[:2])
    name, qtype, end = _question(query)
    address = records.get(name.rstrip("."))
    rcode = 0 if address is not None else _NXDOMAIN
    answers = b""
    if address is not None and qtype == _A:
        # A pointer to the question's name (offset 12), then TTL 60 and the address.
        answers = struct.pack("!HHHIH", 0xC00C, _A, _IN, 60, 4) + socket.inet_aton(address)
    flags = 0x8180 | rcode  # a response, recursion desired and available
    header = struct.pack("!HHHHHH", ident, flags, 1, 1 if answers else 0, 0, 0)
    return header + query[12:end] + answers


class DnsServer:
    """Answers on a bound UDP socket in a daemon thread until `close()`."""

    def __init__(self, sock: socket.socket, records: Mapping[str, str]) -> None:
        self._sock = sock
        self._records = dict(records)
        self._stop = threading.Event()
        # Closing a socket does not wake a thread blocked on it: poll for the stop.
        self._sock.settimeout(0.1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, client = self._sock.recvfrom(512)
            except TimeoutError:
                continue
            try:
                self._sock.sendto(answer(query, self._records), client)
            except (IndexError, UnicodeDecodeError, struct.error):
                continue  # not a query we can read: no answer, as from a lossy network

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
