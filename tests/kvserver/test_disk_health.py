"""The disk-health watch and the slow-leader policy (kvserver.server.disk_health), with a
fake clock and a fake node; the real processes are in tests/faults."""

import asyncio
import math

import pytest

from kvserver.server.disk_health import (
    DiskHealth,
    FsyncWatch,
    SlowDiskGuard,
    SlowDiskOptions,
    choose_transferee,
    p99,
)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_p99_nearest_rank_never_one_outlier():
    assert p99([]) == 0.0
    assert p99([0.5]) == 0.5
    assert p99([0.001] * 99 + [1.0]) == 0.001
    assert p99([0.001] * 98 + [1.0, 1.0]) == 1.0
    assert p99([0.001] * 9 + [1.0]) == 0.001  # the maximum, were it plain nearest rank
    assert p99([0.001] * 8 + [1.0, 1.0]) == 1.0


def test_a_slow_disk_shows_within_two_fsyncs_however_busy_the_past():
    clock = Clock()
    watch = FsyncWatch(window_s=5.0, clock=clock)
    for _ in range(5000):  # a second of a busy healthy disk
        clock.now += 0.0002
        watch.end(0.0002)
    watch.end(0.5)
    assert not watch.health().slow(0.25, 5)
    watch.end(0.5)
    assert watch.health().slow(0.25, 5)


def test_watch_keeps_its_window_only():
    clock = Clock()
    watch = FsyncWatch(window_s=5.0, clock=clock)
    for _ in range(10):
        watch.begin()
        clock.now += 0.5
        watch.end(0.5)
    assert watch.health().samples == 10
    assert watch.health().p99_s == 0.5
    clock.now += 3.0  # the first fsyncs leave the window
    h = watch.health()
    assert 0 < h.samples < 10
    clock.now += 10
    assert watch.health() == DiskHealth(0.0, 0, 0.0)


def test_an_fsync_in_flight_counts_with_its_age():
    clock = Clock()
    watch = FsyncWatch(window_s=5.0, clock=clock)
    for _ in range(20):
        watch.end(0.001)
    watch.begin()
    clock.now += 0.5
    assert not watch.health().slow(0.25, min_samples=5)  # one slow fsync is not a slow disk
    clock.now += 2.5
    h = watch.health()
    assert h.stalled_s == 3.0
    assert h.slow(0.25, min_samples=5)  # waiting a second or more: slow at once
    watch.end(3.0)
    assert watch.health().stalled_s == 0.0


def test_slow_needs_enough_fsyncs_and_healthy_is_half_the_threshold():
    assert not DiskHealth(1.0, 4, 0).slow(0.25, 5)
    assert DiskHealth(0.25, 5, 0).slow(0.25, 5)
    assert not DiskHealth(0.2, 100, 0).slow(0.25, 5)
    assert not DiskHealth(0.2, 100, 0).healthy(0.25)  # neither slow nor healthy
    assert DiskHealth(0.1, 100, 0).healthy(0.25)
    assert DiskHealth(0.0, 0, 0).healthy(0.25)  # wrote nothing: nothing says it is slow


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "x",
        {},
        {"p99_s": "1", "samples": 1, "stalled_s": 0},
        {"p99_s": math.nan, "samples": 1, "stalled_s": 0},
        {"p99_s": math.inf, "samples": 1, "stalled_s": 0},
        {"p99_s": -1, "samples": 1, "stalled_s": 0},
        {"p99_s": True, "samples": 1, "stalled_s": 0},
    ],
)
def test_a_peers_bad_answer_is_refused(body):
    with pytest.raises(ValueError):
        DiskHealth.from_json(body)


def test_round_trip():
    h = DiskHealth(0.01, 12, 0.0)
    assert DiskHealth.from_json(h.to_json()) == h


def test_choose_transferee_only_healthy_lowest_p99():
    healthy, better, slow = DiskHealth(0.05, 9, 0), DiskHealth(0.002, 9, 0), DiskHealth(0.5, 9, 0)
    assert choose_transferee({}, 0.25) is None
    assert choose_transferee({2: None, 3: slow}, 0.25) is None
    assert choose_transferee({2: healthy, 3: better, 4: slow}, 0.25) == (3, better)
    assert choose_transferee({2: DiskHealth(0.001, 9, 0.2)}, 0.25) is None  # in flight


class FakeNode:
    def __init__(self, caught_up=(2, 3)):
        self.id = 1
        self.is_leader = True
        self.term = 5
        self.caught_up = list(caught_up)
        self.transfers: list[int] = []
        self.holds: list[float] = []

    def transfer_leadership(self, transferee, hold_proposals_s=0.0):
        self.transfers.append(transferee)
        self.holds.append(hold_proposals_s)
        self.term += 1  # it worked

    def caught_up_voters(self):
        return self.caught_up


