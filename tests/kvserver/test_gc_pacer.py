"""The GC pacer freezes what survives a full GC pass that took longer than its budget, so
later full passes walk only what was allocated since (see kvserver.server.gc_pacer)."""

from __future__ import annotations

import asyncio
import gc

from kvserver.server.gc_pacer import GCPacer


async def test_a_slow_full_pass_is_followed_by_a_freeze():
    pacer = GCPacer(budget_s=0.0)  # every full pass is "slow"
    pacer.start()
    try:
        kept = [[i] for i in range(10_000)]  # tracked objects that survive the pass
        before = gc.get_freeze_count()
        gc.collect()
        await asyncio.sleep(0)  # the freeze runs on the loop, after the pass
        assert pacer.full_passes >= 1 and pacer.freezes >= 1
        assert gc.get_freeze_count() >= before + len(kept)
    finally:
        pacer.stop()
        gc.unfreeze()


async def test_a_fast_full_pass_freezes_nothing_and_stop_unhooks():
    pacer = GCPacer(budget_s=3600.0)
    pacer.start()
    gc.collect()
    await asyncio.sleep(0)
    assert pacer.full_passes == 1 and pacer.freezes == 0
    assert pacer.stats()["gc_full_passes"] == 1
    pacer.stop()
    gc.collect()
    assert pacer.full_passes == 1
