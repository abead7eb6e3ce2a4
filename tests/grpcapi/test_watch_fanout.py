"""A front end's watch fan-out against the member's feeds, without sockets or processes.

``WatchFanout`` (the front end's Watch streams) and ``WatchFeeds`` (the member's end) are
joined by an in-memory link whose events go through msgpack as on the real one; the member
is ``LocalKV`` with a real watch hub. Checks that:

- client watchers of one range share one hub watcher, on one stream or many, and each gets
  every event once, in order; a watcher that joins later is created at the revision the feed
  has delivered and gets every event after it;
- watchers that ask for history, or differ in filters or ``prev_kv``, get feeds of their own;
- the last receiver's cancel or its stream's end removes the hub watcher;
- a stream that does not read, or whose connection's Watch streams together hold more than
  its output budget, gets its watchers canceled as too slow, and nobody else waits;
- the front end's limits refuse with the hub's texts; both count as budgets met; a progress
  request is answered;
- the link going away ends every stream Unavailable.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import msgpack
import pytest

from kvserver.api.grpc.calls import Calls
from kvserver.api.grpc.h2 import U32
from kvserver.api.grpc.rpc import ClientIdentity, RpcContext, status_code
from kvserver.api.grpc.watch_fanout import MSG_MEMBER_GONE, WatchFanout
from kvserver.api.grpc.watch_feeds import WatchFeeds
from kvserver.etcdpb import rpc_pb2
from kvserver.kvpb.kv import PutRequest
from kvserver.watch.hub import MSG_TOO_MANY_WATCHERS, MSG_WATCHER_TOO_SLOW, WatchLimits
from tests.api.fakes import LocalKV
from tests.support.wait import async_wait_for

WAIT_S = 5.0


def _roundtrip(event: tuple[Any, ...]) -> tuple[Any, ...]:
    return msgpack.unpackb(msgpack.packb(event, use_bin_type=True), use_list=False, raw=False)


class _Writer:
    def __init__(self, deliver: Any):
        self.deliver = deliver

    def send(self, event: tuple[Any, ...]) -> None:
        asyncio.get_running_loop().call_soon(self.deliver, _roundtrip(event))


class Link:
    """A member (``LocalKV``) and one front end's fan-out, joined in memory."""

    def __init__(self, limits: WatchLimits | None = None):
        self.kv = LocalKV(watch_limits=limits or WatchLimits())
        hub_limits = self.kv.watch_hub.limits
        self.fanout = WatchFanout(
            asyncio.get_running_loop(),
            _Writer(self._to_member).send,
            {
                "max_watchers": hub_limits.max_watchers,
                "max_watchers_per_stream": hub_limits.max_watchers_per_stream,
                "max_buffered_bytes": hub_limits.max_buffered_bytes,
            },
        )
        self.writer = _Writer(self.fanout.event)  # the member's end writes with it
        self.write_paused = False
        self.feeds = WatchFeeds(self.kv, Calls(None, 1 << 20), self)
        self.revision = 0

    def _to_member(self, event: tuple[Any, ...]) -> None:
        if not self.feeds.closed:
            self.feeds.event(event)

    async def put(self, key: bytes, value: bytes = b"v") -> int:
        resp = await self.kv.put(PutRequest(key=key, value=value))
        self.revision = resp.header.revision
        return self.revision

    @property
    def hub_watchers(self) -> int:
        return self.kv.watch_hub.watcher_count


def parse(data: bytes) -> list[rpc_pb2.WatchResponse]:
    """gRPC messages, each its 5-byte prefix and bytes, one after another."""
    out = []
    while data:
        (size,) = U32.unpack(data[1:5])
        out.append(rpc_pb2.WatchResponse.FromString(data[5 : 5 + size]))
        data = data[5 + size :]
    return out


class Sink:
    """A client stream's answers: parsed as they are sent, or held when it does not read."""

    def __init__(self, reads: bool = True):
        self.reads = reads
        self.held = bytearray()  # what a stream that does not read has been sent
        self.outbound_bytes = 0
        self.conn = self  # a connection of its own
        self.answers: list[rpc_pb2.WatchResponse] = []
        self.ended: tuple[int, str] | None = None
        self.task: asyncio.Task[None] | None = None

    def send_framed(self, data: bytes) -> None:
        if not self.reads:
            self.held += data
            self.outbound_bytes += len(data)
            return
        self.answers.extend(parse(data))

    def end(self, code: int, details: str) -> None:
        self.ended = (code, details)
        if self.task is not None:
            self.task.cancel()

    async def drain(self) -> None:
        pass