def _guard(reports, clock, **opts):
    node = FakeNode(caught_up=list(reports))
    watch = FsyncWatch(window_s=5.0, clock=clock)

    async def ask(peer):
        answer = reports[peer]
        if isinstance(answer, Exception):
            raise answer
        return answer

    guard = SlowDiskGuard(node, watch, ask, SlowDiskOptions(**opts), clock=clock)
    return node, watch, guard


def _slow(watch, n=10, seconds=0.5):
    for _ in range(n):
        watch.end(seconds)


def test_guard_transfers_once_per_interval_to_the_healthy_follower(caplog):
    clock = Clock()
    reports = {2: DiskHealth(0.5, 9, 0).to_json(), 3: DiskHealth(0.003, 50, 0).to_json()}
    node, watch, guard = _guard(reports, clock)
    asyncio.run(guard.check())
    assert node.transfers == []  # not slow yet
    _slow(watch)
    with caplog.at_level("WARNING"):
        asyncio.run(guard.check())
    assert node.transfers == [3]
    assert "slow disk: WAL fsync p99 500 ms" in caplog.text
    assert guard.stats()["slow_disk_leader_transfers"] == 1
    clock.now += 1
    _slow(watch)
    asyncio.run(guard.check())
    assert node.transfers == [3]  # anti-flapping: one per interval
    clock.now += 60
    _slow(watch)
    asyncio.run(guard.check())
    assert node.transfers == [3, 3]
    assert node.holds == [2.0, 2.0]


def test_a_transfer_that_did_not_happen_is_tried_again():
    clock = Clock()
    reports = {3: DiskHealth(0.003, 50, 0).to_json()}
    node, watch, guard = _guard(reports, clock)
    node.transfer_leadership = lambda peer, **_: node.transfers.append(peer)  # term stays
    _slow(watch)
    asyncio.run(guard.check())
    assert node.transfers == [3]
    clock.now += 1
    _slow(watch)
    asyncio.run(guard.check())
    assert node.transfers == [3]  # too early to tell
    clock.now += 4
    _slow(watch)
    asyncio.run(guard.check())
    assert node.transfers == [3, 3]


def test_guard_stays_when_no_follower_is_healthy(caplog):
    clock = Clock()
    reports = {2: DiskHealth(0.4, 9, 0).to_json(), 3: OSError("unreachable")}
    node, watch, guard = _guard(reports, clock)
    _slow(watch)
    with caplog.at_level("WARNING"):
        asyncio.run(guard.check())
    assert node.transfers == []
    assert "staying leader" in caplog.text and "3: no answer" in caplog.text


def test_guard_off_or_follower_does_nothing():
    clock = Clock()
    reports = {2: DiskHealth(0.001, 9, 0).to_json()}
    node, watch, guard = _guard(reports, clock, transfer=False)
    _slow(watch)
    asyncio.run(guard.check())
    assert node.transfers == []
    node, watch, guard = _guard(reports, clock)
    node.is_leader = False
    _slow(watch)
    asyncio.run(guard.check())
    assert node.transfers == []


def test_stall_turns_health_false_until_the_fsync_completes(caplog):
    clock = Clock()
    node, watch, guard = _guard({}, clock, stall_timeout_s=2.0)
    watch.begin()
    clock.now += 1.0
    assert guard.problem() == ""
    clock.now += 1.5
    assert guard.problem().startswith("DISK STALLED")
    with caplog.at_level("ERROR"):
        asyncio.run(guard.check())
        asyncio.run(guard.check())
    assert guard.stats()["disk_stalls"] == 1  # once per stall
    watch.end(2.5)
    assert guard.problem() == ""
    asyncio.run(guard.check())
    assert guard._stall_logged is False


def test_stall_timeout_zero_never_reports():
    clock = Clock()
    _, watch, guard = _guard({}, clock, stall_timeout_s=0)
    watch.begin()
    clock.now += 1000
    assert guard.problem() == ""


def test_a_late_check_is_skipped_after_a_pause():
    class Jumping(Clock):
        def __call__(self):
            self.now += 1.0  # every look at the clock: a second later (a paused process)
            return self.now

    clock = Jumping()
    node, watch, guard = _guard({3: DiskHealth(0.001, 9, 0).to_json()}, clock)
    guard.opts = SlowDiskOptions(check_interval_s=0.001)
    checked = []

    async def check():
        checked.append(1)

    guard.check = check

    async def main():
        guard.start()
        await asyncio.sleep(0.05)
        await guard.stop()

    asyncio.run(main())
    assert checked == []
