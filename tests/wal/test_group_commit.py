"""Group commit is real: appends that arrive during an fsync share the next one.

Counted with an injected sync function that holds the first fsync until the test has
queued N more appends. The properties: N appends are covered by far fewer than N fsyncs
(here exactly one more), nothing is acknowledged before an fsync that started after it was
written, acknowledgements come in submission order, and failures reach every waiter (as
bookkeeper's journal does).
"""

import asyncio
import threading

import pytest

import wal
from raftpb import Entry, HardState
from tests.support.wait import wait_for
from wal import GroupCommitWriter

from .helpers import CountingSync, entries

N = 64
WAIT_S = 20.0
POLL_S = 0.001  # the waits here are short: poll often


@pytest.fixture
def setup(ram_path):
    sync = CountingSync()
    w = wal.create(
        f"{ram_path}/wal", b"m", segment_size_bytes=1 << 22, sync_fn=sync, prepare_ahead=False
    )
    yield w, sync
    sync.release.set()
    w.close()


def test_threads_saving_during_a_slow_fsync_share_the_next_one(setup):
    """The plain synchronous API: a sync leader covers every write made before it."""
    w, sync = setup
    base = sync.calls
    sync.hold_next = True
    first = threading.Thread(target=w.save, args=(HardState(term=1), entries(1, 1)))
    first.start()
    assert sync.entered.wait(20)
    order = threading.Lock()
    next_index = [2]

    def saver():
        with order:  # indexes must reach the file in order; the fsync happens outside
            i = next_index[0]
            next_index[0] += 1
            seq, need, errors = w.append([(None, None, entries(i, i), None)])
        assert need and errors == [None]
        w.sync_upto(seq)

    threads = [threading.Thread(target=saver) for _ in range(N)]
    for t in threads:
        t.start()
    # all N written, all waiting for a sync
    wait_for(lambda: next_index[0] == N + 2, WAIT_S, "all N saves written", interval_s=POLL_S)
    assert sync.calls == base + 1
    sync.release.set()
    for t in threads + [first]:
        t.join(20)
    assert sync.calls == base + 2  # N saves, one fsync
    w.close()
    r = wal.open(w.dir, prepare_ahead=False)
    assert r.read_all()[2] == entries(1, N + 1)
    r.close()


def test_public_save_from_many_threads_uses_few_fsyncs(setup):
    w, sync = setup
    base = sync.calls
    sync.hold_next = True
    first = threading.Thread(target=w.save, args=(HardState(term=1), []))
    first.start()
    assert sync.entered.wait(20)
    # term changes must be synced; each thread writes its own, in any order
    threads = [threading.Thread(target=w.save, args=(HardState(term=2 + k),)) for k in range(N)]
    for t in threads:
        t.start()
    wait_for(lambda: w._written_seq == N + 1, WAIT_S, "all saves written", interval_s=POLL_S)
    sync.release.set()
    for t in threads + [first]:
        t.join(20)
    assert sync.calls - base <= 3  # N + 1 saves: the held fsync and (nearly) one more


def test_writer_batches_submissions_made_during_an_fsync(setup):
    w, sync = setup
    base = sync.calls
    resolved = []  # (position, fsyncs done when it resolved)
    lock = threading.Lock()

    def done(pos):
        def cb(err):
            assert err is None
            with lock:
                resolved.append((pos, sync.calls))

        return cb

    with GroupCommitWriter(w) as writer:
        sync.hold_next = True
        writer.submit(HardState(term=1, vote=1), entries(1, 1), callback=done(0))
        assert sync.entered.wait(20)
        index = 1
        for k in range(1, N + 1):
            if k % 5 == 0:  # commit-only: needs no fsync, must not overtake those that do
                writer.submit(HardState(term=1, vote=1, commit=k), callback=done(k))
            else:
                index += 1
                writer.submit(None, entries(index, index), callback=done(k))
        assert not resolved
        sync.release.set()
        wait_for(lambda: len(resolved) == N + 1, WAIT_S, "every callback", interval_s=POLL_S)
        assert writer.batches == 2
    assert [pos for pos, _ in resolved] == list(range(N + 1))  # in submission order
    assert resolved[0][1] == base + 1  # after the held fsync
    assert all(calls == base + 2 for _, calls in resolved[1:])  # after the next one
    assert sync.calls == base + 2
    w.close()
    r = wal.open(w.dir, prepare_ahead=False)
    _, hs, ents = r.read_all()
    r.close()
    assert ents == entries(1, index)
    assert hs.commit == max(k for k in range(1, N + 1) if k % 5 == 0)


