"""A client that speaks raw HTTP/2 frames to one in-memory ``GrpcConnection``, for tests.

``Client(settings)`` makes the connection over a ``MemoryTransport`` (whose client reads only
when told to, as on a socket the client does not read), sends the preface, and gives
``call(path, message)`` (HEADERS and DATA), ``send(frames)`` and ``answered()`` (everything
the server wrote). ``settle()`` lets the loop run a few turns.
"""

from __future__ import annotations

import asyncio
import struct

from hpack import Encoder

from kvserver.api.grpc import h2
from kvserver.api.grpc.connection import GrpcConnection, ServerSettings
from kvserver.api.grpc.rpc import ClientIdentity


class MemoryTransport:
    """A transport whose client reads only when ``read()`` is called: until then what the
    server writes stays in the write buffer, as on a socket the client does not read."""

    def __init__(self) -> None:
        self.unread = bytearray()
        self.received = bytearray()  # everything the client has read
        self.closed = False
        self.reading = True
        self.protocol: GrpcConnection | None = None

    def write(self, data: bytes) -> None:
        self.unread += data

    def read(self) -> bytes:
        data = bytes(self.unread)
        self.received += data
        self.unread.clear()
        if self.protocol is not None and self.protocol.paused:
            self.protocol.resume_writing()
        return data

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return len(self.unread)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed and self.protocol is not None:  # as a socket transport does
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)
        self.closed = True

    def abort(self) -> None:
        self.close()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name, default=None):
        return default


class Client:
    """The client's side: frames in, what the server answered out."""

    def __init__(self, settings: ServerSettings, *, initial_window: int | None = None):
        self.settings = settings
        self.encoder = Encoder()
        self.transport = MemoryTransport()
        self.conn = GrpcConnection(settings, ClientIdentity("127.0.0.1:9", None))
        self.transport.protocol = self.conn
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        body = b"" if initial_window is None else struct.pack(">HI", 0x4, initial_window)
        self.send(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0, body))
        self.next_sid = 1

    def send(self, data: bytes) -> None:
        if not self.transport.closed:
            self.conn.data_received(data)

    def headers(self, path: str, *, timeout: str | None = None) -> bytes:
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        if timeout is not None:
            fields.append(("grpc-timeout", timeout))
        return self.encoder.encode(fields)

    def call(self, path: str, message: bytes, *, end: bool = True, timeout: str | None = None):
        sid = self.next_sid
        self.next_sid += 2
        data = b"\x00" + struct.pack(">I", len(message)) + message
        self.send(
            h2.frame(h2.HEADERS, h2.END_HEADERS, sid, self.headers(path, timeout=timeout))
            + h2.frame(h2.DATA, h2.END_STREAM if end else 0, sid, data)
        )
        return sid

    def answered(self) -> bytes:
        self.conn.flush()
        return bytes(self.transport.received) + bytes(self.transport.unread)


async def settle(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)
