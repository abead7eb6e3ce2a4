"""Keeps CPython's full garbage collections short on a member that holds millions of objects.

Why: every version of every key is a tracked object (a ``KeyValue``, its history list), so a
store of a million keys holds two to three million of them. CPython's cyclic GC runs a full
(generation 2) pass whenever the long-lived objects have grown by a quarter since the last
one, and a pass walks every tracked object that is not frozen: at a million keys it holds the
interpreter, and so the event loop and the raft task on it, for 0.4–0.7 s on this project's
machines, long enough for followers to miss heartbeats while a store is being loaded.

Contract: ``GCPacer.start()`` (on the member's loop) watches full passes (``gc.callbacks``).
When one took longer than ``budget_s``, the loop calls ``freeze_heap()`` right after it:
every object that survived the pass moves to the permanent generation, which later passes
skip. So a full pass only walks what was allocated since the last freeze, and stays near the
budget however large the store grows. Freezing just after a full pass keeps what it leaks
small: only objects that were alive then and later die inside a reference cycle are never
reclaimed (objects that die without a cycle are freed by reference counting as always). The
member also freezes after it has loaded its state at start-up and after it installs a
snapshot.

``freeze_heap()`` is ``gc.freeze()`` followed by a full collection, which finds nothing left
to walk (0.1 ms). Why the collection: CPython starts a full pass once the objects promoted
since the last one exceed a quarter of those the last one left behind, and ``gc.freeze()``
does not reset that count. Frozen alone, a heap whose last pass saw 300,000 objects waited
for 75,000 new long-lived ones before its next pass, and that pass walked all of them: at a
million keys, with the store's versions and the raft log's entries spread over a gigabyte of
heap, 30-60 ms of the loop (440 ns an object, mostly cache misses) every few seconds of a
write storm, whatever the budget. Counted from the empty pass instead, the next passes start
small and grow by a quarter each until one exceeds the budget and freezes again.

``start()`` also lowers the third GC threshold to 1 (``FULL_PASS_THRESHOLD``): CPython
considers a full pass after that many collections of the middle generation plus one, two
instead of eleven (with CPython's first threshold of 700, about every 15,000 net
allocations instead of every 85,000). With eleven,
a write storm promoted 40,000-80,000 versions and raft entries between two passes whatever
was frozen, and each pass walked them all. ``stop()`` puts the threshold back.

Measured at a million keys with 16 clients putting (``benchmarks/scale.py``, snapshot
storm): full passes during the storm went from 33-66 ms of CPU every few seconds to at most
15 ms, and a member that was stopped after three storms (about 45 freezes) found 0-27
unreachable objects when it unfroze everything: the freezes leak next to nothing.

``stats()`` gives the counts for ``/metrics``: full passes, freezes, the longest pass.

``collect_young_less_often()`` is for a serving process (a member, a client front end): it
raises the first threshold from CPython's 700 to ``YOUNG_THRESHOLD``. Each call in flight
holds a few dozen tracked objects (its stream, context, task, futures, tuples) for a few
milliseconds; at 700 a young pass ran every few calls and found most of them alive, walked
them and promoted them to the middle generation, where they were walked again, and each
promotion counts toward the next full pass. At 20,000 most of them have died by the next
young pass. Under 64 clients putting through etcd's Go client, three members on two cores,
the leader, its front end and the followers each spent about 5 % less CPU per put (young
and middle passes had been 7-10 % of the leader's and the front end's CPU in ``perf``).
100,000 did no better. Full passes come about 30 times rarer, and each walks what was
promoted since the last one (the pacer above still freezes after a slow one).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

DEFAULT_BUDGET_S = 0.01
YOUNG_THRESHOLD = 20_000  # the first value of gc.set_threshold in a serving process
FULL_PASS_THRESHOLD = 1  # the third value of gc.set_threshold while the pacer runs
SLOW_PASS_WARNING_S = 0.1

log = logging.getLogger(__name__)


def freeze_heap() -> None:
    """Move every tracked object to the permanent generation, and count CPython's trigger
    for the next full pass from nothing (see the module docstring)."""
    gc.freeze()
    gc.collect()


def collect_young_less_often() -> None:
    """Young passes every ``YOUNG_THRESHOLD`` net allocations (see the module docstring);
    the other two thresholds are kept."""
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])


class GCPacer:
    def __init__(self, budget_s: float = DEFAULT_BUDGET_S):
        self._loop: asyncio.AbstractEventLoop | None = None
        self.budget_s = budget_s
        self._started_at = 0.0
        self.full_passes = 0
        self.freezes = 0
        self.longest_pass_s = 0.0
        self._freezing = False  # the empty pass of freeze_heap() is not one to count
        self._thresholds: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # was, set

    def start(self) -> None:
        """Watch full passes; freezes are run on the calling coroutine's loop."""
        self._loop = asyncio.get_running_loop()
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        if self._thresholds is None:
            was = gc.get_threshold()
            gc.set_threshold(*was[:2], FULL_PASS_THRESHOLD)
            self._thresholds = (was, gc.get_threshold())

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._thresholds is not None:
            was, ours = self._thresholds
            self._thresholds = None
            if gc.get_threshold() == ours:  # not changed since (another pacer, a test)
                gc.set_threshold(*was)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collector, on whichever thread allocated: only measure here, and
        # leave the freeze to the loop.
        if info.get("generation") != 2 or self._freezing:
            return
        if phase == "start":
            self._started_at = time.perf_counter()
            return
        took = time.perf_counter() - self._started_at
        self.full_passes += 1
        self.longest_pass_s = max(self.longest_pass_s, took)
        if took > SLOW_PASS_WARNING_S:
            log.warning("a full GC pass took %.0f ms (the event loop waited for it)", took * 1e3)
        if took > self.budget_s and self._loop is not None:
            self.freezes += 1
            try:
                self._loop.call_soon_threadsafe(self._freeze)
            except RuntimeError:  # the loop is closed: the member is stopping
                pass

    def _freeze(self) -> None:
        self._freezing = True
        try:
            freeze_heap()
        finally:
            self._freezing = False

    def stats(self) -> dict[str, float]:
        return {
            "gc_full_passes": self.full_passes,
            "gc_freezes": self.freezes,
            "gc_longest_full_pass_seconds": self.longest_pass_s,
        }