async def test_asyncio_appenders_are_released_together(setup):
    w, sync = setup
    base = sync.calls
    writer = GroupCommitWriter(w)
    try:
        sync.hold_next = True
        first = asyncio.ensure_future(writer.append(HardState(term=1), entries(1, 1)))
        while not sync.entered.is_set():
            await asyncio.sleep(0.001)
        tasks = [asyncio.ensure_future(writer.append(None, entries(i, i))) for i in range(2, N + 2)]
        while writer.submissions < N + 1:
            await asyncio.sleep(0)
        assert not any(t.done() for t in tasks)
        sync.release.set()
        await asyncio.wait_for(asyncio.gather(first, *tasks), 20)
        batches = writer.batches
    finally:
        writer.close()
    assert batches == 2 and sync.calls == base + 2


def test_a_failed_fsync_fails_every_waiter_of_the_batch_and_later_ones(setup):
    w, sync = setup
    with GroupCommitWriter(w) as writer:
        sync.hold_next = True
        f0 = writer.submit(HardState(term=1), entries(1, 1))
        assert sync.entered.wait(20)
        futs = [writer.submit(None, entries(i, i)) for i in range(2, 10)]
        sync.fail_with = OSError(5, "EIO")
        sync.release.set()
        for f in [f0] + futs:
            with pytest.raises(wal.WalFailedError):
                f.result(20)
        with pytest.raises(wal.WalFailedError):
            writer.submit(None, entries(10, 10)).result(20)


def test_an_invalid_item_fails_alone(setup):
    w, sync = setup
    with GroupCommitWriter(w) as writer:
        sync.hold_next = True
        f0 = writer.submit(HardState(term=1), entries(1, 1))
        assert sync.entered.wait(20)
        good = writer.submit(None, entries(2, 2))
        bad = writer.submit(None, [Entry(term=0, index=3, data=b"x")])
        good2 = writer.submit(None, entries(3, 3))
        sync.release.set()
        f0.result(20)
        good.result(20)
        good2.result(20)
        with pytest.raises(ValueError):
            bad.result(20)
    w.close()
    r = wal.open(w.dir, prepare_ahead=False)
    assert r.read_all()[2] == entries(1, 3)
    r.close()


def test_the_queue_is_bounded(setup):
    w, sync = setup
    with GroupCommitWriter(w, max_pending=4) as writer:
        sync.hold_next = True
        writer.submit(HardState(term=1), entries(1, 1))
        assert sync.entered.wait(20)
        futs = []
        producer = threading.Thread(
            target=lambda: futs.extend(writer.submit(None, entries(i, i)) for i in range(2, 12))
        )
        producer.start()
        # blocked: the queue holds 4
        wait_for(
            lambda: writer._space_waiters == 1, WAIT_S, "a blocked producer", interval_s=POLL_S
        )
        assert len(writer._queue) == 4 and producer.is_alive()
        sync.release.set()
        producer.join(20)
        for f in futs:
            f.result(20)
    assert writer.batches >= 3


def test_close_finishes_queued_appends_and_refuses_new_ones(setup):
    w, sync = setup
    writer = GroupCommitWriter(w)
    futs = [writer.submit(HardState(term=1), entries(i, i)) for i in range(1, 50)]
    writer.close()
    assert all(f.done() and f.exception() is None for f in futs)
    with pytest.raises(wal.WalStateError):
        writer.submit(None, entries(50, 50))


def test_interval_policy_acknowledges_at_write_even_while_an_fsync_is_stuck(ram_path):
    """interval=<ms> trades durability for latency (documented loss window): appends do not
    wait for the background fsync, which still runs and covers them."""
    sync = CountingSync()
    w = wal.create(
        f"{ram_path}/wal", b"m", sync_fn=sync, sync_policy="interval=5", prepare_ahead=False
    )
    try:
        with GroupCommitWriter(w) as writer:
            writer.submit(HardState(term=1), entries(1, 1)).result(20)
            sync.hold_next = True
            assert sync.entered.wait(20)  # the interval thread is inside a (held) fsync
            futs = [writer.submit(None, entries(i, i)) for i in range(2, 40)]
            for f in futs:
                f.result(20)  # acknowledged although that fsync is stuck
            calls = sync.calls
            sync.release.set()
            # and the data gets synced afterwards
            wait_for(lambda: sync.calls > calls, WAIT_S, "another fsync", interval_s=POLL_S)
    finally:
        sync.release.set()
        w.close()
