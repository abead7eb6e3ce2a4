"""The loop monitor measures event-loop stalls and names what held the loop."""

from __future__ import annotations

import asyncio
import logging
import time

from kvserver.server.loop_monitor import LoopMonitor


def hold_the_loop_for(seconds: float) -> None:
    time.sleep(seconds)  # the stall under test: synchronous work on the loop's thread


async def test_a_stall_is_measured_and_reported_with_the_stack(caplog):
    monitor = LoopMonitor(interval_s=0.01, warn_after_s=0.05)
    monitor.start()
    try:
        with caplog.at_level(logging.WARNING, logger="kvserver.server.loop_monitor"):
            await asyncio.sleep(0.03)  # the monitor task runs at least once
            hold_the_loop_for(0.3)
            for _ in range(200):  # until the monitor task has woken up late once
                if monitor.longest_stall_s >= 0.2:
                    break
                await asyncio.sleep(0.01)
        assert monitor.longest_stall_s >= 0.2
        assert monitor.warnings == 1  # one report per stall, not one per watchdog check
        reports = [r.getMessage() for r in caplog.records if "event loop stalled" in r.message]
        assert len(reports) == 1 and "hold_the_loop_for" in reports[0]
        buckets, _ = monitor.stalls.snapshot()
        below_100ms = max(n for le, n in buckets if le != "+Inf" and float(le) < 0.1)
        assert buckets[-1][1] > below_100ms  # the stall landed in a bucket above 100 ms
    finally:
        await monitor.stop()
