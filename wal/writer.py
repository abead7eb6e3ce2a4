"""Group commit: a writer thread that batches appends and releases them after one fsync.

The node driver runs an asyncio loop and must not block on fsync. It hands each Ready's
worth of data (snapshot record, entries, hard state) to a ``GroupCommitWriter`` and awaits
``append(...)`` (or waits on the ``Future`` from ``submit(...)``)::

    submitters ──▶ queue (bounded) ──▶ writer thread: take all queued ─▶ one pwrite
                                                      ─▶ one fdatasync (if any needs it)
                                                      ─▶ resolve futures, in order

While the writer is inside fdatasync (the GIL is released) new submissions queue up; the
next round takes them all, so N concurrent appends cost about two fsyncs, not N.

Guarantees:
* data is written in submission order; futures resolve in submission order, and a future
  resolves only after an fsync that started after its data was written (policy ``always``;
  under ``interval``/``never`` it resolves once written, see ``wal.policy``);
* an append that does not need durability (only a commit-index change, etcd's MustSync)
  still waits for the fsync of earlier appends in its batch, never overtakes them;
* a failed write or fsync fails every pending and later append (WalFailedError); an
  invalid item (ValueError) fails alone and writes nothing.

Bounds: at most ``max_pending`` queued submissions (``submit`` blocks when full, which
throttles producers; the queue drains in whole batches, so the wait is one fsync at most),
and at most ``max_batch_items`` submissions / ``max_batch_entries`` entries per write.
asyncio waiters are woken with one ``call_soon_threadsafe`` per loop per batch.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import cast

from raftpb import EntryFields, HardStateFields, WalSnapshotFields
from wal.errors import WalStateError
from wal.wal import WAL, SaveItem

DEFAULT_MAX_PENDING = 65_536
DEFAULT_MAX_BATCH_ITEMS = 8_192
DEFAULT_MAX_BATCH_ENTRIES = 65_536


# A queued submission is a tuple (item, waiter, loop): item = (snapshot, hard_state,
# entries, must_sync) as WAL.append takes it; waiter = a concurrent Future, an asyncio
# future (then loop is its loop) or a callback. Tuples: this is per append, keep it cheap.
Callback = Callable[[BaseException | None], None]
Waiter = Future[None] | asyncio.Future[None] | Callback
Submission = tuple[SaveItem, Waiter, asyncio.AbstractEventLoop | None]
Settlement = tuple[asyncio.Future[None], BaseException | None]


class GroupCommitWriter:
    """Batches appends to ``wal`` on a dedicated thread. Close it before the WAL."""

    def __init__(
        self,
        wal: WAL,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_batch_items: int = DEFAULT_MAX_BATCH_ITEMS,
        max_batch_entries: int = DEFAULT_MAX_BATCH_ENTRIES,
    ) -> None:
        if min(max_pending, max_batch_items, max_batch_entries) < 1:
            raise ValueError("writer bounds must be >= 1")
        self._wal = wal
        self._max_pending = max_pending
        self._max_batch_items = max_batch_items
        self._max_batch_entries = max_batch_entries
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the writer waits for submissions
        self._space = threading.Condition(self._lock)  # submitters wait for queue space
        self._queue: collections.deque[Submission] = collections.deque()
        self._closed = False
        self._writer_idle = False
        self._space_waiters = 0
        self.batches = 0  # write rounds done (statistics for tests and benchmarks)
        self.submissions = 0
        self._thread = threading.Thread(target=self._run, name="wal-group-commit", daemon=True)
        self._thread.start()

    # --- submitting ------------------------------------------------------------------------

    def submit(
        self,
        hard_state: HardStateFields | None = None,
        entries: Sequence[EntryFields] = (),
        snapshot: WalSnapshotFields | None = None,
        *,
        must_sync: bool | None = None,
        callback: Callback | None = None,
    ) -> Future[None] | None:
        """Queue one append: a snapshot record (if given), then ``entries``, then
        ``hard_state``. Returns a Future that resolves (to None) when the append is durable,
        or, with ``callback``, calls ``callback(error_or_None)`` on the writer thread instead
        (it must be quick and must not raise) and returns None."""
        if callback is not None:
            self._enqueue(((snapshot, hard_state, entries, must_sync), callback, None))
            return None
        fut: Future[None] = Future()
        self._enqueue(((snapshot, hard_state, entries, must_sync), fut, None))
        return fut

    async def append(
        self,
        hard_state: HardStateFields | None = None,
        entries: Sequence[EntryFields] = (),
        snapshot: WalSnapshotFields | None = None,
        *,
        must_sync: bool | None = None,
    ) -> None:
        """``submit`` for asyncio: returns once the append is durable."""
        loop = asyncio.get_running_loop()
        afut: asyncio.Future[None] = loop.create_future()
        self._enqueue(((snapshot, hard_state, entries, must_sync), afut, loop))
        await afut

    def _enqueue(self, sub: Submission) -> None:
        with self._lock:
            while True:
                if self._closed:
                    raise WalStateError("the group-commit writer is closed")
                if len(self._queue) < self._max_pending:
                    break
                self._space_waiters += 1
                try:
                    self._space.wait()
                finally:
                    self._space_waiters -= 1
            self._queue.append(sub)
            self.submissions += 1
            if self._writer_idle:
                self._work.notify()

    # --- the writer thread -----------------------------------------------------------------

    def _take_batch(self) -> list[Submission]:
        q = self._queue
        if len(q) <= self._max_batch_items and len(q) * 16 <= self._max_batch_entries:
            # the usual case: everything, unless entries are many (then count them)
            if sum(len(sub[0][2] or ()) for sub in q) <= self._max_batch_entries:
                batch = list(q)
                q.clear()
                return batch
        batch = []
        entries = 0
        while q and len(batch) < self._max_batch_items:
            n = len(q[0][0][2] or ())
            if batch and entries + n > self._max_batch_entries:
                break
            batch.append(q.popleft())
            entries += n
        return batch

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._writer_idle = True
                    self._work.wait()
                    self._writer_idle = False
                if not self._queue:
                    return  # closed and drained
                batch = self._take_batch()
                if self._space_waiters:
                    self._space.notify_all()
            self._process(batch)

    def _process(self, batch: list[Submission]) -> None:
        wal = self._wal
        failure: BaseException | None = None
        errors: list[ValueError | None] = []
        try:
            seq, need_sync, errors = wal.append([sub[0] for sub in batch])
            if need_sync:
                wal.sync_upto(seq)
        except BaseException as e:  # noqa: BLE001 - handed to every waiter of the batch
            failure = e
        self.batches += 1
        by_loop: dict[asyncio.AbstractEventLoop, list[Settlement]] = {}
        for i, (_, waiter, loop) in enumerate(batch):
            err = failure if failure is not None else errors[i]
            if loop is not None:
                items = by_loop.get(loop)
                if items is None:
                    items = by_loop[loop] = []
                items.append((cast("asyncio.Future[None]", waiter), err))  # loop: its future
            elif isinstance(waiter, Future):
                try:
                    if err is None:
                        waiter.set_result(None)
                    else:
                        waiter.set_exception(err)
                except InvalidStateError:
                    pass  # cancelled by its owner
            else:
                try:
                    cast(Callback, waiter)(err)  # neither kind of future: a callback
                except Exception:  # noqa: BLE001 - a callback must not kill the writer
                    pass
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, items)
            except RuntimeError:
                pass  # the loop is closed: nobody is waiting any more

    # --- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse new submissions, finish the queued ones, stop the thread."""
        with self._lock:
            self._closed = True
            self._work.notify_all()
            self._space.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> GroupCommitWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _settle(items: list[Settlement]) -> None:
    for afut, err in items:
        if not afut.done():
            if err is None:
                afut.set_result(None)
            else:
                afut.set_exception(err)
