"""A revision with tens of thousands of events reaches its watchers a bounded step at a time.

``WatchHub.notify`` of a big revision (more than ``BIG_REVISION_EVENTS`` events: a delete of
a large prefix, a revoke of a lease with many keys) does O(1) work per synced watcher; each
watcher's share is located (bisection when the events are in key order), selected and sized
by its stream's consumer, at most ``BIG_STEP_EVENTS`` events per poll, where the revision's
response belongs in the stream: later responses wait behind it. The encoders of both
dialects turn a huge response into bytes a slice of events per loop step.

Counted, never timed: the events each call looks at (reads of the sequence given to
``notify``, and events sized for a response), the pieces the encoders produce, and the loop
turns another task gets meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import pytest

from kvserver.api.grpc.watch import (
    ENCODE_STEP_EVENTS as GRPC_STEP,
)
from kvserver.api.grpc.watch import (
    encode_response,
    encode_response_in_steps,
    encode_response_pieces,
)
from kvserver.api.http import watch as http_watch
from kvserver.etcdpb import rpc_pb2
from kvserver.kvpb.kv import Event, ResponseHeader
from kvserver.kvpb.watch import WatchCreateRequest, WatchFilter, WatchResponse
from kvserver.mvcc import DeleteRangeRequest, EventType, PutRequest, RequestOp, TxnRequest
from kvserver.watch import hub as hub_mod
from kvserver.watch.hub import BIG_REVISION_EVENTS, BIG_STEP_EVENTS, WatchLimits

from .helpers import Env, drain

N = 50_000  # the main tests' revision
SMALL = 3 * BIG_STEP_EVENTS + 100  # still several steps: the other tests
DELETE = EventType.DELETE


def key(i: int) -> bytes:
    return b"p/%06d" % i


def loaded(n: int = N, limits: WatchLimits | None = None) -> Env:
    env = Env(limits)
    env.store.max_txn_ops = 10_000
    for lo in range(0, n, 10_000):
        ops = tuple(RequestOp.of(PutRequest(key(i), b"v")) for i in range(lo, min(n, lo + 10_000)))
        env.apply(TxnRequest(success=ops))
    return env


class Counted(Sequence[Event]):
    """The events given to ``notify``, counting every event read from them."""

    def __init__(self, events: Sequence[Event]) -> None:
        self._events = events
        self.reads = 0

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        out = self._events[i]
        self.reads += len(out) if isinstance(i, slice) else 1
        return out

    def __iter__(self) -> Iterator[Event]:
        for ev in self._events:
            self.reads += 1
            yield ev


class Meter:
    """The most events one call looked at: reads of the counted events, events sized."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, events: Counted) -> None:
        self.events = events
        self.sized = 0
        self.worst = 0
        self.calls = 0
        real = hub_mod._event_bytes

        def sized(ev: Event) -> int:
            self.sized += 1
            return real(ev)

        monkeypatch.setattr(hub_mod, "_event_bytes", sized)

    def call(self, fn, *args):  # type: ignore[no-untyped-def]
        before = self.events.reads + self.sized
        out = fn(*args)
        self.worst = max(self.worst, self.events.reads + self.sized - before)
        self.calls += 1
        return out


def delete_all(env: Env, meter_patch: pytest.MonkeyPatch, n: int = N) -> tuple[int, Meter]:
    """Delete the prefix in the store, notify the hub with counted events."""
    result = env.store.apply(DeleteRangeRequest(b"p/", b"p0"))
    assert len(result.events) == n > BIG_REVISION_EVENTS
    counted = Counted(result.events)
    meter = Meter(meter_patch, counted)
    meter.call(env.hub.notify, result.revision, counted)
    return result.revision, meter


def take_all(meter: Meter, source, max_polls: int = 10_000) -> list[WatchResponse]:  # type: ignore[no-untyped-def]
    """Every response ``source`` delivers, each poll metered."""
    stream = source if isinstance(source, hub_mod.WatchStream) else source._stream
    out = []
    for _ in range(max_polls):
        resp = meter.call(stream.poll)
        if resp is not None:
            out.append(resp)
        elif not stream._fill_pending():
            return out
    raise AssertionError("the stream did not settle")


def keys_of(responses: list[WatchResponse]) -> list[bytes]:
    return [ev.kv.key for r in responses for ev in r.events]


