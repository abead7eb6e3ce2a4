"""``raftkv bench --protocol grpc-lean``: etcd's KV calls from a lean HTTP/2 client of ours.

The same calls as ``--protocol grpc`` (``GrpcWorkload``: the same messages, keys and values),
framed by hand instead of by grpc.aio. grpc.aio costs the load generator about as much CPU
per call as the server being measured spends; on a small machine the load generator then
takes half the cores and caps what a server can show. This client costs a fraction of that,
so more of the machine goes to the server, which is what a benchmark of the server wants.

What it does, per connection (``--conns`` of them, as for ``grpc``):

- the HTTP/2 preface and SETTINGS (a 16 MiB stream window, no push), a 16 MiB connection
  window, SETTINGS and PING acknowledged;
- a call is one HEADERS frame, a constant header block per method (literals, never indexed:
  ``:path``, ``:authority``, ``content-type``, ``te``, ``grpc-timeout`` from ``--timeout``,
  and the ``token`` of ``--user``), and one DATA frame with the message and END_STREAM;
  the frames of one loop turn leave in one write;
- the connection's send window is kept: calls wait while it is spent. A message bigger than
  a stream's window is refused (``BenchError``): the workloads' messages are small;
- the server's header blocks are decoded in order (``HeaderDecoder``: the peer's table is
  state); a call ends at the block with END_STREAM, with its ``grpc-status`` and
  ``grpc-message``. The answer's DATA is counted for the window, not parsed;
- RST_STREAM fails its call, GOAWAY and a lost connection fail every call in flight (each
  counted as an error, as with grpc.aio), and a call past ``--timeout`` fails.

Plain-TCP endpoints only: ``https://`` is refused with a clear error (use ``grpc``).
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import unquote, urlsplit

import grpc

from kvserver.api.grpc import h2
from kvserver.api.grpc.h2 import FRAME, U32, HeaderDecoder
from kvserver.bench.grpc_client import GrpcWorkload
from kvserver.bench.result import BenchError
from kvserver.bench.workloads import BenchOptions, parse_endpoint

WINDOW = 16 * 1024 * 1024
MAX_HEADER_LIST = 1024 * 1024
_CODE_NAMES = {str(code.value[0]): code.name for code in grpc.StatusCode}


class CallFailed(Exception):
    pass


class LeanConnection(asyncio.Protocol):
    """One HTTP/2 connection carrying calls (see the module docstring)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.decoder = HeaderDecoder(MAX_HEADER_LIST)
        self.next_sid = 1
        self.pending: dict[int, tuple[asyncio.Future[tuple[str, str]], float]] = {}
        self.send_window = h2.DEFAULT_WINDOW
        self.stream_window = h2.DEFAULT_WINDOW  # the server's initial window per stream
        self.window_open: asyncio.Event = asyncio.Event()
        self.window_open.set()
        self.recv_unacked = 0
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.header_block: tuple[int, int, bytearray] | None = None  # sid, flags, block so far
        self.ready: asyncio.Future[None] = self.loop.create_future()  # the server's SETTINGS
        self.failed: str | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(  # type: ignore[attr-defined]
            h2.PREFACE
            + h2.settings_frame(
                {h2.SETTINGS_ENABLE_PUSH: 0, h2.SETTINGS_INITIAL_WINDOW_SIZE: WINDOW}
            )
            + h2.window_update(0, WINDOW - h2.DEFAULT_WINDOW)
        )

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        pos, end = 0, len(buffer)
        try:
            while end - pos >= 9:
                length_type, flags, sid = FRAME.unpack_from(buffer, pos)
                length = length_type >> 8
                if end - pos - 9 < length:
                    break
                payload = bytes(buffer[pos + 9 : pos + 9 + length])
                pos += 9 + length
                self._frame(length_type & 0xFF, flags, sid & 0x7FFFFFFF, payload)
        except h2.ConnectionError_ as exc:
            self._fail_all(f"connection: {exc}")
            if self.transport is not None:
                self.transport.close()
        finally:
            del buffer[:pos]
        if self.recv_unacked >= WINDOW // 4:
            self.out.append(h2.window_update(0, self.recv_unacked))
            self.recv_unacked = 0
            self._schedule_flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(f"connection: lost ({exc or 'closed by the server'})")
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("closed before its SETTINGS"))

    # --- frames ----------------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == h2.HEADERS or kind == h2.CONTINUATION:
            self._header_frame(kind, flags, sid, payload)
        elif kind == h2.DATA:
            self.recv_unacked += len(payload)
        elif kind == h2.SETTINGS:
            if not flags & h2.ACK:
                self._settings(payload)
        elif kind == h2.WINDOW_UPDATE:
            if sid == 0:
                self.send_window += U32.unpack(payload)[0] & 0x7FFFFFFF
                if self.send_window > 0:
                    self.window_open.set()
        elif kind == h2.PING:
            if not flags & h2.ACK:
                self.out.append(h2.frame(h2.PING, h2.ACK, 0, payload))
                self._schedule_flush()
        elif kind == h2.RST_STREAM:
            self._end(sid, None, f"RST_STREAM {U32.unpack(payload)[0]}")
        elif kind == h2.GOAWAY:
            self.failed = "connection: GOAWAY"
            self._fail_all(self.failed)

    def _header_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == h2.HEADERS:
            if flags & h2.PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & h2.PRIORITY_FLAG:
                payload = payload[5:]
            self.header_block = (sid, flags, bytearray(payload))
        elif self.header_block is None:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "CONTINUATION out of place")
        else:
            self.header_block[2].extend(payload)
        if flags & h2.END_HEADERS:
            self._header_block_done()

    def _settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            key, value = h2.SETTING.unpack_from(payload, i)
            if key == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                self.stream_window = value
        self.out.append(h2.frame(h2.SETTINGS, h2.ACK, 0))
        self._schedule_flush()
        if not self.ready.done():
            self.ready.set_result(None)

    def _header_block_done(self) -> None:
        assert self.header_block is not None
        sid, flags, block = self.header_block
        self.header_block = None
        headers = self.decoder.decode(bytes(block))  # always: it keeps the table in step
        if not flags & h2.END_STREAM:
            return  # the answer's headers; its trailers end the call
        status, message = "", ""
        for name, value in headers:
            if name == "grpc-status":
                status = value
            elif name == "grpc-message":
                message = unquote(value)
        self._end(sid, status, message)

    def _end(self, sid: int, status: str | None, message: str) -> None:
        entry = self.pending.pop(sid, None)
        if entry is None or entry[0].done():
            return
        if status is None:
            entry[0].set_exception(CallFailed(message))
        else:
            entry[0].set_result((status, message))

    def _fail_all(self, why: str) -> None:
        pending, self.pending = self.pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(CallFailed(why))
        self.window_open.set()

    # --- calls -----------------------------------------------------------------------------------

    async def call(self, block: bytes, message: bytes) -> tuple[str, str]:
        data = b"\x00" + U32.pack(len(message)) + message
        if len(data) > min(self.stream_window, h2.DEFAULT_MAX_FRAME):
            raise BenchError(
                f"--protocol grpc-lean sends messages up to {h2.DEFAULT_MAX_FRAME - 5} bytes"
            )
        while self.send_window < len(data):
            if self.failed is not None or self.transport is None or self.transport.is_closing():
                raise CallFailed(self.failed or "connection: closed")
            self.window_open.clear()
            await self.window_open.wait()
        if self.failed is not None:
            raise CallFailed(self.failed)
        self.send_window -= len(data)
        sid = self.next_sid
        self.next_sid += 2
        future: asyncio.Future[tuple[str, str]] = self.loop.create_future()
        self.pending[sid] = (future, time.monotonic())
        self.out.append(
            FRAME.pack((len(block) << 8) | h2.HEADERS, h2.END_HEADERS, sid)
            + block
            + FRAME.pack((len(data) << 8) | h2.DATA, h2.END_STREAM, sid)
            + data
        )
        self._schedule_flush()
        return await future

    def expire(self, now: float, timeout_s: float) -> None:
        late = [sid for sid, (_, sent) in self.pending.items() if now - sent > timeout_s]
        for sid in late:
            self._end(sid, None, f"timed out after {timeout_s:g} s")
            self.out.append(h2.rst_stream(sid, h2.CANCEL))
        if late:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        out, self.out = self.out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))


