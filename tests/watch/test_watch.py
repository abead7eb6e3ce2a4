"""The watch hub against etcd's watch semantics (mvcc/watchable_store.go, v3rpc/watch.go).

Each test names the behaviour it pins: key / range / prefix selection, history replay then
live events without gap or duplicate, filters, prev_kv, compacted start revisions, cancel,
bounded buffers for slow watchers, progress notifications, fragments, snapshot resets.
"""

import asyncio

import pytest

from kvserver.kvpb.errors import MSG_COMPACTED
from kvserver.kvpb.watch import WatchCreateRequest, WatchFilter
from kvserver.mvcc import (
    DeleteRangeRequest,
    EventType,
    KeyValue,
    MVCCStore,
    PutRequest,
    RequestOp,
    TxnRequest,
    prefix_range_end,
)
from kvserver.watch.hub import (
    MSG_DUPLICATE_WATCH_ID,
    MSG_EMPTY_WATCHER_RANGE,
    MSG_TOO_MANY_WATCHERS,
    MSG_WATCH_STOPPED,
    MSG_WATCHER_TOO_SLOW,
    OverflowPolicy,
    WatchCreateError,
    WatchHub,
    WatchLimits,
)

from .helpers import Env, drain, events_of

PUT = int(EventType.PUT)
DELETE = int(EventType.DELETE)

# ---------------------------------------------------------------------------------------------
# Selection and live delivery


def test_single_key_watch_sees_only_that_key_from_the_next_revision():
    env = Env()
    env.put(b"a")
    w = env.hub.create(b"a")
    created = w.poll()
    assert created.created and not created.canceled and created.watch_id == w.watch_id
    assert created.header.revision == env.store.revision == 2
    env.put(b"a", b"1")
    env.put(b"ab")
    env.put(b"b")
    env.delete(b"a")
    got = drain(w)
    assert events_of(got) == [(PUT, b"a", 3), (DELETE, b"a", 6)]
    assert [r.header.revision for r in got] == [3, 6]  # live: the events' revision
    assert all(r.watch_id == w.watch_id for r in got)


@pytest.mark.parametrize(
    ("key", "range_end", "expected"),
    [
        (b"ab", prefix_range_end(b"ab"), [b"ab", b"abc"]),  # prefix
        (b"ab", b"b", [b"ab", b"abc"]),  # [key, range_end)
        (b"ab", b"\0", [b"ab", b"abc", b"b", b"c"]),  # every key >= key
        (b"", b"\0", [b"a", b"ab", b"abc", b"b", b"c"]),  # every key (empty key -> "\0")
        (b"b", b"", [b"b"]),
    ],
)
def test_range_selection(key, range_end, expected):
    env = Env()
    w = env.hub.create(key, range_end)
    for k in (b"a", b"ab", b"abc", b"b", b"c"):
        env.put(k)
    assert [k for _, k, _ in events_of(drain(w))] == expected


def test_events_of_one_revision_come_in_one_response_in_store_order():
    """etcd notify: one WatchResponse per watcher per write txn."""
    env = Env()
    w = env.hub.create(b"a", b"\0")
    env.txn_put([b"c", b"a", b"b"])
    got = [r for r in drain(w) if r.events]
    assert len(got) == 1 and events_of(got) == [(PUT, b"c", 2), (PUT, b"a", 2), (PUT, b"b", 2)]


def test_filters_drop_puts_or_deletes_and_send_nothing_when_all_are_dropped():
    """etcd FiltersFromRequest + watcher.send: NOPUT / NODELETE; an all-filtered response is
    not sent."""
    env = Env()
    no_put = env.hub.create(b"k", filters=[WatchFilter.NOPUT])
    no_del = env.hub.create(b"k", filters=[WatchFilter.NODELETE])
    neither = env.hub.create(b"k", filters=[WatchFilter.NOPUT, WatchFilter.NODELETE])
    env.put(b"k")
    env.delete(b"k")
    env.put(b"k")
    assert events_of(drain(no_put)) == [(DELETE, b"k", 3)]
    assert events_of(drain(no_del)) == [(PUT, b"k", 2), (PUT, b"k", 4)]
    assert [r.created for r in drain(neither)] == [True]


