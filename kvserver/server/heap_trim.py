"""Gives the memory a member has freed back to the operating system.

Why: CPython allocates every object of more than 512 bytes (a raft entry holding a txn of
many puts, a snapshot chunk, a large value) with the C library's ``malloc``. glibc keeps what
is freed inside its heaps for reuse and returns to the system only the free space at the very
top of a heap. So when a member drops a large amount of data at once -- the raft log
entries a snapshot made redundant (hundreds of megabytes after loading a million keys), the
old store after installing a leader's snapshot, the versions a compaction cut -- its
resident memory stays at the high-water mark. ``malloc_trim(0)`` hands every whole free page
inside the heaps back to the kernel; the next allocations fault fresh pages in as needed.
Measured while writing this: 90 MB of freed 38 KB entries stayed resident until a
``malloc_trim(0)`` of 7 ms returned them.

Contract: ``HeapTrimmer.request(reason)`` is called on the member's event loop after such a
drop (``requested`` counts the reasons).
The trim runs in a worker thread (ctypes releases the interpreter lock around the call, so
the loop keeps running; glibc locks one arena at a time while it trims it). At most one trim
runs at a time; requests made while one runs are folded into one more trim after it. Where
the C library has no ``malloc_trim`` (not glibc), ``request`` does nothing. ``stats()`` gives
the counts for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections import Counter
from collections.abc import Callable

log = logging.getLogger(__name__)


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to call
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


SLOW_TRIM_S = 0.05  # a trim this long is logged at INFO (the loop may have waited on it)


class HeapTrimmer:
    def __init__(self, malloc_trim: Callable[[int], int] | None = None):
        self._malloc_trim = malloc_trim if malloc_trim is not None else _find_malloc_trim()
        self._task: asyncio.Task | None = None
        self._again = False
        self.requested: Counter[str] = Counter()
        self.trims = 0
        self.seconds_total = 0.0

    @property
    def available(self) -> bool:
        return self._malloc_trim is not None

    def request(self, reason: str) -> None:
        """Trim soon, in a worker thread; a no-op without ``malloc_trim`` or a running loop."""
        self.requested[reason] += 1
        if self._malloc_trim is None:
            return
        if self._task is not None:
            self._again = True
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the member's loop (a replay, a tool)
            return
        self._task = loop.create_task(self._run(), name="heap-trim")

    async def _run(self) -> None:
        trim = self._malloc_trim
        assert trim is not None
        try:
            while True:
                self._again = False
                started = time.perf_counter()
                await asyncio.to_thread(trim, 0)
                took = time.perf_counter() - started
                self.trims += 1
                self.seconds_total += took
                # The loop waits on the allocator's lock while a trim runs: say so when long.
                level = logging.INFO if took >= SLOW_TRIM_S else logging.DEBUG
                log.log(level, "malloc_trim took %.1f ms", took * 1e3)
                if not self._again:
                    return
        finally:
            self._task = None

    async def wait_idle(self) -> None:
        """Until no trim runs (for tests and an orderly stop)."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def stats(self) -> dict[str, float]:
        return {"heap_trims": self.trims, "heap_trim_seconds": self.seconds_total}
