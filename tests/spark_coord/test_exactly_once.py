"""exactly_once (Spark-free part): a replayed batch id is skipped once its marker is written;
a failed batch leaves no marker; a fenced wrapper stops once the lock is lost; pickling."""

import pickle

import pytest

from kvserver.spark.exactly_once import exactly_once
from kvserver.spark.fencing import FencedOutError
from kvserver.spark.lock import FencedLock


def test_replayed_batch_is_skipped(client):
    seen = []
    sink = exactly_once(lambda df, bid: seen.append((df, bid)), "replay", client)
    sink("batch-0", 0)
    sink("batch-1", 1)
    sink("batch-1 replayed", 1)  # Spark replays the last batch after a driver crash
    sink("batch-0 replayed", 0)
    assert seen == [("batch-0", 0), ("batch-1", 1)]
    assert sink.ran == [0, 1] and sink.skipped == [1, 0]
    assert sink.done_batches() == [0, 1] and sink.is_done(1) and not sink.is_done(2)
    # Another process (a restarted driver) sees the same markers.
    again = exactly_once(lambda df, bid: seen.append((df, bid)), "replay", client.endpoints)
    again("batch-1 after restart", 1)
    assert len(seen) == 2 and again.skipped == [1]
    again.close()


def test_failed_batch_leaves_no_marker_and_runs_again(client):
    calls = []

    def flaky(df, bid):
        calls.append(bid)
        if len(calls) == 1:
            raise RuntimeError("sink down")

    sink = exactly_once(flaky, "flaky", client)
    with pytest.raises(RuntimeError, match="sink down"):
        sink(None, 7)
    assert not sink.is_done(7)
    sink(None, 7)
    sink(None, 7)
    assert calls == [7, 7] and sink.is_done(7)


def test_fenced_wrapper_refuses_once_the_lock_is_lost(client):
    lock = FencedLock(client, "eo-fenced", ttl=5)
    fence = lock.acquire(timeout=10)
    ran = []
    sink = exactly_once(lambda df, bid: ran.append(bid), "eo-fenced", client, fence=fence)
    sink(None, 0)
    lock.release()
    with pytest.raises(FencedOutError, match="marker of batch 1 refused"):
        sink(None, 1)  # the side effect ran (the window), the marker is refused
    assert ran == [0, 1] and not sink.is_done(1)
    guarded = exactly_once(lambda df, bid: ran.append(bid), "eo-fenced", client, fence=lock)
    with pytest.raises(RuntimeError, match="not held"):
        guarded(None, 2)  # a released lock guards nothing: refused before running
    assert ran == [0, 1]


def nothing(df, batch_id):
    pass


def test_forget_below_and_pickling(client):
    sink = exactly_once(nothing, "forget", client)
    for bid in range(5):
        sink(None, bid)
    assert sink.forget_below(3) == 3
    assert sink.done_batches() == [3, 4]
    copy = pickle.loads(pickle.dumps(sink))
    copy(None, 4)
    assert copy.skipped == [4]
    copy.close()
    with pytest.raises(ValueError):
        sink(None, -1)
