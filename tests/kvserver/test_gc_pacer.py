"""The GC pacer freezes what survives a full GC pass that took longer than its budget, so
later full passes walk only what was allocated since (see kvserver.server.gc_pacer)."""

from __future__ import annotations

import asyncio
import gc

from kvserver.server.gc_pacer import (
    FULL_PASS_THRESHOLD,
    YOUNG_THRESHOLD,
    GCPacer,
    collect_young_less_often,
)


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


async def test_after_a_freeze_the_next_full_pass_comes_without_waiting_for_the_old_count():
    """CPython starts a full pass once the objects promoted since the last one exceed a
    quarter of what that pass left behind; ``gc.freeze()`` alone leaves that figure as it
    was, so after freezing a large heap the next pass waited for a quarter of it and then
    walked all of that at once. The pacer's freeze counts from an empty pass instead."""
    thresholds = gc.get_threshold()
    gc.set_threshold(100, 2, 2)  # a full pass is considered every ~400 allocations
    big = [[i] for i in range(400_000)]  # a large long-lived heap...
    gc.collect()  # ...that the last full pass saw: the next waits for ~100,000 more
    pacer = GCPacer(budget_s=0.0)  # every full pass is "slow": frozen right after
    pacer.start()
    try:
        gc.collect()
        await asyncio.sleep(0)  # the freeze runs on the loop, after the pass
        assert pacer.freezes == 1
        passes = pacer.full_passes
        # 40,000 new long-lived objects: fewer than a quarter of the old count, but more
        # than a quarter of what the empty pass after the freeze left behind
        fresh = [[i] for i in range(40_000)]
        assert pacer.full_passes > passes
    finally:
        pacer.stop()
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    del big, fresh


async def test_the_pacer_considers_full_passes_often_while_it_runs():
    was = gc.get_threshold()
    pacer = GCPacer()
    pacer.start()
    try:
        assert gc.get_threshold() == (*was[:2], FULL_PASS_THRESHOLD)
    finally:
        pacer.stop()
    assert gc.get_threshold() == was


def test_a_serving_process_collects_the_young_generation_less_often():
    was = gc.get_threshold()
    try:
        collect_young_less_often()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *was[1:])
        assert YOUNG_THRESHOLD > was[0]
    finally:
        gc.set_threshold(*was)
