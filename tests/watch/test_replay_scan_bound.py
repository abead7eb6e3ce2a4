"""A replay reads a bounded number of log records per chunk, matching or not.

A watcher of one key that starts at an old revision, in a history made mostly of other
keys' changes, must catch up in many small reads (one per stream poll, so one per loop turn
in a server), not in one walk of the whole log, and still get every event exactly once.
"""

from __future__ import annotations

from kvserver.watch.hub import WatchHub, WatchLimits

from .helpers import CountingSource, Env, drain, events_of


def test_a_sparse_replay_reads_in_bounded_chunks_and_loses_nothing():
    env = Env(WatchLimits(replay_chunk_scanned=50))
    source = CountingSource(env.store)
    env.hub = WatchHub(source, WatchLimits(replay_chunk_scanned=50))
    expected = []
    for i in range(2_000):
        result = env.put(b"other/%04d" % i)
        if i % 400 == 0:
            result = env.put(b"watched", b"%d" % i)
            expected.append(result.revision)
    w = env.hub.create(b"watched", start_revision=2)
    got = drain(w)
    assert [rev for _, _, rev in events_of(got)] == expected
    assert w.synced
    assert all(read["max_scanned"] == 50 for read in source.reads)
    assert len(source.reads) >= 2_000 // 50  # many bounded reads, not one walk of the log
    env.put(b"watched", b"live")
    assert [rev for _, _, rev in events_of(drain(w))] == [env.store.revision]


def test_replay_continues_from_where_it_stopped():
    env = Env()
    for i in range(30):
        env.put(b"k%02d" % (i % 3))
    events, next_rev = env.store.replay(2, b"k01", max_scanned=10)
    assert next_rev == 12 and [e.kv.mod_revision for e in events] == [3, 6, 9]
    events, next_rev = env.store.replay(next_rev, b"k01", max_scanned=100)
    assert next_rev == env.store.revision + 1
    assert [e.kv.mod_revision for e in events] == list(range(12, 32, 3))
