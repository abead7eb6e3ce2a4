"""A minimal HTTP/1.1 client connection that pipelines: the load generator's transport.

Why not aiohttp's client: it never pipelines (one request in flight per connection) and costs
more CPU per request than the servers it measures can afford to lose on a small machine.
This client writes each request the moment it is asked for and matches answers to requests
in order (HTTP/1.1 answers pipelined requests in the order received), so ``--clients 64
--conns 8`` keeps 64 requests in flight over 8 persistent connections.

Contract: ``await Connection.open(host, port, ssl=context)`` (``ssl``: an
``ssl.SSLContext`` for https, None for plain HTTP); ``await conn.request(raw)`` sends one fully
encoded request (``encode_request``) and returns ``(status, body)``. Bodies framed by
``Content-Length`` or ``Transfer-Encoding: chunked`` are understood; nothing else is needed
for the JSON answers of etcd's gateway and of raftkv. A lost connection fails every request
in flight with ``ConnectionError``; the caller opens a new one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque


def encode_request(
    method: str,
    path: str,
    host: str,
    body: bytes = b"",
    content_type: str = "application/json",
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    for name, value in headers:  # e.g. Authorization (etcd v3 auth token)
        head += f"{name}: {value}\r\n"
    if body or method in ("POST", "PUT"):
        head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiters: deque[asyncio.Future] = deque()
        self.sent_at: deque[float] = deque()  # time.monotonic() of each request in flight
        self.buf = bytearray()
        self.closed: Exception | None = None
        # parse state of the answer at the head of the buffer
        self._status = 0
        self._need = -1  # body bytes still expected (Content-Length framing)
        self._chunked = False
        self._chunks: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.closed is None:
            self.closed = exc or ConnectionError("connection closed by the server")
        self.sent_at.clear()
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(ConnectionError(str(self.closed)))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            while self._parse_one():
                pass
        except ValueError as exc:  # a malformed answer: nothing after it can be trusted
            self.connection_lost(exc)
            if self.transport is not None:
                self.transport.close()

    def _parse_one(self) -> bool:
        buf = self.buf
        if self._status == 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return False
            lines = bytes(buf[:end]).split(b"\r\n")
            del buf[: end + 4]
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise ValueError(f"not an HTTP/1.x answer: {lines[0][:60]!r}")
            self._status = int(parts[1])
            self._need, self._chunked = 0, False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    self._need = int(value.strip())
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    self._chunked = True
            if 100 <= self._status < 200:  # an interim answer: the real one follows
                self._status = 0
                return True
        if self._chunked:
            return self._parse_chunks()
        if len(buf) < self._need:
            return False
        body = bytes(buf[: self._need])
        del buf[: self._need]
        self._finish(body)
        return True

    def _parse_chunks(self) -> bool:
        buf = self.buf
        while True:
            eol = buf.find(b"\r\n")
            if eol < 0:
                return False
            size = int(bytes(buf[:eol]).split(b";")[0], 16)
            if size == 0:
                end = buf.find(b"\r\n\r\n", eol)  # (no trailers expected) final CRLF
                if end < 0:
                    return False
                del buf[: end + 4]
                self._finish(b"".join(self._chunks))
                self._chunks = []
                return True
            if len(buf) < eol + 2 + size + 2:
                return False
            self._chunks.append(bytes(buf[eol + 2 : eol + 2 + size]))
            del buf[: eol + 2 + size + 2]

    def _finish(self, body: bytes) -> None:
        status, self._status = self._status, 0
        if not self.waiters:
            raise ValueError("an answer nobody asked for")
        fut = self.waiters.popleft()
        self.sent_at.popleft()
        if not fut.done():
            fut.set_result((status, body))


class Connection:
    """One persistent, pipelining HTTP/1.1 connection."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._p = protocol

    @classmethod
    async def open(cls, host: str, port: int, ssl=None) -> Connection:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(_Protocol, host, port, ssl=ssl)
        return cls(transport, protocol)

    @property
    def closed(self) -> bool:
        return self._p.closed is not None

    @property
    def in_flight(self) -> int:
        return len(self._p.waiters)

    def request(self, raw: bytes) -> asyncio.Future:
        """Send ``raw`` now; the future gets ``(status, body)``."""
        p = self._p
        fut = asyncio.get_running_loop().create_future()
        if p.closed is not None:
            fut.set_exception(ConnectionError(str(p.closed)))
            return fut
        p.waiters.append(fut)
        p.sent_at.append(time.monotonic())
        self._transport.write(raw)
        return fut

    def oldest_age(self, now: float) -> float:
        """Seconds the oldest request in flight has waited (0 when none is)."""
        sent = self._p.sent_at
        return now - sent[0] if sent else 0.0

    def abort(self, reason: str) -> None:
        """Fail every request in flight with ``ConnectionError(reason)`` and close."""
        if self._p.closed is None:
            self._p.connection_lost(ConnectionError(reason))
        self.close()

    def close(self) -> None:
        self._transport.close()