def test_prev_kv_only_when_asked_live_and_replayed():
    """etcd: prev_kv is the key at mod_revision - 1, absent for a create."""
    env = Env()
    live_prev = env.hub.create(b"k", prev_kv=True)
    live_plain = env.hub.create(b"k")
    env.put(b"k", b"1")
    env.put(b"k", b"2")
    env.delete(b"k")
    for w in (live_prev, env.hub.create(b"k", start_revision=1, prev_kv=True)):
        evs = [e for r in drain(w) for e in r.events]
        assert [(e.kv.value, e.prev_kv.value if e.prev_kv else None) for e in evs] == [
            (b"1", None),
            (b"2", b"1"),
            (b"", b"2"),
        ]
    for w in (live_plain, env.hub.create(b"k", start_revision=1)):
        assert all(e.prev_kv is None for r in drain(w) for e in r.events)


# ---------------------------------------------------------------------------------------------
# Replay, then live


def test_replay_from_a_past_revision_then_live_without_gap_or_duplicate():
    env = Env(WatchLimits(replay_chunk_events=2, max_buffered_events=2))
    for i in range(7):
        env.put(b"k", b"%d" % i)  # revisions 2..8
    w = env.hub.create(b"k", start_revision=4)
    assert not w.synced
    got = [w.poll()]  # created
    # history arrives in chunks of at most 2 events; live writes land meanwhile
    got.append(w.poll())
    env.put(b"k", b"x")  # rev 9, while the watcher is still replaying
    got += drain(w)
    assert w.synced
    env.put(b"k", b"y")  # rev 10, live
    got += drain(w)
    assert [rev for _, _, rev in events_of(got)] == [4, 5, 6, 7, 8, 9, 10]
    # a truncated chunk never claims more than it delivered
    for r in got:
        if r.events:
            assert r.header.revision >= r.events[-1].kv.mod_revision


def test_notification_arriving_after_the_replay_read_it_is_not_delivered_twice():
    """The store applied revision 3, the hub has not been told yet; a watcher created now
    replays revision 3 from history, and the late notify for 3 is de-duplicated."""
    env = Env()
    env.put(b"k", b"1")
    env.put(b"k", b"2", defer=True)  # rev 3 applied, not notified
    past = env.hub.create(b"k", start_revision=2)
    now = env.hub.create(b"k")  # from store revision 3 + 1
    drain(past)
    env.flush()
    env.put(b"k", b"3")
    assert [rev for _, _, rev in events_of(drain(past))] == [4]
    assert [rev for _, _, rev in events_of(drain(now))] == [4]


def test_future_start_revision_waits_for_it():
    env = Env()
    w = env.hub.create(b"k", start_revision=4)
    assert w.synced
    for _ in range(4):
        env.put(b"k")  # revisions 2..5
    assert [rev for _, _, rev in events_of(drain(w))] == [4, 5]


def test_missed_notification_degrades_to_a_replay_not_a_gap():
    env = Env()
    w = env.hub.create(b"k")
    env.put(b"k", b"1")  # rev 2 notified
    env.put(b"k", b"2", defer=True)  # rev 3: the driver "forgets" to notify
    env.pending.clear()
    env.put(b"k", b"3")  # rev 4 notified: the hub sees the gap
    assert env.hub.stats["gaps"] == 1 and not w.synced
    assert [rev for _, _, rev in events_of(drain(w))] == [2, 3, 4]
    assert w.synced


def test_duplicate_or_stale_notification_is_ignored():
    env = Env()
    w = env.hub.create(b"k")
    res = env.put(b"k")
    env.hub.notify(res.revision, res.events)
    env.hub.notify(1, res.events)
    assert len(events_of(drain(w))) == 1


def test_notify_without_synced_watchers_does_not_look_at_the_events():
    """Cheap when nobody watches: the events are not even iterated."""

    class Untouchable:
        def __iter__(self):
            raise AssertionError("iterated")

        def __len__(self):
            raise AssertionError("measured")

    store = MVCCStore()
    hub = WatchHub(store)
    hub.notify(2, Untouchable())
    assert hub.revision == 2


