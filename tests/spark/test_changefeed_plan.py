"""The changefeed driver's ledger (no Spark, no store): limits and key-range partitions.

- ``end_within`` never splits a revision, holds at most N events (unless the first revision
  alone holds more: then exactly that revision), at most M revisions past the start, and only
  revisions the watch has received completely;
- ``split`` cuts a batch into disjoint key ranges covering it, every event of a key in one,
  with the right counts and last revisions, one partition for a small batch;
- ``trim`` forgets committed events; ``covers`` says whether a batch was recorded whole.
"""

from __future__ import annotations

import random

from kvserver.spark.source.changefeed_plan import EventLedger


def ledger_of(events, first=1, complete=None) -> EventLedger:
    led = EventLedger(first)
    for rev, key in events:
        led.add(rev, key)
    if complete is not None:
        led.mark_complete(complete)
    return led


def test_end_within_respects_caps_and_never_splits_a_revision():
    # revision 10 holds 5 events (a txn), the rest one each
    events = [(5, b"a"), (6, b"b")] + [(10, b"t%d" % i) for i in range(5)] + [(12, b"c")]
    led = ledger_of(events, complete=12)
    assert led.end_within(0) == 12
    assert led.end_within(0, max_events=2) == 6
    assert led.end_within(0, max_events=3) == 6  # 10 would make 7
    assert led.end_within(6, max_events=1) == 10  # the first revision is taken whole
    assert led.end_within(0, max_revisions=5) == 5
    assert led.end_within(0, max_revisions=3) == 5  # never below the first event
    assert led.end_within(12) == 12


def test_only_complete_revisions_are_offered():
    led = ledger_of([(3, b"a"), (4, b"b")])
    assert led.latest() == 3  # revision 4 may have more events still on the way
    assert led.end_within(0) == 3
    led.mark_complete(4)
    assert led.latest() == 4
    assert led.covers(0, 4) and not led.covers(0, 5)


def test_split_is_a_partition_of_the_batch_by_keys():
    rng = random.Random(7)
    events = []
    rev = 1
    for _ in range(5000):
        rev += rng.randint(0, 2)  # several events per revision sometimes
        events.append((rev, b"k%04d" % rng.randint(0, 400)))
    events.sort()
    dedup = {}
    for r, k in events:  # a key appears once per revision
        dedup[(r, k)] = None
    events = list(dedup)
    led = ledger_of(events, complete=rev)
    start, end = events[100][0] - 1, events[-50][0]
    batch = [(r, k) for r, k in events if start < r <= end]
    parts = led.split(start, end, parts=4, min_events=500)
    assert 2 <= len(parts) <= 4
    assert parts[0].lo is None and parts[-1].hi is None
    for a, b in zip(parts, parts[1:], strict=False):
        assert a.hi == b.lo and a.hi is not None
    for p in parts:
        mine = [
            (r, k) for r, k in batch if (p.lo is None or k >= p.lo) and (p.hi is None or k < p.hi)
        ]
        assert p.count == len(mine) > 0
        assert p.last == max(r for r, _ in mine)
    assert sum(p.count for p in parts) == len(batch)
    assert len(led.split(start, start + 3, parts=4, min_events=500)) == 1


def test_trim_forgets_committed_events():
    led = ledger_of([(2, b"a"), (3, b"b"), (5, b"c")], complete=5)
    led.trim(3)
    assert led.count(0, 10) == 1
    assert not led.covers(2, 5) and led.covers(3, 5)
    led.add(3, b"late")  # at or below the floor: ignored
    assert led.count(0, 10) == 1


def random_batch(seed: int, n: int = 5000):
    """(revision, key) pairs in revision order, several events per revision sometimes, a
    key at most once per revision."""
    rng = random.Random(seed)
    events = {}
    rev = 1
    for _ in range(n):
        rev += rng.randint(0, 2)
        events[(rev, b"k%04d" % rng.randint(0, 400))] = None
    return sorted(events)


def test_held_gives_each_partition_its_events_in_revision_order():
    events = random_batch(11)
    led = EventLedger(1, hold_bytes=1 << 30)
    for r, k in events:
        led.add(r, k, (r, k), 10)
    led.mark_complete(events[-1][0])
    start, end = events[200][0] - 1, events[-100][0]
    parts = led.split(start, end, parts=3, min_events=500)
    held = led.held(start, end, parts)
    assert len(held) == len(parts) == 3
    for p, got in zip(parts, held, strict=True):
        mine = [
            (r, k)
            for r, k in events
            if start < r <= end and (p.lo is None or k >= p.lo) and (p.hi is None or k < p.hi)
        ]
        assert got == mine  # the partition's events, in the order the watch gave them
        assert len(got) == p.count
    assert led.held(start, start, []) == []


def test_events_past_the_hold_budget_are_recorded_without_payload():
    led = EventLedger(1, hold_bytes=100)
    for r in range(1, 21):  # 20 events of 10 bytes: the first 10 fit
        led.add(r, b"k%02d" % r, ("ev", r), 10)
    led.mark_complete(20)
    assert led.held_bytes == 100
    assert led.count(0, 20) == 20  # every event is still counted and split
    one = led.split(0, 10, parts=1, min_events=1)
    assert led.held(0, 10, one) == [[("ev", r) for r in range(1, 11)]]
    assert led.held(0, 11, led.split(0, 11, parts=1, min_events=1)) == [None]
    two = led.split(0, 20, parts=2, min_events=1)  # keys k01..k10 | k11..k20
    assert [h is None for h in led.held(0, 20, two)] == [False, True]
    assert led.held(0, 10, one, max_bytes=50) == [None]  # over the per-partition cap
    led.trim(5)
    assert led.held_bytes == 50
    led.add(21, b"k21", ("ev", 21), 10)  # room again
    assert led.held_bytes == 60


def test_a_ledger_without_budget_holds_nothing():
    led = EventLedger(1)
    led.add(1, b"a", ("ev", 1), 10)
    led.mark_complete(1)
    assert led.held_bytes == 0
    assert led.held(0, 1, led.split(0, 1, parts=1, min_events=1)) == [None]
