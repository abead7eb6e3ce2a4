"""A front end's unary calls (``MemberLink``'s ``Method.start``), without sockets.

Each test drives one client ``GrpcConnection`` with frames and plays the member by hand on
the link: it reads the CALL and CANCEL events the front end sent and answers with REPLY or
END. Each checks what the client got (its answer, or the status in the trailers) and what
the member was told, as a task running the call would have done it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import msgpack
from hpack import Decoder

from kvserver.api.grpc import frontend_wire as wire
from kvserver.api.grpc import h2
from kvserver.api.grpc.connection import ServerSettings
from kvserver.api.grpc.frontend import MemberLink
from kvserver.api.grpc.rpc import UNARY_UNARY
from kvserver.etcdpb import rpc_pb2
from tests.grpcapi.memory_h2 import Client, settle
from tests.support.h2frames import frames

PUT = "/etcdserverpb.KV/Put"
ANSWER = rpc_pb2.PutResponse(header={"revision": 7}).SerializeToString()


class LinkTransport:
    """The front end's end of the link socket: what it sent to the member, as events."""

    def __init__(self) -> None:
        self.unpacker = wire.unpacker()
        self.events: list[tuple[Any, ...]] = []

    def write(self, data: bytes) -> None:
        self.unpacker.feed(data)
        self.events.extend(self.unpacker)

    def is_closing(self) -> bool:
        return False

    def sent(self, kind: int) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] == kind]


def put(key: bytes) -> bytes:
    return rpc_pb2.PutRequest(key=key, value=b"v").SerializeToString()


def front_end() -> tuple[Client, MemberLink, LinkTransport]:
    loop = asyncio.get_running_loop()
    link = MemberLink(loop)
    member = LinkTransport()
    link.connection_made(member)  # type: ignore[arg-type]
    settings = ServerSettings(
        link.methods({PUT: UNARY_UNARY}),
        max_receive=4 * 1024 * 1024,
        keepalive_min_time=5.0,
        keepalive_interval=7200.0,
        keepalive_timeout=20.0,
    )
    return Client(settings), link, member


def member_says(link: MemberLink, *events: tuple[Any, ...]) -> None:
    link.data_received(b"".join(msgpack.packb(e, use_bin_type=True) for e in events))


def outcome(client: Client, sid: int) -> tuple[bytes, dict[str, str]] | str:
    """The call's answer (its message and trailers), or "reset" if the server reset it."""
    decoder = Decoder()
    data, headers = b"", {}
    for kind, _, stream, payload in frames(client.answered()):
        if kind == h2.HEADERS:  # every block goes through the decoder, for its table
            block = dict(decoder.decode(payload))
            if stream == sid:
                headers.update(block)
        elif stream == sid and kind == h2.DATA:
            data += payload
        elif stream == sid and kind == h2.RST_STREAM:
            return "reset"
    return data[5:], headers


async def test_the_answer_goes_to_the_client_without_a_task():
    client, link, member = front_end()
    sid = client.call(PUT, put(b"k"))
    await settle()
    (call,) = member.sent(wire.CALL)
    assert call[2] == PUT and call[6] == put(b"k")
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    member_says(link, (wire.REPLY, call[1], ANSWER))
    assert outcome(client, sid) == (
        ANSWER,
        {":status": "200", "content-type": "application/grpc", "grpc-status": "0"},
    )
    assert not link.calls and client.conn.handlers == 0 and not client.conn.streams


async def test_the_members_status_ends_the_call():
    client, link, member = front_end()
    first = client.call(PUT, put(b"a"))
    second = client.call(PUT, put(b"b"))
    await settle()
    ids = [e[1] for e in member.sent(wire.CALL)]
    not_found = int(grpc.StatusCode.NOT_FOUND.value[0])
    member_says(link, (wire.END, ids[0], not_found, "no such key"), (wire.END, ids[1], 99, "odd"))
    answer, trailers = outcome(client, first)  # type: ignore[misc]
    assert (trailers["grpc-status"], trailers["grpc-message"]) == (str(not_found), "no such key")
    answer, trailers = outcome(client, second)  # type: ignore[misc]
    assert trailers["grpc-status"] == str(grpc.StatusCode.UNKNOWN.value[0])
    assert client.conn.handlers == 0


async def test_a_reset_call_is_canceled_at_the_member_and_its_late_answer_dropped():
    client, link, member = front_end()
    sid = client.call(PUT, put(b"k"))
    await settle(1)
    (call,) = member.sent(wire.CALL)
    client.send(h2.rst_stream(sid, h2.CANCEL))
    await settle()
    assert member.sent(wire.CANCEL) == [(wire.CANCEL, call[1])]
    assert client.conn.handlers == 0 and not link.calls
    member_says(link, (wire.REPLY, call[1], ANSWER))  # crossed the CANCEL on the link
    assert outcome(client, sid) == (b"", {})


async def test_a_deadline_ends_the_call_here_and_at_the_member():
    client, link, member = front_end()
    sid = client.call(PUT, put(b"k"), timeout="20m")
    await settle(1)
    (call,) = member.sent(wire.CALL)
    assert 0 < call[4] <= 0.02  # the time left travels with the call
    deadline = asyncio.get_running_loop().time() + 5
    while client.conn.handlers and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    _, trailers = outcome(client, sid)  # type: ignore[misc]
    assert trailers["grpc-status"] == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    assert member.sent(wire.CANCEL) == [(wire.CANCEL, call[1])]


async def test_calls_waiting_when_the_member_goes_end_unavailable():
    client, link, member = front_end()
    waiting = [client.call(PUT, put(b"k")) for _ in range(3)]
    await settle()
    link.connection_lost(None)
    unavailable = str(grpc.StatusCode.UNAVAILABLE.value[0])
    for sid in waiting:
        _, trailers = outcome(client, sid)  # type: ignore[misc]
        assert trailers["grpc-status"] == unavailable
    late = client.call(PUT, put(b"k"))  # the member is gone: no CALL, the same answer
    await settle()
    _, trailers = outcome(client, late)  # type: ignore[misc]
    assert trailers["grpc-status"] == unavailable
    assert len(member.sent(wire.CALL)) == 3 and client.conn.handlers == 0
