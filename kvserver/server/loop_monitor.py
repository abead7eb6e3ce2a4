"""How long the member's event loop goes without a turn, and what held it.

Everything that keeps a member in its cluster — ticks, heartbeats, votes, the WAL hand-off —
runs on one asyncio loop, so the one number that says whether anything data-sized holds it is
the loop's stall: the time between two turns beyond what a task asked to sleep. etcd warns
when an apply or a heartbeat send takes too long; this is the same idea at the level where
raftkv can stall.

Contract:

- ``LoopMonitor.start()`` (on the loop) runs a task that sleeps ``interval_s`` at a time and
  records each wake-up's lateness in ``stalls`` (a ``DurationHistogram``: ``/metrics``
  ``raftkv_loop_stall_seconds``) and the longest one seen.
- A watchdog thread checks every ``interval_s`` whether the loop task has run within
  ``warn_after_s``. When it has not, it logs one WARNING per stall with the stack the loop's
  thread is executing then (``sys._current_frames``), so an operator (or a test's log) sees
  what held the loop, not only that something did. The thread only reads a timestamp and,
  during a stall, one frame stack: it takes the interpreter lock rarely and briefly.
- ``stop()`` ends both.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

from kvserver.server.metrics import DurationHistogram

log = logging.getLogger(__name__)

# 1 ms .. ~16 s: a healthy loop stays in the lowest buckets; heartbeats fail near 1 s.
STALL_BUCKETS_SECONDS = tuple(0.001 * 2**i for i in range(15))
DEFAULT_INTERVAL_S = 0.02
DEFAULT_WARN_AFTER_S = 0.25


class LoopMonitor:
    def __init__(
        self, interval_s: float = DEFAULT_INTERVAL_S, warn_after_s: float = DEFAULT_WARN_AFTER_S
    ):
        self.interval_s = interval_s
        self.warn_after_s = warn_after_s
        self.stalls = DurationHistogram(STALL_BUCKETS_SECONDS)
        self.longest_stall_s = 0.0
        self.warnings = 0  # stalls the watchdog reported
        self._last_turn = time.monotonic()
        self._loop_thread_id = 0
        self._task: asyncio.Task | None = None
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def start(self) -> None:
        self._loop_thread_id = threading.get_ident()
        self._last_turn = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-monitor")
        self._stop.clear()
        self._watchdog = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._watchdog.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._watchdog is not None:
            await asyncio.to_thread(self._watchdog.join, 5.0)
            self._watchdog = None

    async def _run(self) -> None:
        interval = self.interval_s
        while True:
            before = time.monotonic()
            self._last_turn = before
            await asyncio.sleep(interval)
            late = max(0.0, time.monotonic() - before - interval)
            self.stalls.observe(late)
            if late > self.longest_stall_s:
                self.longest_stall_s = late

    def _watch(self) -> None:
        reported_turn = 0.0
        while not self._stop.wait(self.interval_s):
            last = self._last_turn
            stalled = time.monotonic() - last
            if stalled < self.warn_after_s or last == reported_turn:
                continue
            reported_turn = last
            self.warnings += 1
            frame = sys._current_frames().get(self._loop_thread_id)
            stack = "".join(traceback.format_stack(frame, limit=12)) if frame else "(no frame)\n"
            log.warning(
                "event loop stalled for %.0f ms so far; the loop thread is at:\n%s",
                stalled * 1000,
                stack.rstrip(),
            )

    def stats(self) -> dict:
        return {
            "loop_stall_seconds": self.stalls,
            "loop_longest_stall_seconds": self.longest_stall_s,
        }
