"""Watch iterators of the client library (``kvserver.client.watch``) against raftkv's own HTTP
API over ``LocalKV`` replicas (no raft).

Pins down the iterator's contract: events in revision order, each exactly once, from a start
revision or from "now"; resuming from the last revision seen + 1 when the stream breaks (the
server ends it, the server shuts down and the client moves to another replica, the server
cancels the watcher as too slow); a typed error with the compact revision when the history
is compacted; a typed error for a watch the server refuses; the blocking iterator and its
timeout; closing frees the watcher on the server.

"Replicas" are LocalKVs with their own stores to which the test applies the same writes in
the same order, so they number revisions alike, as raft replicas do.
"""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from kvserver.client import (
    AsyncClient,
    Client,
    EventType,
    InvalidArgumentError,
    WatchCanceledError,
    WatchCompactedError,
)
from kvserver.kvpb.kv import CompactionRequest, DeleteRangeRequest, PutRequest
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.watch.hub import WatchLimits
from tests.client.fakeserver import FAST
from tests.client.servers import Replicas
from tests.support.wait import wait_for

WAIT_S = 10.0


@pytest.fixture
def one():
    r = Replicas(1).start()
    yield r
    r.close()


@pytest.fixture
def three():
    r = Replicas(3).start()
    yield r
    r.close()


def take(watch, n: int) -> list:
    return [watch.get(timeout_s=WAIT_S) for _ in range(n)]


def shape(events) -> list[tuple[str, bytes, bytes, int]]:
    return [(e.type.name, e.key, e.value, e.revision) for e in events]


def test_history_then_live_events_in_order_with_prev_kv(one):
    one.put("jobs/1", "queued")  # rev 2
    one.put("other", "x")  # rev 3, outside the prefix
    one.put("jobs/1", "running")  # rev 4
    with (
        Client(one.urls, **FAST) as c,
        c.watch("jobs/", prefix=True, start_revision=1, prev_kv=True) as w,
    ):
        first = take(w, 2)
        one.write(DeleteRangeRequest(b"jobs/1"))  # rev 5
        one.put("jobs/2", "queued")  # rev 6
        rest = take(w, 2)
    events = first + rest
    assert shape(events) == [
        ("PUT", b"jobs/1", b"queued", 2),
        ("PUT", b"jobs/1", b"running", 4),
        ("DELETE", b"jobs/1", b"", 5),
        ("PUT", b"jobs/2", b"queued", 6),
    ]
    assert events[0].prev_kv is None and events[1].prev_kv.value == b"queued"
    assert events[2].is_delete and events[2].prev_kv.value == b"running"
    assert events[2].kv.create_revision == 0 and events[2].kv.version == 0


def test_start_revision_zero_means_from_now_on(one):
    one.put("k", "before")
    with Client(one.urls, **FAST) as c, c.watch("k") as w:
        wait_for(lambda: one.watchers() == 1, WAIT_S, "the watcher to be created")
        rev = one.put("k", "after")
        (ev,) = take(w, 1)
        assert (ev.value, ev.revision) == (b"after", rev)
        assert w.next_revision == rev + 1


def test_filters_drop_puts_or_deletes(one):
    one.put("a", "1")
    one.write(DeleteRangeRequest(b"a"))
    one.put("a", "2")
    with Client(one.urls, **FAST) as c:
        with c.watch("a", start_revision=1, filters=["NOPUT"]) as w:
            assert shape(take(w, 1)) == [("DELETE", b"a", b"", 3)]
        with c.watch("a", start_revision=1, filters=["NODELETE"]) as w:
            assert [e.revision for e in take(w, 2)] == [2, 4]
        with pytest.raises(ValueError):
            c.watch("a", filters=["NOTHING"])
        with pytest.raises(ValueError):
            c.watch("")


def test_resumes_after_the_stream_is_cut_each_event_once(one):
    """The server ends the stream (EOF) while writes go on: the iterator reconnects with
    start_revision = last seen + 1 and sees every event once."""
    with Client(one.urls, **FAST) as c, c.watch("p/", prefix=True) as w:
        wait_for(lambda: one.watchers() == 1, WAIT_S, "the watcher to be created")
        got = []
        for round_ in range(3):
            revs = [one.put(f"p/{round_}-{i}", "v") for i in range(5)]
            got += take(w, 3)  # read part of the round, then cut the stream
            assert one.end_streams(0) == 1
            revs += [one.put(f"p/{round_}-late-{i}", "v") for i in range(2)]
            got += take(w, 4)
            assert [e.revision for e in got[-7:]] == revs
        assert w.reconnects == 3
    assert len({e.revision for e in got}) == len(got) == 21
    assert [e.revision for e in got] == sorted(e.revision for e in got)