# ---------------------------------------------------------------------------------------------
# Compaction


def test_compacted_start_revision_gets_created_then_compact_revision_and_canceled():
    """etcd chooseAll: minRev < compactRev -> WatchResponse{CompactRevision}, which v3rpc
    sends with canceled=true; the compact revision itself is still watchable."""
    env = Env()
    for _ in range(5):
        env.put(b"k")  # revisions 2..6
    env.store.compact(4)
    w = env.hub.create(b"k", start_revision=3)
    created, compacted = drain(w)
    assert created.created and not created.canceled
    assert compacted.canceled and compacted.compact_revision == 4 and not compacted.events
    assert compacted.header.revision == 0 and compacted.watch_id == w.watch_id
    assert w.done and w.poll() is None and env.hub.watcher_count == 0
    ok = env.hub.create(b"k", start_revision=4)
    assert [rev for _, _, rev in events_of(drain(ok))] == [4, 5, 6]


def test_compaction_during_a_replay_cancels_the_watcher():
    env = Env(WatchLimits(replay_chunk_events=1, max_buffered_events=1))
    for _ in range(6):
        env.put(b"k")  # revisions 2..7
    w = env.hub.create(b"k", start_revision=2)
    got = [w.poll(), w.poll()]  # created, revision 2
    env.store.compact(6)
    got += drain(w)
    assert [rev for _, _, rev in events_of(got)] == [2]
    assert got[-1].canceled and got[-1].compact_revision == 6
    assert env.hub.stats["compacted"] == 1


def test_negative_start_revision_is_refused_like_etcd():
    """etcd 3.5 v3rpc: StartRevision < 0 -> created + canceled, watch id -1, reason
    ErrCompacted."""
    env = Env()
    stream = env.hub.open_stream()
    assert stream.create(WatchCreateRequest(b"k", start_revision=-1)) is None
    (resp,) = drain(stream)
    assert (resp.created, resp.canceled, resp.watch_id, resp.cancel_reason) == (
        True,
        True,
        -1,
        MSG_COMPACTED,
    )
    with pytest.raises(WatchCreateError) as exc:
        env.hub.create(b"k", start_revision=-5)
    assert str(exc.value) == MSG_COMPACTED


# ---------------------------------------------------------------------------------------------
# Streams: ids, refusals, cancel


def test_stream_ids_refusals_and_cancel():
    env = Env(WatchLimits(max_watchers_per_stream=3))
    s = env.hub.open_stream()
    a = s.create(WatchCreateRequest(b"a"))
    b = s.create(WatchCreateRequest(b"b", watch_id=7))
    assert (a.watch_id, b.watch_id) == (0, 7)
    assert s.create(WatchCreateRequest(b"c", watch_id=7)) is None  # duplicate
    assert s.create(WatchCreateRequest(b"b", b"a")) is None  # empty range
    assert s.create(WatchCreateRequest(b"b", b"b")) is None
    assert s.create(WatchCreateRequest(b"c", watch_id=-3)) is None
    c = s.create(WatchCreateRequest(b"c"))
    assert c.watch_id == 1
    assert s.create(WatchCreateRequest(b"d")) is None  # a fourth watcher in this stream
    reasons = [r.cancel_reason for r in drain(s) if r.canceled]
    assert reasons == [
        MSG_DUPLICATE_WATCH_ID,
        MSG_EMPTY_WATCHER_RANGE,
        MSG_EMPTY_WATCHER_RANGE,
        "raftkv: watch_id must not be negative",
        MSG_TOO_MANY_WATCHERS,
    ]
    other = env.hub.open_stream()
    assert other.create(WatchCreateRequest(b"a")).watch_id == 0  # ids are per stream
    env.put(b"a")
    env.put(b"b")
    assert s.cancel(0) and not s.cancel(0) and not s.cancel(99)
    env.put(b"a")
    got = drain(s)
    assert [(r.watch_id, r.canceled, events_of([r])) for r in got] == [
        (7, False, [(PUT, b"b", 3)]),
        (0, True, []),
    ]
    assert got[-1].header.revision == env.store.revision - 1
    assert set(s.watchers) == {1, 7} and env.hub.watcher_count == 3


