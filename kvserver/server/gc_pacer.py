"""Keeps CPython's full garbage collections short on a member that holds millions of objects.

Why: every version of every key is a tracked object (a ``KeyValue``, its history list), so a
store of a million keys holds two to three million of them. CPython's cyclic GC runs a full
(generation 2) pass whenever the long-lived objects have grown by a quarter since the last
one, and a pass walks every tracked object that is not frozen: at a million keys it holds the
interpreter, and so the event loop and the raft task on it, for 0.4–0.7 s on this project's
machines, long enough for followers to miss heartbeats while a store is being loaded.

Contract: ``GCPacer.start()`` (on the member's loop) watches full passes (``gc.callbacks``). When one took longer than
``budget_s``, the loop calls ``gc.freeze()`` right after it: every object that survived the
pass moves to the permanent generation, which later passes skip. So a full pass only walks
what was allocated since the last freeze, and stays near the budget however large the store
grows. Freezing just after a full pass keeps what it leaks small: only objects that were
alive then and later die inside a reference cycle are never reclaimed (objects that die
without a cycle are freed by reference counting as always). The member also freezes after
it has loaded its state at start-up and after it installs a snapshot.

``stats()`` gives the counts for ``/metrics``: full passes, freezes, the longest pass.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

DEFAULT_BUDGET_S = 0.02
SLOW_PASS_WARNING_S = 0.1

log = logging.getLogger(__name__)


class GCPacer:
    def __init__(self, budget_s: float = DEFAULT_BUDGET_S):
        self._loop: asyncio.AbstractEventLoop | None = None
        self.budget_s = budget_s
        self._started_at = 0.0
        self.full_passes = 0
        self.freezes = 0
        self.longest_pass_s = 0.0

    def start(self) -> None:
        """Watch full passes; freezes are run on the calling coroutine's loop."""
        self._loop = asyncio.get_running_loop()
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collector, on whichever thread allocated: only measure here, and
        # leave the freeze to the loop.
        if info.get("generation") != 2:
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
                self._loop.call_soon_threadsafe(gc.freeze)
            except RuntimeError:  # the loop is closed: the member is stopping
                pass

    def stats(self) -> dict[str, float]:
        return {
            "gc_full_passes": self.full_passes,
            "gc_freezes": self.freezes,
            "gc_longest_full_pass_seconds": self.longest_pass_s,
        }
