"""History replay through a revision of more records than a chunk looks at.

One delete of a large prefix is one revision of as many records as keys. A watcher that
replays from before it reads it a bounded number of records at a time, inside the revision
(``MVCCStore.replay_part`` stops there and continues with ``skip``), and still receives it
as etcd sends it: every matching event of the revision in one response (or consecutive
fragments), after every event before it and before any event after it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.mvcc import MVCCStore, PutRequest
from kvserver.watch.hub import WatchHub, WatchLimits

from .helpers import CountingSource, Env, drain, events_of

CHUNK = 500
PREFIX_KEYS = 5_000


def _env_with_a_huge_delete(
    max_response_bytes: int = 1536 * 1024,
) -> tuple[Env, CountingSource, int]:
    """Puts of PREFIX_KEYS keys under k/ (one revision each) around other keys, then one
    delete of all of them (one revision), then more puts; the delete's revision."""
    limits = WatchLimits(
        replay_chunk_scanned=CHUNK,
        replay_chunk_events=100,
        max_response_bytes=max_response_bytes,
    )
    env = Env(limits)
    source = CountingSource(env.store)
    env.hub = WatchHub(source, limits)
    env.put(b"a/before")
    for i in range(PREFIX_KEYS):
        env.put(b"k/%05d" % i)
    delete_rev = env.delete(b"k/", b"k0").revision
    env.put(b"a/after")
    env.put(b"k/new")
    return env, source, delete_rev


def test_a_prefix_watcher_gets_the_huge_revision_whole_from_bounded_reads():
    env, source, delete_rev = _env_with_a_huge_delete()
    w = env.hub.create(b"k/", b"k0", start_revision=1)
    responses = drain(w)
    got = events_of(responses)
    puts = [(0, b"k/%05d" % i, 3 + i) for i in range(PREFIX_KEYS)]
    deletes = [(1, b"k/%05d" % i, delete_rev) for i in range(PREFIX_KEYS)]
    assert got == [*puts, *deletes, (0, b"k/new", delete_rev + 2)]
    # the delete's events arrive in one response, of that revision only
    holding = [r for r in responses if any(e.kv.mod_revision == delete_rev for e in r.events)]
    assert len(holding) == 1 and len(holding[0].events) == PREFIX_KEYS
    assert holding[0].header.revision == delete_rev
    # no history read returned more events than a chunk may hold
    assert max(source.events_per_read) <= 100
    assert w.synced


def test_a_watcher_outside_the_prefix_reads_through_it_in_bounded_steps():
    env, source, delete_rev = _env_with_a_huge_delete()
    w = env.hub.create(b"a/", b"a0", start_revision=1)
    got = events_of(drain(w))
    assert got == [(0, b"a/before", 2), (0, b"a/after", delete_rev + 1)]
    # the delete alone is PREFIX_KEYS records: at least that many / CHUNK reads
    assert len(source.events_per_read) >= 2 * PREFIX_KEYS // CHUNK


def test_a_single_key_watcher_with_prev_kv_inside_the_huge_revision():
    env, _, delete_rev = _env_with_a_huge_delete()
    w = env.hub.create(b"k/04242", start_revision=1, prev_kv=True)
    responses = drain(w)
    assert events_of(responses) == [(0, b"k/04242", 3 + 4242), (1, b"k/04242", delete_rev)]
    deleted = responses[-1].events[-1]
    assert deleted.prev_kv is not None and deleted.prev_kv.mod_revision == 3 + 4242


def test_fragments_of_the_huge_revision_are_consecutive_and_complete():
    env, _, delete_rev = _env_with_a_huge_delete(max_response_bytes=64 * 1024)
    w = env.hub.create(b"k/", b"k0", start_revision=delete_rev, fragment=True)
    responses = drain(w)
    of_delete = [r for r in responses if r.events and r.events[0].kv.mod_revision == delete_rev]
    # 5,000 events of about 70 bytes: six parts of at most 64 KiB, all but the last marked
    assert len(of_delete) >= 5
    assert [r.fragment for r in of_delete] == [True] * (len(of_delete) - 1) + [False]
    assert responses.index(of_delete[-1]) - responses.index(of_delete[0]) == len(of_delete) - 1
    deleted = [(1, b"k/%05d" % i, delete_rev) for i in range(PREFIX_KEYS)]
    assert events_of(of_delete) == deleted


def test_a_compaction_inside_the_read_cancels_the_watcher_with_the_compact_revision():
    env, _, delete_rev = _env_with_a_huge_delete()
    w = env.hub.create(b"k/", b"k0", start_revision=delete_rev)
    stream = w._stream
    stream._fill()  # the first chunks: inside the delete's revision
    assert w.next_revision == delete_rev and not w.synced
    env.store.compact(delete_rev + 1)
    responses = drain(w)
    assert responses[-1].canceled and responses[-1].compact_revision == delete_rev + 1
    assert not events_of(responses)  # nothing of the unfinished revision went out


# --- the store's read, against the unbounded one ---------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 40)),
        st.tuples(st.just("del"), st.integers(0, 40), st.integers(1, 40)),
        st.tuples(st.just("txn"), st.lists(st.integers(0, 40), min_size=1, max_size=30)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    ops=_ops,
    chunk=st.integers(1, 20),
    max_events=st.integers(0, 8),
    lo=st.integers(0, 40),
    width=st.integers(0, 41),
    prev_kv=st.booleans(),
    start=st.integers(1, 10),
)
def test_reading_in_parts_gives_what_one_read_gives(
    ops, chunk, max_events, lo, width, prev_kv, start
):
    env = Env()
    for op in ops:
        if op[0] == "put":
            env.put(b"%03d" % op[1])
        elif op[0] == "del":
            env.delete(b"%03d" % op[1], b"%03d" % (op[1] + op[2]))
        else:
            env.txn_put(sorted({b"%03d" % k for k in op[1]}, reverse=True))
    store = env.store
    start = min(start, store.revision + 1)
    key = b"%03d" % lo
    range_end = b"" if width == 0 else (b"\0" if width == 41 else b"%03d" % (lo + width))
    whole, _ = store.replay(start, key, range_end, prev_kv=prev_kv)
    parts = []
    revision, skip = start, 0
    for _ in range(10_000):
        events, revision, skip = store.replay_part(
            revision,
            key,
            range_end,
            skip=skip,
            prev_kv=prev_kv,
            max_scanned=chunk,
            max_events=max_events,
        )
        assert not max_events or len(events) <= max_events
        parts.extend(events)
        if revision > store.revision:
            break
    else:
        raise AssertionError("the parts never reached the end of the history")
    assert parts == whole


def test_a_skip_never_reaches_past_its_own_revision():
    # a position counted in another copy of the log (one with more records at that
    # revision) must not make the read skip the records of the next revision
    store = MVCCStore()
    store.txn((), [PutRequest(b"a", b"1"), PutRequest(b"b", b"1")])  # rev 2: two records
    store.put(b"c", b"1")  # rev 3
    events, next_rev, next_skip = store.replay_part(2, b"\0", b"\0", skip=5)
    assert [(e.kv.key, e.kv.mod_revision) for e in events] == [(b"c", 3)]
    assert (next_rev, next_skip) == (4, 0)
