"""The HTTP/2 gRPC server (``kvserver.api.grpc.connection``) against real gRPC clients and
against raw frames.

A loopback listener serves a small method table of test handlers through ``GrpcConnection``
(no raft member: the servicers' own tests run through members). grpc.aio checks what clients
see: answers, statuses, deadlines, cancellation, big streamed answers through a small window,
compressed requests, the message limit. Raw sockets check what a broken or hostile peer
gets: GOAWAY with the right code, nothing raised out of the protocol, and for random bytes
(hypothesis), a connection that either goes on or ends with GOAWAY.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from contextlib import asynccontextmanager

import grpc
import pytest
from hpack import Decoder, Encoder
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.api.grpc import h2
from kvserver.api.grpc.budgets import BUDGETS
from kvserver.api.grpc.connection import GrpcConnection, ServerSettings
from kvserver.api.grpc.h2 import HeaderDecoder, encode_headers
from kvserver.api.grpc.metrics import GrpcCollector
from kvserver.api.grpc.rpc import (
    STREAM_STREAM,
    UNARY_STREAM,
    ClientIdentity,
    Method,
    percent_encode,
)
from kvserver.etcdpb import rpc_pb2
from tests.support.h2frames import frames, goaway_code

MAX_RECEIVE = 64 * 1024
WAIT_S = 10.0


class Handlers:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()

    async def put(self, req: rpc_pb2.PutRequest, ctx) -> rpc_pb2.PutResponse:
        if req.key == b"abort":
            await ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: ünïcode % text")
        if req.key == b"crash":
            raise RuntimeError("boom")
        if req.key == b"meta":
            token = dict(ctx.invocation_metadata()).get("token", "")
            return rpc_pb2.PutResponse(
                prev_kv={"key": token.encode(), "value": b"%d" % len(req.value)}
            )
        if req.key == b"slow":
            self.started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return rpc_pb2.PutResponse(prev_kv={"key": req.key, "value": req.value})

    async def snapshot(self, req: rpc_pb2.SnapshotRequest, ctx):
        for i in range(64):
            yield rpc_pb2.SnapshotResponse(remaining_bytes=63 - i, blob=bytes([i]) * 128 * 1024)

    async def echo(self, requests, ctx) -> None:
        async for req in requests:
            await ctx.write(rpc_pb2.WatchResponse(watch_id=req.progress_request and 7 or 1))


def table(h: Handlers) -> dict[str, Method]:
    return {
        "/etcdserverpb.KV/Put": Method(h.put, rpc_pb2.PutRequest),
        "/etcdserverpb.Maintenance/Snapshot": Method(
            h.snapshot, rpc_pb2.SnapshotRequest, UNARY_STREAM
        ),
        "/etcdserverpb.Watch/Watch": Method(h.echo, rpc_pb2.WatchRequest, STREAM_STREAM),
    }


@asynccontextmanager
async def serving(handlers: Handlers, *, keepalive_min_time: float = 5.0):
    conf = ServerSettings(
        table(handlers),
        max_receive=MAX_RECEIVE,
        keepalive_min_time=keepalive_min_time,
        keepalive_interval=7200.0,
        keepalive_timeout=20.0,
    )
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: GrpcConnection(conf, ClientIdentity("127.0.0.1:1", None)), "127.0.0.1", 0
    )
    try:
        yield server.sockets[0].getsockname()[1], conf
    finally:
        for conn in list(conf.connections):
            conn.abort()
        server.close()
        await server.wait_closed()


def put_method(channel: grpc.aio.Channel):
    return channel.unary_unary(
        "/etcdserverpb.KV/Put",
        request_serializer=rpc_pb2.PutRequest.SerializeToString,
        response_deserializer=rpc_pb2.PutResponse.FromString,
    )


async def test_unary_answers_statuses_and_metadata():
    h = Handlers()
    async with serving(h) as (port, conf):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            put = put_method(channel)
            answers = await asyncio.gather(
                *(put(rpc_pb2.PutRequest(key=b"k%d" % i, value=b"v")) for i in range(200))
            )
            assert [a.prev_kv.key for a in answers] == [b"k%d" % i for i in range(200)]
            got = await put(
                rpc_pb2.PutRequest(key=b"meta", value=b"x" * 50_000), metadata=(("token", "tok.1"),)
            )
            assert (got.prev_kv.key, got.prev_kv.value) == (b"tok.1", b"50000")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await put(rpc_pb2.PutRequest(key=b"abort"))
            assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert err.value.details() == "etcdserver: ünïcode % text"
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await put(rpc_pb2.PutRequest(key=b"crash"))
            assert err.value.code() is grpc.StatusCode.UNKNOWN
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await put(rpc_pb2.PutRequest(key=b"big", value=b"x" * (MAX_RECEIVE + 1)))
            assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            missing = channel.unary_unary("/etcdserverpb.KV/Nope")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await missing(b"")
            assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
            # a compressed request is accepted
            got = await put(
                rpc_pb2.PutRequest(key=b"gz", value=b"z" * 10_000),
                compression=grpc.Compression.Gzip,
            )
            assert got.prev_kv.value == b"z" * 10_000
            # after all of that the connection still serves
            assert (await put(rpc_pb2.PutRequest(key=b"last"))).prev_kv.key == b"last"
        assert conf.accepted == 1
        # every call to a known method is counted, by its status (unknown ones are not)
        put_path = "/etcdserverpb.KV/Put"
        assert conf.calls.started_calls == {put_path: 206}
        codes = {code: n for (path, code), n in conf.calls.handled_calls.items()}
        assert codes == {
            0: 203,
            9: 1,
            2: 1,
            8: 1,
        }  # OK, FAILED_PRECONDITION, UNKNOWN, RESOURCE_EXHAUSTED
        families = {f.name: f for f in GrpcCollector(conf, {put_path: "unary_unary"}).collect()}
        handled = {
            (s.labels["grpc_method"], s.labels["grpc_code"]): s.value
            for s in families["raftkv_grpc_server_handled"].samples
        }
        assert handled[("Put", "OK")] == 203
        assert handled[("Put", "ResourceExhausted")] == 1
        assert families["raftkv_grpc_server_started"].samples[0].labels["grpc_type"] == "unary"
        conf.budgets["resets"] += 2
        exceeded = {
            s.labels["budget"]: s.value
            for s in families["raftkv_client_budget_exceeded"].samples
            if s.name.endswith("_total")
        }
        assert set(exceeded) == set(BUDGETS) and exceeded["resets"] == 0
        families = {f.name: f for f in GrpcCollector(conf, {put_path: "unary_unary"}).collect()}
        samples = families["raftkv_client_budget_exceeded"].samples
        assert [s.value for s in samples if s.labels["budget"] == "resets"][0] == 2


async def test_deadline_and_cancel_end_the_handler():
    h = Handlers()
    async with serving(h) as (port, _):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            put = put_method(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await put(rpc_pb2.PutRequest(key=b"slow"), timeout=0.3)
            assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.wait_for(h.cancelled.wait(), WAIT_S)
            h.cancelled.clear()
            h.started.clear()
            call = put(rpc_pb2.PutRequest(key=b"slow"))
            await asyncio.wait_for(h.started.wait(), WAIT_S)
            call.cancel()
            await asyncio.wait_for(h.cancelled.wait(), WAIT_S)


async def test_big_streamed_answer_through_a_small_window():
    h = Handlers()
    options = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16384)]
    async with serving(h) as (port, _):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            snapshot = channel.unary_stream(
                "/etcdserverpb.Maintenance/Snapshot",
                request_serializer=rpc_pb2.SnapshotRequest.SerializeToString,
                response_deserializer=rpc_pb2.SnapshotResponse.FromString,
            )
            blobs = [m.blob async for m in snapshot(rpc_pb2.SnapshotRequest())]
            assert blobs == [bytes([i]) * 128 * 1024 for i in range(64)]


async def test_bidirectional_stream():
    h = Handlers()
    async with serving(h) as (port, _):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            watch = channel.stream_stream(
                "/etcdserverpb.Watch/Watch",
                request_serializer=rpc_pb2.WatchRequest.SerializeToString,
                response_deserializer=rpc_pb2.WatchResponse.FromString,
            )
            call = watch()
            for _ in range(300):
                await call.write(rpc_pb2.WatchRequest(progress_request={}))
            await call.done_writing()
            got = [m.watch_id async for m in call]
            assert got == [7] * 300
            assert await call.code() is grpc.StatusCode.OK


# --- raw frames --------------------------------------------------------------------------------


def settings_frame() -> bytes:
    return h2.frame(h2.SETTINGS, 0, 0)


def read_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(WAIT_S)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


BROKEN = {
    "bad preface": (b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", h2.PROTOCOL_ERROR),
    "headers on stream 0": (h2.PREFACE + h2.frame(h2.HEADERS, 4, 0, b"\x82"), h2.PROTOCOL_ERROR),
    "frame too big": (
        h2.PREFACE + struct.pack(">IBI", (20000 << 8) | 0, 0, 1) + b"x" * 20000,
        h2.FRAME_SIZE_ERROR,
    ),
    "bad settings length": (
        h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0, b"12345"),
        h2.FRAME_SIZE_ERROR,
    ),
    "window overflow": (h2.PREFACE + h2.window_update(0, 2**31 - 1), h2.FLOW_CONTROL_ERROR),
    "bad hpack": (
        h2.PREFACE + h2.frame(h2.HEADERS, 5, 1, b"\xff\xff\xff\xff\xff"),
        h2.COMPRESSION_ERROR,
    ),
    "push promise": (h2.PREFACE + h2.frame(h2.PUSH_PROMISE, 4, 1, b"\0\0\0\2"), h2.PROTOCOL_ERROR),
    "even stream": (h2.PREFACE + h2.frame(h2.HEADERS, 5, 2, b"\x82"), h2.PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
async def test_a_broken_peer_gets_goaway(case):
    data, code = BROKEN[case]
    async with serving(Handlers()) as (port, conf):

        def talk() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
                sock.sendall(data)
                return read_until_closed(sock)

        answer = await asyncio.to_thread(talk)
        assert goaway_code(answer) == code
        assert not conf.connections or all(c.closing for c in conf.connections)


async def test_too_many_pings_end_the_connection():
    async with serving(Handlers(), keepalive_min_time=60.0) as (port, _):

        def talk() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
                sock.sendall(h2.PREFACE + settings_frame())
                for i in range(4):
                    sock.sendall(h2.frame(h2.PING, 0, 0, b"%08d" % i))
                return read_until_closed(sock)

        answer = await asyncio.to_thread(talk)
        acks = [p for kind, flags, _, p in frames(answer) if kind == h2.PING and flags & h2.ACK]
        assert len(acks) == 3  # the fourth ping is the third strike
        assert goaway_code(answer) == h2.ENHANCE_YOUR_CALM


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name, default=None):
        return default

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_random_bytes_never_escape_the_protocol(chunks):
    async def run() -> None:
        conf = ServerSettings(
            table(Handlers()),
            max_receive=MAX_RECEIVE,
            keepalive_min_time=5.0,
            keepalive_interval=7200.0,
            keepalive_timeout=20.0,
        )
        conn = GrpcConnection(conf, ClientIdentity("x:1", None))
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(h2.PREFACE + settings_frame())
        for chunk in chunks:
            if transport.closed:
                break
            conn.data_received(chunk)  # must not raise
        await asyncio.sleep(0)
        conn.flush()
        if transport.closed:
            code = goaway_code(bytes(transport.written))
            assert code is not None and code != h2.INTERNAL_ERROR  # the peer's fault, not ours
        conn.connection_lost(None)
        for _ in range(3):
            await asyncio.sleep(0)  # canceled handlers end

    asyncio.run(run())


# --- header blocks -----------------------------------------------------------------------------


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["grpc-status", "grpc-message", "content-type", "x-a"]),
            st.text(max_size=40).map(percent_encode),
        ),
        max_size=5,
    )
)
def test_encoded_headers_decode_to_themselves(headers):
    block = encode_headers([(":status", "200")] + headers)
    assert Decoder().decode(block) == [(":status", "200")] + headers


NAMES = st.sampled_from([":path", ":method", "token", "grpc-timeout", "user-agent", "x-b"])
HEADER_LIST = st.lists(
    st.tuples(NAMES, st.sampled_from(["a", "bb", "c" * 30, ""])), min_size=1, max_size=6
)


@given(
    st.lists(HEADER_LIST, min_size=1, max_size=4),
    st.lists(st.integers(0, 3), max_size=40),
    st.sampled_from([64, 256, 4096]),
)
def test_cached_decoding_equals_a_plain_decoder(pool, picks, table_size):
    """Whatever the encoder indexes and evicts (a small table evicts often), the cache of
    ``HeaderDecoder`` never answers a block with stale headers. Lists drawn again and again
    from a small pool give the repeated all-reference blocks that the cache keeps."""
    encoder = Encoder()
    encoder.header_table_size = table_size
    plain, cached = Decoder(), HeaderDecoder(1 << 20)
    for pick in picks:
        headers = pool[pick % len(pool)]
        block = encoder.encode(headers)
        assert cached.decode(block) == plain.decode(block) == headers