def test_moves_to_another_replica_when_its_server_stops(three):
    with Client(three.urls, **FAST) as c, c.watch("jobs/", prefix=True, start_revision=1) as w:
        revs = [three.put(f"jobs/{i}", "v") for i in range(4)]
        got = take(w, 4)
        serving = three.urls.index(w.endpoint)
        assert serving == 0  # the leader, when known
        three.set_leader(1)
        three.stop(0)  # a final Unavailable error line, then the connection closes
        revs += [three.put(f"jobs/{i}", "w") for i in range(4, 8)]
        got += take(w, 4)
        assert w.endpoint != three.urls[0] and w.reconnects == 1
    assert [e.revision for e in got] == revs


def test_a_watcher_canceled_as_too_slow_resumes_from_history():
    r = Replicas(1, WatchLimits(max_buffered_events=4, replay_chunk_events=2)).start()
    try:
        with Client(r.urls, **FAST) as c, c.watch("k/", prefix=True) as w:
            wait_for(lambda: r.watchers() == 1, WAIT_S, "the watcher to be created")
            # One loop step applies 20 revisions: the live queue overflows at once.
            revs = [r.write(*(PutRequest(f"k/{i}".encode(), b"v") for i in range(20)))]
            got = take(w, 20)
            assert r.kvs[0].watch_hub.stats["canceled_slow"] >= 1
            assert w.reconnects >= 1
        assert [e.key for e in got] == [f"k/{i}".encode() for i in range(20)]
        assert got[-1].revision == revs[-1]
    finally:
        r.close()


def test_compacted_history_raises_a_typed_error_with_the_compact_revision(one):
    for i in range(5):
        one.put("k", str(i))  # revs 2..6
    one.write(CompactionRequest(5))
    with Client(one.urls, **FAST) as c:
        with c.watch("k", start_revision=3) as w, pytest.raises(WatchCompactedError) as info:
            take(w, 1)
        assert info.value.compact_revision == 5
        assert "compacted" in str(info.value)
        with c.watch("k", start_revision=5) as w:  # the compact revision itself is kept
            assert [e.revision for e in take(w, 2)] == [5, 6]


async def test_refused_watch_raises_watch_canceled_error(one):
    with Client(one.urls, **FAST) as c:
        with pytest.raises(WatchCanceledError, match="watcher range is empty"):
            c.watch("b", range_end="a")  # the blocking watch returns once created

    async with AsyncClient(one.urls, **FAST) as c:
        w = c.watch("b", range_end="a")
        for _ in range(2):  # it stays failed
            with pytest.raises(WatchCanceledError):
                await w.__anext__()
        await w.close()


def test_a_non_retryable_error_ends_the_watch(one):
    one.kvs[0].fail_with = ServiceError(GrpcCode.INVALID_ARGUMENT, "etcdserver: bad")
    with Client(one.urls, **FAST) as c:
        with pytest.raises(InvalidArgumentError, match="etcdserver: bad"):
            c.watch("k")


def test_get_times_out_without_losing_the_next_event(one):
    with Client(one.urls, **FAST) as c, c.watch("k") as w:
        with pytest.raises(TimeoutError):
            w.get(timeout_s=0.3)
        rev = one.put("k", "v")
        assert w.get(timeout_s=WAIT_S).revision == rev


def test_short_timeouts_while_events_flow_keep_one_reader_of_the_stream(one):
    """A timed-out ``get`` leaves its read in flight for the next call, which takes its
    event. Cancelling it instead raced the next call's read (the cancellation reaches the
    loop after the new read may have started) and aiohttp refused the second reader of the
    stream (``readany() called while another coroutine is already waiting``): the watch
    failed, and a FencedLock watching its key reported its lock lost."""
    stop = threading.Event()

    def putter():
        while not stop.is_set():
            one.put("k", "v")
            stop.wait(random.random() * 0.02)

    t = threading.Thread(target=putter)
    t.start()
    seen = []
    try:
        with Client(one.urls, **FAST) as c, c.watch("k") as w:
            for i in range(2000):
                try:
                    seen.append(w.get(timeout_s=(0.0005, 0.001, 0.002, 0.005)[i % 4]).revision)
                except TimeoutError:
                    pass
    finally:
        stop.set()
        t.join()
    assert seen and seen == sorted(set(seen)), "an event lost its order or came twice"


