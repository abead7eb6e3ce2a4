"""Deadlines for the node's waiters, checked on its ticks instead of a timer each.

``asyncio.timeout`` starts and stops a loop timer per call: several microseconds of the
raft loop for every put and every linearizable read, a few percent of all it does per
request. A node's waiters (a proposal's answer, a read's index) only need their deadline
kept to within a heartbeat interval, so ``Expiry`` keeps them in a heap and the node's
ticker fails the overdue ones.

- ``add(deadline, fut)``: ``fut`` fails with ``Expired`` once ``expire(now)`` runs with
  ``now >= deadline``, unless it is done by then.
- ``expire(now)``: fails every overdue waiter still pending; returns how many.
- Done waiters are dropped as their deadlines pass, and all at once when they make up most
  of the heap, so it holds about as many entries as waiters are pending.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class Expired(Exception):
    """A waiter's deadline passed (the waiting code turns it into its own error)."""


class Expiry:
    __slots__ = ("_heap", "_order", "_compact_at")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()  # ties: the earlier added first, futures never compared
        self._compact_at = 1024

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, deadline: float, fut: asyncio.Future) -> None:
        heap = self._heap
        heapq.heappush(heap, (deadline, next(self._order), fut))
        if len(heap) >= self._compact_at:
            self._compact()

    def expire(self, now: float) -> int:
        heap = self._heap
        failed = 0
        while heap and heap[0][0] <= now:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_exception(Expired())
                failed += 1
        return failed

    def _compact(self) -> None:
        live = [entry for entry in self._heap if not entry[2].done()]
        heapq.heapify(live)
        self._heap = live
        self._compact_at = max(1024, 2 * len(live))