class Client:
    """One client Watch stream through the fan-out."""

    def __init__(self, link: Link, reads: bool = True):
        self.sink = Sink(reads)
        self.requests: asyncio.Queue[rpc_pb2.WatchRequest | None] = asyncio.Queue()
        context = RpcContext(ClientIdentity("127.0.0.1:1", None), (), None, self.sink)
        self.task = asyncio.get_running_loop().create_task(
            link.fanout.serve(self._requests(), context)
        )
        self.sink.task = self.task

    async def _requests(self) -> Any:
        while (req := await self.requests.get()) is not None:
            yield req

    def create(self, **fields: Any) -> None:
        self.requests.put_nowait(
            rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(**fields))
        )

    def cancel(self, watch_id: int) -> None:
        self.requests.put_nowait(
            rpc_pb2.WatchRequest(cancel_request=rpc_pb2.WatchCancelRequest(watch_id=watch_id))
        )

    def progress(self) -> None:
        self.requests.put_nowait(
            rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest())
        )

    async def answers(self, n: int) -> list[rpc_pb2.WatchResponse]:
        await async_wait_for(lambda: len(self.sink.answers) >= n, WAIT_S, f"{n} answers")
        return self.sink.answers[:n]

    def events(self, watch_id: int) -> list[tuple[int, bytes]]:
        return [
            (ev.kv.mod_revision, ev.kv.key)
            for r in self.sink.answers
            if r.watch_id == watch_id
            for ev in r.events
        ]

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_watchers_of_one_range_share_one_hub_watcher():
    link = Link()
    clients = [Client(link) for _ in range(5)]
    for c in clients:
        for _ in range(10):
            c.create(key=b"p/", range_end=b"p0")
    for c in clients:
        created = await c.answers(10)
        assert [(r.watch_id, r.created, r.canceled) for r in created] == [
            (i, True, False) for i in range(10)
        ]
    assert link.hub_watchers == 1 and link.fanout.feeds_opened == 1
    revisions = [await link.put(b"p/%d" % i) for i in range(3)]
    for c in clients:
        await c.answers(10 + 10 * 3)
        for i in range(10):
            assert c.events(i) == [(r, b"p/%d" % n) for n, r in enumerate(revisions)]

    # A late joiner is created at the feed's revision and gets what follows.
    late = Client(link)
    late.create(key=b"p/", range_end=b"p0")
    (created,) = await late.answers(1)
    assert created.created and created.header.revision == revisions[-1]
    assert created.header.member_id == link.kv.member_id
    after = await link.put(b"p/x")
    await late.answers(2)
    assert late.events(0) == [(after, b"p/x")] and link.hub_watchers == 1

    # The feed lives while any receiver does.
    for c in clients:
        await c.close()
    await asyncio.sleep(0)  # the events of the closes reach the member
    assert link.hub_watchers == 1
    late.cancel(0)
    (_, _, canceled) = await late.answers(3)
    assert canceled.canceled and canceled.watch_id == 0
    await async_wait_for(lambda: link.hub_watchers == 0, WAIT_S, "the feed gone")
    await late.close()


async def test_history_filters_and_prev_kv_get_feeds_of_their_own():
    link = Link()
    first = await link.put(b"k", b"0")
    c = Client(link)
    c.create(key=b"k")
    c.create(key=b"k", prev_kv=True)
    c.create(key=b"k", filters=[rpc_pb2.WatchCreateRequest.NOPUT])
    c.create(key=b"k", start_revision=first)
    c.create(key=b"k", start_revision=first)
    c.create(key=b"k")
    await c.answers(6 + 2)  # the two replays of the first put
    assert link.hub_watchers == 5
    second = await link.put(b"k", b"1")
    await c.answers(8 + 5)
    assert c.events(0) == c.events(1) == c.events(5) == [(second, b"k")]
    assert c.events(2) == []
    assert c.events(3) == c.events(4) == [(first, b"k"), (second, b"k")]
    with_prev = [r for r in c.sink.answers if r.watch_id == 1 and r.events]
    assert with_prev[0].events[0].prev_kv.value == b"0"
    without = [r for r in c.sink.answers if r.watch_id == 0 and r.events]
    assert not without[0].events[0].HasField("prev_kv")
    await c.close()
    await async_wait_for(lambda: link.hub_watchers == 0, WAIT_S, "the feeds gone")