def test_cancel_drops_undelivered_responses():
    env = Env()
    w = env.hub.create(b"k")
    w.poll()
    for _ in range(3):
        env.put(b"k")
    w.cancel()
    (resp,) = drain(w)
    assert resp.canceled and resp.cancel_reason == "" and not resp.events
    env.put(b"k")
    assert w.poll() is None and w.done and env.hub.watcher_count == 0


def test_hub_wide_watcher_bound():
    env = Env(WatchLimits(max_watchers=2))
    env.hub.create(b"a")
    env.hub.create(b"b")
    with pytest.raises(WatchCreateError) as exc:
        env.hub.create(b"c")
    assert str(exc.value) == MSG_TOO_MANY_WATCHERS


def test_a_watcher_of_a_shared_stream_is_consumed_through_the_stream():
    env = Env()
    w = env.hub.open_stream().create(WatchCreateRequest(b"k"))
    with pytest.raises(TypeError):
        w.poll()


# ---------------------------------------------------------------------------------------------
# Bounded buffers


def test_slow_watcher_is_canceled_and_memory_stays_bounded():
    limits = WatchLimits(max_buffered_events=5, replay_chunk_events=5)
    env = Env(limits)
    slow = env.hub.create(b"k")
    fast = env.hub.create(b"k")
    seen_fast = []
    for i in range(1000):
        env.put(b"k", b"%d" % i)
        assert slow.buffered_events <= 5
        seen_fast += events_of(drain(fast))
    got = drain(slow)
    assert [rev for _, _, rev in events_of(got)] == [2, 3, 4, 5, 6]
    assert got[-1].canceled and got[-1].cancel_reason == MSG_WATCHER_TOO_SLOW
    assert slow.done and env.hub.stats["canceled_slow"] == 1
    assert len(seen_fast) == 1000  # the other watcher of the key is unaffected
    assert env.hub.watcher_count == 1


def test_byte_bound_counts_values():
    limits = WatchLimits(max_buffered_bytes=10_000)
    env = Env(limits)
    slow = env.hub.create(b"k")
    for _ in range(5):
        env.put(b"k", b"x" * 4000)
    assert slow.done and slow.buffered_bytes <= 10_000
    assert drain(slow)[-1].cancel_reason == MSG_WATCHER_TOO_SLOW


def test_one_revision_larger_than_the_bound_still_gets_through():
    env = Env(WatchLimits(max_buffered_events=2, replay_chunk_events=2))
    w = env.hub.create(b"", b"\0")
    env.txn_put([b"a", b"b", b"c", b"d"])
    assert not w.done and len(events_of(drain(w))) == 4


def test_resync_policy_catches_a_slow_watcher_up_from_history_exactly():
    limits = WatchLimits(
        max_buffered_events=4, replay_chunk_events=3, on_overflow=OverflowPolicy.RESYNC
    )
    env = Env(limits)
    w = env.hub.create(b"k", prev_kv=True)
    for i in range(50):
        env.put(b"k", b"%d" % i)
        assert w.buffered_events <= 4
    assert not w.done and not w.synced and env.hub.stats["resynced_slow"] >= 1
    got = drain(w)
    evs = [e for r in got for e in r.events]
    assert [e.kv.mod_revision for e in evs] == list(range(2, 52))
    assert [e.prev_kv.value if e.prev_kv else None for e in evs] == [None] + [
        b"%d" % i for i in range(49)
    ]
    assert w.synced
    env.put(b"k")
    assert events_of(drain(w)) == [(PUT, b"k", 52)]


# ---------------------------------------------------------------------------------------------
# Progress