def test_a_big_revision_is_matched_and_selected_a_bounded_step_at_a_time(monkeypatch):
    env = loaded()
    prefix = env.hub.create(b"p/", b"p0")
    single = env.hub.create(key(12_345))
    span = env.hub.create(key(100), key(2_100))
    from_key = env.hub.create(key(45_000), b"\0")
    with_prev = env.hub.create(b"p/", b"p0", prev_kv=True)
    no_delete = env.hub.create(b"p/", b"p0", filters=[WatchFilter.NODELETE])
    other = env.hub.create(b"q/", b"q0")
    watchers = (prefix, single, span, from_key, with_prev, no_delete, other)
    for w in watchers:
        assert w.poll().created
    rev, meter = delete_all(env, monkeypatch)

    got = {w: take_all(meter, w) for w in watchers}

    # no call looked at more than one step of events (the old notify: all of them, at once)
    assert meter.worst <= BIG_STEP_EVENTS + 1, meter.worst
    assert meter.calls >= N // BIG_STEP_EVENTS
    # every event once, in key order, in one response at the revision (no fragment asked)
    for w, expected in (
        (prefix, [key(i) for i in range(N)]),
        (single, [key(12_345)]),
        (span, [key(i) for i in range(100, 2_100)]),
        (from_key, [key(i) for i in range(45_000, N)]),
        (with_prev, [key(i) for i in range(N)]),
    ):
        responses = got[w]
        assert len(responses) == 1 and not responses[0].fragment
        assert responses[0].header.revision == rev and responses[0].watch_id == w.watch_id
        assert keys_of(responses) == expected
        assert {(ev.type, ev.kv.mod_revision) for ev in responses[0].events} == {(DELETE, rev)}
    assert all(ev.prev_kv is None for ev in got[prefix][0].events)
    assert all(
        ev.prev_kv is not None and ev.prev_kv.value == b"v" for ev in got[with_prev][0].events
    )
    assert got[no_delete] == [] and got[other] == []
    # the events the hub kept to drop a slice at a time are all dropped
    assert not env.hub._graveyard


def test_a_later_revision_never_overtakes_a_big_one(monkeypatch):
    env = loaded(SMALL)
    stream = env.hub.open_stream()
    stream.create(WatchCreateRequest(key=b"p/", range_end=b"p0"))
    stream.create(WatchCreateRequest(key=b"p/x"))
    assert [r.created for r in drain(stream)] == [True, True]
    rev, meter = delete_all(env, monkeypatch, SMALL)
    env.put(b"p/x", b"later")  # rev + 1, notified while the big revision is not delivered yet
    env.put(b"p/y", b"later")  # rev + 2
    responses = take_all(meter, stream)
    assert [r.header.revision for r in responses] == [rev, rev + 1, rev + 1, rev + 2]
    assert len(responses[0].events) == SMALL
    assert {r.watch_id for r in responses[1:3]} == {0, 1}  # the put, to both watchers
    assert meter.worst <= BIG_STEP_EVENTS + 1


def test_a_big_revision_is_fragmented_when_asked(monkeypatch):
    limits = WatchLimits(max_response_bytes=128 * 1024)
    env = loaded(SMALL, limits)
    w = env.hub.create(b"p/", b"p0", fragment=True)
    whole = env.hub.create(b"p/", b"p0")  # did not ask: one response
    assert w.poll().created and whole.poll().created
    rev, meter = delete_all(env, monkeypatch, SMALL)
    parts = take_all(meter, w)
    assert len(parts) > 2
    assert [p.fragment for p in parts] == [True] * (len(parts) - 1) + [False]
    assert keys_of(parts) == [key(i) for i in range(SMALL)]
    assert all(p.header.revision == rev for p in parts)
    sizes = [sum(hub_mod._event_bytes(ev) for ev in p.events) for p in parts]
    assert max(sizes) < limits.max_response_bytes
    assert len(take_all(meter, whole)) == 1
    assert meter.worst <= BIG_STEP_EVENTS + 1


def test_a_canceled_watcher_drops_its_big_revision_mid_way(monkeypatch):
    env = loaded(SMALL)
    w = env.hub.create(b"p/", b"p0")
    assert w.poll().created
    _, meter = delete_all(env, monkeypatch, SMALL)
    for _ in range(3):
        assert w.poll() is None  # steps under way
    w.cancel()
    rest = take_all(meter, w)
    assert len(rest) == 1 and rest[0].canceled and not rest[0].events
    assert not env.hub._graveyard


def test_a_big_revision_out_of_key_order_is_scanned_a_step_at_a_time(monkeypatch):
    env = loaded(n=0)
    n = BIG_REVISION_EVENTS + 1_000
    w = env.hub.create(key(1_000), key(2_000))
    assert w.poll().created
    ops = tuple(RequestOp.of(PutRequest(key(i), b"t")) for i in reversed(range(n)))
    result = env.store.apply(TxnRequest(success=ops))
    counted = Counted(result.events)
    meter = Meter(monkeypatch, counted)
    meter.call(env.hub.notify, result.revision, counted)
    responses = take_all(meter, w)
    assert len(responses) == 1
    assert keys_of(responses) == [key(i) for i in reversed(range(1_000, 2_000))]  # txn order
    assert meter.worst <= BIG_STEP_EVENTS + 1


# --- the encoders ---------------------------------------------------------------------------


def big_response(n: int = SMALL) -> WatchResponse:
    env = loaded(n)
    result = env.store.apply(DeleteRangeRequest(b"p/", b"p0", prev_kv=True))
    return WatchResponse(ResponseHeader(0, 0, result.revision, 0), 7, events=tuple(result.events))