def test_closing_the_watch_frees_the_watcher_on_the_server(one):
    with Client(one.urls, **FAST) as c:
        one.put("k", "v")
        w = c.watch("k")
        assert one.watchers() == 1  # created before c.watch returned
        with pytest.raises(TimeoutError):
            w.get(timeout_s=0.2)  # the put was before the watch
        w.close()
        assert w.get(timeout_s=1.0) is None  # closed: the iteration is over
        wait_for(lambda: one.watchers() == 0, WAIT_S, "the server to drop the watcher")


async def test_async_iterator(one):
    for i in range(3):
        one.put(f"a/{i}", str(i))
    async with asyncio.timeout(WAIT_S), AsyncClient(one.urls, **FAST) as c:
        watch = c.watch("a/", prefix=True, start_revision=1)
        events = []
        async with watch:
            async for ev in watch:
                events.append(ev)
                if len(events) == 3:
                    break
        assert watch.closed
    assert [(e.type, e.key) for e in events] == [
        (EventType.PUT, f"a/{i}".encode()) for i in range(3)
    ]


class _GatedSession:
    """Stands in for the client's aiohttp session under a watch: each ``post`` waits until
    the test answers the future it queued in ``posts``."""

    def __init__(self) -> None:
        self.posts: asyncio.Queue[asyncio.Future] = asyncio.Queue()

    def post(self, url, **kwargs):
        answer = asyncio.get_running_loop().create_future()
        self.posts.put_nowait(answer)

        async def request():
            return await answer

        return request()


class _SilentStream:
    """A 200 watch answer whose stream never sends a line."""

    status = 200

    def __init__(self) -> None:
        self.content = self
        self.closed = False

    async def readany(self) -> bytes:
        await asyncio.get_running_loop().create_future()  # never answers
        return b""

    def close(self) -> None:
        self.closed = True


async def cancel_as_the_stream_opens(watch_class=None) -> asyncio.Task:
    """Cancel a task in ``__anext__`` in the same loop iteration in which the watch's POST
    answers (CPython gh-86296, deterministic): on Python 3.11 ``asyncio.wait_for`` returned
    the answer and dropped the cancel, so the cancelled step went on reading the stream (and
    would have taken the next event with it). Returns the step task, which must have ended
    cancelled. (``watch_class``: so the old code can be measured with the same steps.)"""
    async with AsyncClient("http://127.0.0.1:9", **FAST) as client:
        session = _GatedSession()
        client._transport._session = lambda: session  # type: ignore[method-assign]
        client._retry._leader = client.endpoints[0]  # no leader discovery: straight to the POST
        watch = client.watch("k") if watch_class is None else watch_class(client, "k")
        step = asyncio.ensure_future(watch.__anext__())
        try:
            async with asyncio.timeout(WAIT_S):
                post = await session.posts.get()
            post.set_result(_SilentStream())  # the stream opens...
            step.cancel()  # ...as the caller gives up on the step
            try:
                async with asyncio.timeout(WAIT_S):
                    await asyncio.wait([step])
            except TimeoutError:
                raise AssertionError("the cancel was lost: the step kept reading") from None
            return step
        finally:
            step.cancel()
            await watch.close()


def test_a_cancel_is_not_lost_when_the_stream_opens_at_the_same_moment():
    for _ in range(20):  # deterministic; repeated to cover whatever differs between loops
        step = asyncio.run(cancel_as_the_stream_opens())
        assert step.cancelled()


@pytest.mark.slow
@pytest.mark.external
def test_the_iterators_work_against_a_real_etcd(tmp_path):
    """The same client against etcd 3.4's gateway: replay + live events, prev_kv, the
    compacted error with its revision, from-now semantics."""
    from tests.etcd_process import etcd_process

    with etcd_process(str(tmp_path)) as etcd, Client(etcd.url, **FAST) as c:
        c.put("e/1", "a")  # 2
        c.put("e/2", "b")  # 3
        with c.watch("e/", prefix=True, start_revision=2, prev_kv=True) as w:
            first = take(w, 2)
            c.put("e/1", "c")  # 4
            c.delete("e/2")  # 5
            rest = take(w, 2)
        assert shape(first + rest) == [
            ("PUT", b"e/1", b"a", 2),
            ("PUT", b"e/2", b"b", 3),
            ("PUT", b"e/1", b"c", 4),
            ("DELETE", b"e/2", b"", 5),
        ]
        assert rest[0].prev_kv.value == b"a" and rest[1].prev_kv.value == b"b"
        with c.watch("e/1") as w:  # from now on
            rev = c.put("e/1", "d").revision
            assert w.get(timeout_s=WAIT_S).revision == rev == 6
        c.compact(5)
        with c.watch("e/", prefix=True, start_revision=3) as w:
            with pytest.raises(WatchCompactedError) as info:
                take(w, 1)
        assert info.value.compact_revision == 5