def test_progress_tick_notifies_quiet_synced_watchers_only():
    """etcd sendLoop: every interval, a progress notification to each progress_notify watcher
    that was sent no events since the last tick; only synced watchers (watchable_store
    progress)."""
    env = Env(WatchLimits(replay_chunk_events=1, max_buffered_events=1))
    env.put(b"k")
    env.put(b"k")
    quiet = env.hub.create(b"q", progress_notify=True)
    busy = env.hub.create(b"k", progress_notify=True)
    behind = env.hub.create(b"k", start_revision=2, progress_notify=True)
    plain = env.hub.create(b"q")
    for w in (quiet, busy, plain):
        drain(w)
    behind.poll()  # created only: still replaying
    assert env.hub.progress_tick() == 2  # quiet and busy (nothing sent to busy yet)
    (p,) = drain(quiet)
    assert p.is_progress_notify and p.header.revision == env.store.revision == 3
    assert p.watch_id == quiet.watch_id
    assert drain(busy)[0].is_progress_notify
    env.put(b"k")
    assert events_of(drain(busy)) == [(PUT, b"k", 4)]
    assert env.hub.progress_tick() == 1  # busy got an event since: elided
    assert drain(quiet)[0].header.revision == 4 and drain(busy) == []
    assert drain(plain) == [] and not behind.synced
    # a progress response not yet taken is not duplicated
    env.hub.progress_tick()
    env.hub.progress_tick()
    assert len(drain(quiet)) == 1


def test_stream_progress_request_comes_after_queued_events_and_needs_all_synced():
    """etcd 3.5 RequestProgressAll: watch id -1, only if every watcher is synced, ordered
    after the responses already queued."""
    env = Env()
    s = env.hub.open_stream()
    s.create(WatchCreateRequest(b"a"))
    s.create(WatchCreateRequest(b"b"))
    env.put(b"a")
    env.put(b"b")
    assert s.request_progress()
    got = drain(s)
    assert [(r.watch_id, r.created, len(r.events)) for r in got] == [
        (0, True, 0),
        (1, True, 0),
        (0, False, 1),
        (1, False, 1),
        (-1, False, 0),
    ]
    assert got[-1].is_progress_notify and got[-1].header.revision == 3
    s.create(WatchCreateRequest(b"a", start_revision=1))  # replaying
    assert not s.request_progress()
    drain(s)
    assert s.request_progress()


# ---------------------------------------------------------------------------------------------
# Fragments


def test_large_responses_are_fragmented_when_asked():
    """etcd sendFragments: over the size limit and with at least two events, split; every
    part but the last has fragment=true."""
    env = Env(WatchLimits(max_response_bytes=300))
    frag = env.hub.create(b"", b"\0", fragment=True)
    whole = env.hub.create(b"", b"\0")
    env.txn_put([b"a", b"b", b"c", b"d", b"e"], value=b"x" * 100)
    parts = [r for r in drain(frag) if r.events]
    assert len(parts) > 1 and [r.fragment for r in parts] == [True] * (len(parts) - 1) + [False]
    assert events_of(parts) == events_of(drain(whole))
    assert all(r.header.revision == 2 for r in parts)
    env.put(b"a", b"x" * 1000)  # one event: never split
    (single,) = [r for r in drain(frag) if r.events]
    assert not single.fragment


# ---------------------------------------------------------------------------------------------
# Snapshot reset and shutdown


def test_reset_to_a_restored_store_continues_from_its_history():
    """A follower installs a snapshot that is ahead of it: watchers catch up by replaying the
    new store's history, without gap or duplicate."""
    env = Env()
    w = env.hub.create(b"k", prev_kv=True)
    env.put(b"k", b"1")  # rev 2 delivered live
    leader = MVCCStore.restore(env.store.serialize())
    for v in (b"2", b"3"):
        leader.put(b"k", v)  # revs 3, 4 happen on the leader only
    follower_store = MVCCStore.restore(leader.serialize())
    env.hub.reset(follower_store)
    env.store = follower_store
    env.put(b"k", b"4")  # rev 5 applied after the snapshot
    evs = [e for r in drain(w) for e in r.events]
    assert [(e.kv.mod_revision, e.kv.value) for e in evs] == [
        (2, b"1"),
        (3, b"2"),
        (4, b"3"),
        (5, b"4"),
    ]
    assert evs[1].prev_kv == KeyValue(b"k", b"1", 2, 2, 1)
    assert w.synced and env.hub.revision == 5