async def test_a_stream_that_does_not_read_is_canceled_and_nobody_waits():
    link = Link(WatchLimits(max_buffered_bytes=4096))
    reader = Client(link)
    stuck = Client(link, reads=False)
    reader.create(key=b"s")
    stuck.create(key=b"s")
    await reader.answers(1)
    await async_wait_for(lambda: stuck.sink.outbound_bytes > 0, WAIT_S, "stuck created")
    value = b"x" * 1024
    revisions = []
    for i in range(20):  # one at a time: the hub's own bound is as small
        revisions.append(await link.put(b"s", value))
        await reader.answers(2 + i)
    assert [r for r, _ in reader.events(0)] == revisions
    # The stuck stream's watcher was canceled once its backlog passed the bound: what it
    # was sent is its created, a prefix of the events, and the cancel with its reason.
    stuck_call = next(call for call in link.fanout.calls.values() if call.stream is stuck.sink)
    assert not stuck_call.receivers and len(link.fanout.feeds) == 1
    held = parse(bytes(stuck.sink.held))
    assert held[0].created and held[-1].watch_id == 0
    assert (held[-1].canceled, held[-1].cancel_reason) == (True, MSG_WATCHER_TOO_SLOW)
    seen = [ev.kv.mod_revision for r in held for ev in r.events]
    assert 0 < len(seen) < len(revisions) and seen == revisions[: len(seen)]
    assert link.fanout.budgets["watch_backlog"] == 1
    assert stuck.sink.outbound_bytes < 4096 + 2 * len(value) + 512
    await reader.close()
    await stuck.close()
    await async_wait_for(lambda: link.hub_watchers == 0, WAIT_S, "the feed gone")


async def test_the_watch_streams_of_one_connection_share_its_output_budget():
    link = Link(WatchLimits(max_buffered_bytes=4096))
    link.fanout.max_connection_backlog = 2048
    reader = Client(link)
    stuck = [Client(link, reads=False) for _ in range(2)]
    for s in stuck[1:]:
        s.sink.conn = stuck[0].sink  # one connection
    for c in (reader, *stuck):
        c.create(key=b"c")
    await reader.answers(1)
    await async_wait_for(lambda: all(s.sink.outbound_bytes for s in stuck), WAIT_S, "created")
    value = b"x" * 600
    for i in range(4):  # each stream alone stays under 4096; both together pass 2048
        await link.put(b"c", value)
        await reader.answers(2 + i)
    held = [parse(bytes(s.sink.held)) for s in stuck]
    assert all(h[-1].cancel_reason == MSG_WATCHER_TOO_SLOW for h in held)
    assert all(s.sink.outbound_bytes < 4096 for s in stuck)
    assert len(reader.events(0)) == 4 and link.fanout.budgets["watch_backlog"] == 2
    for c in (reader, *stuck):
        await c.close()


async def test_limits_refuse_with_the_hubs_texts_and_progress_is_answered():
    link = Link(WatchLimits(max_watchers=4, max_watchers_per_stream=2))
    a, b = Client(link), Client(link)
    for _ in range(3):
        a.create(key=b"a")
    answers = await a.answers(3)
    assert [(r.watch_id, r.canceled) for r in answers] == [(0, False), (1, False), (-1, True)]
    assert answers[2].cancel_reason == MSG_TOO_MANY_WATCHERS
    b.create(key=b"b")
    b.create(key=b"c")
    await b.answers(2)
    before = await link.put(b"x")
    c = Client(link)
    c.create(key=b"d")
    (refused,) = await c.answers(1)
    assert refused.canceled and refused.cancel_reason == MSG_TOO_MANY_WATCHERS
    assert (refused.header.revision, refused.header.member_id) == (before, link.kv.member_id)
    assert link.fanout.budgets["watchers"] == 2
    rev = await link.put(b"a")
    a.progress()
    await a.answers(4 + 1)
    progress = a.sink.answers[-1]
    assert progress.watch_id == -1 and not progress.events and progress.header.revision == rev
    for client in (a, b, c):
        await client.close()


async def test_the_link_going_away_ends_every_stream_unavailable():
    link = Link()
    c = Client(link)
    c.create(key=b"k")
    await c.answers(1)
    link.feeds.close()
    link.fanout.link_lost()
    assert c.sink.ended == (status_code(grpc.StatusCode.UNAVAILABLE), MSG_MEMBER_GONE)
    with pytest.raises(asyncio.CancelledError):
        await c.task
    assert link.hub_watchers == 0