def request_block(path: str, authority: str, timeout_s: float, token: str | None) -> bytes:
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", f"{max(1, int(timeout_s * 1000))}m"),
    ]
    if token:
        headers.append(("token", token))
    return h2.encode_headers(headers)


class LeanGrpcTransport:
    """The runner's transport over this client (see the module docstring)."""

    def __init__(
        self, opts: BenchOptions, index: int, procs: int, conns: int, endpoints: list[str]
    ) -> None:
        self.opts = opts
        self.timeout_s = opts.timeout_s
        self.urls = [endpoints[(index + j * procs) % len(endpoints)] for j in range(conns)]
        self.workloads = [GrpcWorkload(opts, index, procs) for _ in range(conns)]
        self.conns: list[LeanConnection] = []
        self.blocks: list[dict[str, bytes]] = []

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        for url in self.urls:
            if urlsplit(url).scheme == "https":
                raise BenchError("--protocol grpc-lean speaks plain TCP only; use grpc for TLS")
            host, port = parse_endpoint(url)
            try:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(LeanConnection, host, port), self.timeout_s
                )
                await asyncio.wait_for(conn.ready, self.timeout_s)
            except (OSError, TimeoutError, ConnectionError) as exc:
                raise BenchError(f"cannot connect: {url} does not answer gRPC ({exc})") from None
            self.conns.append(conn)
            authority = f"{host}:{port}"
            self.blocks.append(
                {
                    method: request_block(
                        f"/etcdserverpb.KV/{method}", authority, self.timeout_s, self.opts.token
                    )
                    for method in ("Put", "Range", "Txn")
                }
            )

    async def send(self, ci: int, seq: int) -> tuple[str, float | None, str | None]:
        j = ci % len(self.conns)
        call = self.workloads[j].next(seq)
        started = time.monotonic()
        try:
            status, message = await self.conns[j].call(
                self.blocks[j][call.method], call.message.SerializeToString()
            )
        except CallFailed as exc:
            return call.kind, None, str(exc)
        if status == "0":
            return call.kind, time.monotonic() - started, None
        name = _CODE_NAMES.get(status, status or "?")
        return call.kind, None, f"gRPC {name}" + (f": {message[:100]}" if message else "")

    def expire(self, now: float) -> None:
        for conn in self.conns:
            conn.expire(now, self.timeout_s)

    async def close(self) -> None:
        for conn in self.conns:
            if conn.transport is not None:
                conn.transport.close()