def test_reset_inside_a_revision_reads_that_revision_again_from_the_new_store():
    """A watcher catching up stopped inside a revision, just after a deletion at what became
    the compact revision; the restored store has no record of that deletion (a snapshot
    leaves it out), so its position inside the revision means nothing there. It must still
    get the put after the deletion, and the next revision, once each."""
    env = Env(WatchLimits(max_buffered_events=1, replay_chunk_events=1))
    env.put(b"y", b"1")  # rev 2
    w = env.hub.create(b"a", b"\0", start_revision=2)
    txn = TxnRequest(
        success=(
            RequestOp.of(PutRequest(b"x", b"2")),
            RequestOp.of(DeleteRangeRequest(b"y")),
            RequestOp.of(PutRequest(b"z", b"2")),
        )
    )
    env.apply(txn)  # rev 3: put x, delete y, put z
    env.put(b"x", b"3")  # rev 4
    got = []
    for _ in range(20):  # one chunk of history per poll: stop after the deletion
        resp = w.poll()
        if resp is not None:
            got.append(resp)
        if w._partial_skip == 2:  # read x and the deletion of y inside rev 3
            break
    else:
        raise AssertionError("the watcher never stopped inside revision 3")
    env.store.compact(3)
    restored = MVCCStore.restore(env.store.serialize())
    env.hub.reset(restored)
    env.store = restored
    got += drain(w)
    events = [e for e in events_of(got) if e != (int(EventType.DELETE), b"y", 3)]
    assert events == [
        (int(EventType.PUT), b"y", 2),
        (int(EventType.PUT), b"x", 3),
        (int(EventType.PUT), b"z", 3),
        (int(EventType.PUT), b"x", 4),
    ]


def test_close_cancels_every_watcher_and_ends_streams():
    env = Env()
    s = env.hub.open_stream()
    s.create(WatchCreateRequest(b"a"))
    w = env.hub.create(b"b")
    env.hub.close()
    assert [r.cancel_reason for r in drain(s) if r.canceled] == [MSG_WATCH_STOPPED]
    assert s.finished
    assert drain(w)[-1].cancel_reason == MSG_WATCH_STOPPED
    assert s.create(WatchCreateRequest(b"c")) is None
    assert drain(s)[0].cancel_reason == MSG_WATCH_STOPPED


def test_stream_close_forgets_everything():
    env = Env()
    s = env.hub.open_stream()
    s.create(WatchCreateRequest(b"a"))
    env.put(b"a")
    s.close()
    assert s.finished and s.poll() is None and env.hub.watcher_count == 0
    env.put(b"a")
    assert s.queued == 0


# ---------------------------------------------------------------------------------------------
# asyncio consumers


async def test_async_iteration_interleaved_with_writes():
    """``async for`` waits for new responses; a producer task writes while a consumer reads,
    including a replay that yields to the loop between chunks."""
    env = Env(WatchLimits(replay_chunk_events=3, max_buffered_events=3))
    for i in range(10):
        env.put(b"k", b"%d" % i)  # revisions 2..11
    w = env.hub.create(b"k", start_revision=2)
    received = []

    async def consume():
        async for resp in w:
            received.append(resp)
            if resp.events and resp.events[-1].kv.mod_revision == 31:
                w.cancel()

    async def produce():
        for i in range(20):
            env.put(b"k", b"p%d" % i)  # revisions 12..31
            await asyncio.sleep(0)

    consumer = asyncio.create_task(consume())
    await produce()
    await asyncio.wait_for(consumer, timeout=5)
    assert received[0].created and received[-1].canceled
    assert [rev for _, _, rev in events_of(received)] == list(range(2, 32))


async def test_async_stream_ends_after_close():
    env = Env()
    s = env.hub.open_stream()
    s.create(WatchCreateRequest(b"k"))
    got = []

    async def consume():
        async for resp in s:
            got.append(resp)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    env.put(b"k")
    await asyncio.sleep(0)
    s.close()
    await asyncio.wait_for(task, timeout=5)
    assert got[0].created and events_of(got[1:]) == [(PUT, b"k", 2)]