def test_the_gateway_encodes_a_huge_line_in_pieces_of_bounded_events():
    resp = big_response()
    pieces = list(http_watch.encode_line_pieces(resp, 1, 2, 3))
    assert b"".join(pieces) == http_watch.encode_watch_line(resp, 1, 2, 3)
    counts = [p.count(b'"kv":') for p in pieces]
    assert max(counts) <= http_watch.ENCODE_STEP_EVENTS
    assert sum(counts) == SMALL and len(pieces) >= SMALL // http_watch.ENCODE_STEP_EVENTS


def test_grpc_encodes_a_huge_response_in_pieces_of_bounded_events():
    resp = big_response()
    pieces = list(encode_response_pieces(resp, 1, 2, 3))
    assert b"".join(pieces) == encode_response(resp, 1, 2, 3)
    counts = [len(rpc_pb2.WatchResponse.FromString(p).events) for p in pieces]
    assert max(counts) <= GRPC_STEP and sum(counts) == SMALL
    whole = rpc_pb2.WatchResponse.FromString(b"".join(pieces))
    assert whole.watch_id == 7 and whole.header.raft_term == 3 and len(whole.events) == SMALL


async def turns_while(coro) -> tuple[object, int]:  # type: ignore[no-untyped-def]
    """``coro``'s result, and how many loop turns another task got while it ran."""
    turns = 0
    done = False

    async def other() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    try:
        return await coro, turns
    finally:
        done = True
        await task


async def test_grpc_encoding_yields_to_the_loop_between_pieces():
    resp = big_response()
    data, turns = await turns_while(encode_response_in_steps(resp, 1, 2, 3))
    assert data == encode_response(resp, 1, 2, 3)
    assert turns >= SMALL // GRPC_STEP


class _Writes:
    """An aiohttp StreamResponse stand-in: records what is written, never waits."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self.pieces.append(data)


class _Service:
    cluster_id = 1
    member_id = 2
    raft_term = 3


async def test_the_gateway_writes_a_huge_revision_a_piece_per_loop_turn():
    env = loaded()
    stream = env.hub.open_stream()
    stream.create(WatchCreateRequest(key=b"p/", range_end=b"p0"))
    env.delete(b"p/", b"p0")
    stream.close_input()
    w = next(iter(stream.watchers.values()))
    w.cancel_with_reason("done")  # the stream ends after the big revision
    writes = _Writes()
    session = type("S", (), {"stream": stream})()
    _, turns = await turns_while(http_watch._write_responses(writes, session, _Service()))
    lines = b"".join(writes.pieces).splitlines()
    assert len(lines) == 3  # created, the revision, canceled
    assert lines[1].count(b'"kv":') == N
    assert len(writes.pieces) >= N // http_watch.ENCODE_STEP_EVENTS
    assert max(p.count(b'"kv":') for p in writes.pieces) <= http_watch.ENCODE_STEP_EVENTS
    # the hub's steps and the encoder's pieces each gave the loop a turn
    assert turns >= N // BIG_STEP_EVENTS + N // http_watch.ENCODE_STEP_EVENTS
    # the events the writer released are dropped a slice per loop turn, with no poll
    for _ in range(N):
        if not env.hub._graveyard:
            break
        await asyncio.sleep(0)
    assert not env.hub._graveyard


def test_a_stream_closed_mid_way_hands_the_revision_to_the_graveyard(monkeypatch):
    env = loaded(SMALL)
    stream = env.hub.open_stream()
    stream.create(WatchCreateRequest(key=b"p/", range_end=b"p0"))
    assert drain(stream)[0].created
    other = env.hub.create(b"p/", b"p0")  # shares the revision, is delivered in full
    assert other.poll().created
    buried: list[int] = []
    bury = env.hub._bury
    monkeypatch.setattr(env.hub, "_bury", lambda events: (buried.append(len(events)), bury(events)))
    _, meter = delete_all(env, monkeypatch, SMALL)
    assert stream.poll() is None  # under way
    stream.close()
    assert len(keys_of(take_all(meter, other))) == SMALL
    # the revision's own copy of the events and the delivered part: dropped a slice per poll
    assert sorted(buried) == [SMALL, SMALL]
    assert not env.hub._graveyard
    assert meter.worst <= BIG_STEP_EVENTS + 1


async def test_the_gateway_writes_a_huge_response_in_pieces_even_behind_a_small_one():
    """A replay that reaches a huge revision queues it as one response right behind
    ``created``: the writer's batching of ready responses must not encode it whole."""
    env = loaded(SMALL)
    rev = env.delete(b"p/", b"p0").revision
    stream = env.hub.open_stream()
    stream.create(WatchCreateRequest(key=b"p/", range_end=b"p0", start_revision=rev))
    stream.close_input()
    writes = _Writes()
    session = type("S", (), {"stream": stream})()
    task = asyncio.create_task(http_watch._write_responses(writes, session, _Service()))
    for _ in range(10_000):
        if b"".join(writes.pieces).count(b"\n") >= 2:
            break
        await asyncio.sleep(0)
    stream.close()
    await task
    lines = b"".join(writes.pieces).splitlines()
    assert b'"created":true' in lines[0] and lines[1].count(b'"kv":') == SMALL
    assert max(p.count(b'"kv":') for p in writes.pieces) <= http_watch.ENCODE_STEP_EVENTS
