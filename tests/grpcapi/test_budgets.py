"""The HTTP/2 server's budgets (``kvserver.api.grpc.budgets``), met by hostile clients.

No sockets: each test drives one ``GrpcConnection`` with frames through ``data_received``
and reads what it wrote from an in-memory transport whose client reads only when told to.
Each checks the protocol's answer (a GOAWAY or RST_STREAM code, or a gRPC status), that the
budget's counter moved, and the bound itself (handlers started, bytes held).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import replace

import grpc

from kvserver.api.grpc import h2
from kvserver.api.grpc.budgets import Http2Limits
from kvserver.api.grpc.connection import GrpcConnection, ServerSettings
from kvserver.api.grpc.rpc import UNARY_STREAM, ClientIdentity, Method
from kvserver.etcdpb import rpc_pb2
from tests.grpcapi.memory_h2 import Client, MemoryTransport, settle
from tests.support.h2frames import frames, goaway_code

PUT = "/etcdserverpb.KV/Put"
BIG = "/etcdserverpb.KV/Range"
STREAMED = "/etcdserverpb.Maintenance/Snapshot"
WAITING = "/etcdserverpb.Maintenance/Wait"


class Handlers:
    def __init__(self) -> None:
        self.started = 0
        self.running = 0
        self.release = asyncio.Event()

    async def put(self, req, ctx):
        self.started += 1
        self.running += 1
        try:
            if req.key == b"slow":
                await asyncio.sleep(3600)
            if req.key == b"stubborn":  # ends a while after it was canceled
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    await self.release.wait()
                    raise
            return rpc_pb2.PutResponse()
        finally:
            self.running -= 1

    async def big(self, req, ctx):
        self.started += 1
        return rpc_pb2.RangeResponse(kvs=[{"key": b"k", "value": b"v" * req.limit}])

    async def waiting(self, req, ctx):  # a stream that stays open, as a watch does
        self.started += 1
        await asyncio.sleep(3600)
        yield rpc_pb2.WatchResponse()

    async def streamed(self, req, ctx):
        self.started += 1
        for _ in range(1000):
            yield rpc_pb2.SnapshotResponse(blob=b"x" * 256 * 1024)


def server(handlers: Handlers, **limits) -> ServerSettings:
    return ServerSettings(
        {
            PUT: Method(handlers.put, rpc_pb2.PutRequest),
            BIG: Method(handlers.big, rpc_pb2.RangeRequest),
            STREAMED: Method(handlers.streamed, rpc_pb2.SnapshotRequest, UNARY_STREAM),
            WAITING: Method(handlers.waiting, rpc_pb2.SnapshotRequest, UNARY_STREAM),
        },
        max_receive=4 * 1024 * 1024,
        keepalive_min_time=5.0,
        keepalive_interval=7200.0,
        keepalive_timeout=20.0,
        limits=replace(Http2Limits(), **limits),
    )


def put(key: bytes) -> bytes:
    return rpc_pb2.PutRequest(key=key, value=b"v").SerializeToString()


async def test_rapid_reset_ends_with_enhance_your_calm():
    h = Handlers()
    conf = server(h, max_resets_per_s=50.0)
    client = Client(conf)
    for _ in range(10_000):
        sid = client.call(PUT, put(b"slow"))
        client.send(h2.rst_stream(sid, h2.CANCEL))
        if client.transport.closed:
            break
        await asyncio.sleep(0)
    assert goaway_code(client.answered()) == h2.ENHANCE_YOUR_CALM
    assert conf.budgets["resets"] == 1
    assert h.started <= 2 * 50 + 5  # the bucket: two seconds' worth, then the connection ends
    await settle()
    assert h.running == 0  # every canceled handler ended


async def test_a_reset_stream_keeps_its_slot_until_its_handler_ends():
    h = Handlers()
    conf = server(h, max_concurrent_streams=2)
    client = Client(conf)
    first = client.call(PUT, put(b"stubborn"))
    second = client.call(PUT, put(b"stubborn"))
    await settle()
    client.send(h2.rst_stream(first, h2.CANCEL) + h2.rst_stream(second, h2.CANCEL))
    await settle()
    assert h.running == 2 and not client.conn.streams  # reset, still running
    third = client.call(PUT, put(b"k"))
    refused = [
        struct.unpack(">I", p)[0]
        for kind, _, sid, p in frames(client.answered())
        if kind == h2.RST_STREAM and sid == third
    ]
    assert refused == [h2.REFUSED_STREAM]
    assert conf.budgets["streams"] == 1
    h.release.set()
    await settle()
    assert h.running == 0
    client.call(PUT, put(b"k"))
    await settle()
    assert h.started == 3  # a slot is free again


async def test_a_stream_error_ends_its_call_and_not_the_connection():
    h = Handlers()
    conf = server(h)
    client = Client(conf)
    sid = client.call(PUT, put(b"slow"))  # the request is complete: half-closed (remote)
    await settle()
    assert h.running == 1
    client.send(h2.frame(h2.DATA, 0, sid, b"more"))  # DATA after the client's END_STREAM
    await settle()
    resets = [
        struct.unpack(">I", p)[0]
        for kind, _, s, p in frames(client.answered())
        if kind == h2.RST_STREAM and s == sid
    ]
    assert resets == [h2.STREAM_CLOSED]
    assert h.running == 0 and not client.conn.streams  # its handler was canceled
    client.call(PUT, put(b"k"))
    await settle()
    assert h.started == 2 and not client.transport.closed


async def test_a_block_of_table_size_updates_is_refused_from_its_bytes():
    conf = server(Handlers())
    client = Client(conf)
    block = b"\x3f\xe1\x1f" * 20_000  # 60 KB of "table size 4096" updates
    client.send(h2.frame(h2.HEADERS, 0, 1, block[:16_000]))
    for i in range(16_000, len(block), 16_000):
        last = i + 16_000 >= len(block)
        client.send(
            h2.frame(h2.CONTINUATION, h2.END_HEADERS if last else 0, 1, block[i : i + 16_000])
        )
    assert goaway_code(client.answered()) == h2.COMPRESSION_ERROR
    assert conf.budgets["table_updates"] == 1


async def test_header_list_and_header_block_budgets():
    conf = server(Handlers(), max_header_list_bytes=4096, max_header_block_bytes=32 * 1024)
    client = Client(conf)
    many = client.encoder.encode([(f"x-{i}", "v") for i in range(200)])  # 200 * 36 B > 4 KiB
    client.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, many))
    assert goaway_code(client.answered()) == h2.COMPRESSION_ERROR
    assert conf.budgets["header_list"] == 1

    client = Client(conf)
    client.send(h2.frame(h2.HEADERS, 0, 1, b"\x82"))
    for _ in range(4):
        client.send(h2.frame(h2.CONTINUATION, 0, 1, b"\x82" * 16_000))
    assert goaway_code(client.answered()) == h2.ENHANCE_YOUR_CALM
    assert conf.budgets["header_block"] == 1


async def test_the_decode_cache_stays_within_its_bytes():
    conf = server(Handlers(), decode_cache_bytes=8 * 1024)
    client = Client(conf)
    names = [(f"x-{i}", "v" * 20) for i in range(60)]
    client.send(
        h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, client.encoder.encode(names))
    )
    sid = 3
    for start in range(0, 55):  # blocks of table references only, all different
        block = client.encoder.encode(names[start : start + 5])
        client.send(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, block))
        sid += 2
        assert client.conn.decoder.cached_bytes <= 8 * 1024
    assert not client.transport.closed


async def test_unread_control_answers_end_the_connection():
    conf = server(Handlers(), max_control_answers=100)
    client = Client(conf)
    client.conn.pause_writing()  # the client's socket is full: it does not read
    for _ in range(500):
        client.send(h2.frame(h2.SETTINGS, 0, 0))
        if client.transport.closed:
            break
    assert goaway_code(client.answered()) == h2.ENHANCE_YOUR_CALM
    assert conf.budgets["control_frames"] == 1


async def test_a_zero_window_stops_new_calls_then_the_connection():
    h = Handlers()
    conf = server(h, max_output_bytes=1024 * 1024, drain_timeout_s=0.2)
    client = Client(conf, initial_window=0)
    request = rpc_pb2.RangeRequest(key=b"k", limit=512 * 1024).SerializeToString()
    for _ in range(200):
        client.call(BIG, request)
        await settle(2)
    held = client.conn.output_bytes
    assert h.started <= 3  # then the answers held pass the budget: no more calls start
    assert held <= 3 * (512 * 1024 + 64)
    assert conf.budgets["output"] >= 1
    for _ in range(100):
        if client.transport.closed:
            break
        await asyncio.sleep(0.05)
    assert goaway_code(client.answered()) == h2.ENHANCE_YOUR_CALM  # it read nothing in time


async def test_a_client_that_does_not_read_is_not_read_either():
    h = Handlers()
    conf = server(h, max_output_bytes=1024 * 1024, drain_timeout_s=60.0)
    client = Client(conf)
    client.send(h2.window_update(0, 2**31 - 1 - 16 * 1024 * 1024))
    client.call(STREAMED, rpc_pb2.SnapshotRequest().SerializeToString())
    for _ in range(200):
        await asyncio.sleep(0)
        client.send(h2.window_update(1, 1024 * 1024))
    assert not client.transport.reading  # the socket's buffer passed the budget
    assert client.transport.get_write_buffer_size() <= 2 * 1024 * 1024 + 64 * 1024
    # once the client reads, everything moves again
    for _ in range(40):
        client.transport.read()
        client.send(h2.window_update(1, 1024 * 1024))
        await asyncio.sleep(0)
    assert client.transport.reading or client.transport.get_write_buffer_size() > 1024 * 1024
    assert len(client.transport.received) > 8 * 1024 * 1024


async def test_half_sent_requests_are_bounded():
    h = Handlers()
    conf = server(h, max_input_bytes=1024 * 1024)
    client = Client(conf)
    chunk = b"\x00" + struct.pack(">I", 1024 * 1024) + b"x" * 16_000
    for _ in range(100):  # a 1 MiB message announced, 16 KB of it sent, on 100 streams
        sid = client.next_sid
        client.next_sid += 2
        client.send(
            h2.frame(h2.HEADERS, h2.END_HEADERS, sid, client.headers(PUT))
            + h2.frame(h2.DATA, 0, sid, chunk)
        )
    assert client.conn.input_bytes <= 1024 * 1024
    statuses = [p for kind, _, _, p in frames(client.answered()) if kind == h2.HEADERS]
    assert len(statuses) >= 30  # those past the budget were answered at once
    assert conf.budgets["input"] >= 30
    assert not client.transport.closed  # the connection itself goes on


async def test_an_idle_connection_gets_goaway():
    conf = server(Handlers(), idle_timeout_s=0.1)
    client = Client(conf)
    for _ in range(100):
        if client.transport.closed:
            break
        await asyncio.sleep(0.02)
    assert goaway_code(client.answered()) == h2.NO_ERROR
    assert conf.budgets["idle"] == 1


async def test_a_call_without_a_deadline_gets_the_default():
    h = Handlers()
    conf = server(h, default_call_timeout_s=0.1)
    client = Client(conf)
    client.call(PUT, put(b"slow"))
    for _ in range(100):
        if not client.conn.streams:
            break
        await asyncio.sleep(0.02)
    assert not client.conn.streams  # ended by the server's deadline
    trailers = [p for kind, _, sid, p in frames(client.answered()) if kind == h2.HEADERS]
    code = str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0]).encode()
    assert any(b"grpc-status" in p and code in p for p in trailers)
    assert conf.budgets["deadline"] == 1
    assert h.running == 0


async def test_calls_past_the_running_budget_wait_their_turn():
    h = Handlers()
    conf = server(h, max_running_calls=10)
    client = Client(conf)
    for _ in range(50):
        client.call(PUT, put(b"slow"))
    await settle()
    assert h.started == 10 and len(client.conn.deferred) == 40
    assert conf.budgets["running"] == 40
    client.send(h2.rst_stream(1, h2.CANCEL))  # one ends: the next one starts
    await settle()
    assert h.started == 11
    client.conn.connection_lost(None)
    await settle()


async def test_streams_are_not_held_back_by_the_running_budget():
    h = Handlers()
    conf = server(h, max_running_calls=10)
    client = Client(conf)
    for _ in range(50):  # long-lived streams, as watches are: they never end by themselves
        client.call(WAITING, rpc_pb2.SnapshotRequest().SerializeToString())
    await settle()
    assert h.started == 50 and conf.budgets["running"] == 0
    client.conn.connection_lost(None)
    await settle()


async def test_connections_per_address_and_per_process():
    conf = server(Handlers(), max_connections_per_address=2, max_connections=3)

    def connect(address: str) -> MemoryTransport:
        transport = MemoryTransport()
        conn = GrpcConnection(conf, ClientIdentity(address, None))
        transport.protocol = conn
        conn.connection_made(transport)  # type: ignore[arg-type]
        return transport

    first, second = connect("10.0.0.1:1"), connect("10.0.0.1:2")
    third = connect("10.0.0.1:3")
    assert third.closed and goaway_code(bytes(third.unread)) == h2.ENHANCE_YOUR_CALM
    assert conf.budgets["connections_per_address"] == 1
    other = connect("10.0.0.2:1")
    assert not other.closed  # another client is not affected
    fourth = connect("10.0.0.3:1")
    assert fourth.closed and conf.budgets["connections"] == 1  # three open in this process
    first.close()
    await settle()
    assert not connect("10.0.0.1:4").closed  # a place is free again
    for t in (second, other):
        t.close()
    await settle()
