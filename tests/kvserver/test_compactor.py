"""Auto-compaction (kvserver.server.compactor): etcd's v3compactor semantics, with a fake clock.

etcd 3.4 ``--auto-compaction-mode revision --auto-compaction-retention N``: every check
(5 min) compact at ``rev - N`` unless ``<= 0`` or already done. ``periodic`` with a period P:
sample the revision every ``r = min(P, 1h) / 10``, first compaction one P after start, then
every ``min(P, 1h)``, each at the oldest of the last ``P / r + 1`` samples (P + r earlier). Only the leader compacts (paused
otherwise); "already compacted" counts as success; other failures are retried.
"""

import argparse
import asyncio

import pytest

from kvserver.kvpb.errors import CompactedError
from kvserver.membership.identity import ClusterConfigError
from kvserver.mvcc.store import MVCCStore
from kvserver.server.compactor import (
    AutoCompaction,
    Compactor,
    PeriodicPolicy,
    RevisionPolicy,
    parse_duration_s,
)
from kvserver.server.config import add_server_flags, config_from_args


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("0", 0.0),
        ("1h", 3600.0),
        ("30m", 1800.0),
        ("90s", 90.0),
        ("500ms", 0.5),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("2m0.5s", 120.5),
        ("10us", 1e-5),
    ],
)
def test_parse_duration_like_go(text, seconds):
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1", "h", "-1h", "1d", "1h 30m", "abc", "1.h.5"])
def test_parse_duration_refuses_garbage(text):
    with pytest.raises(ValueError):
        parse_duration_s(text)


def test_parse_flags_with_etcd_meanings():
    assert AutoCompaction.parse("periodic", "0").enabled is False  # etcd's default
    assert AutoCompaction.parse("revision", "0").enabled is False
    assert AutoCompaction.parse("periodic", "2").period_s == 7200.0  # bare number: hours
    assert AutoCompaction.parse("periodic", "30m").period_s == 1800.0
    rev = AutoCompaction.parse("revision", "1000", "200ms")
    assert (rev.retention_revisions, rev.check_interval_s, rev.enabled) == (1000, 0.2, True)
    assert AutoCompaction.parse("revision", "5").check_interval_s == 300.0  # etcd: 5 min
    for mode, retention, interval in [
        ("daily", "1", None),
        ("revision", "1h", None),
        ("revision", "-5", None),
        ("periodic", "1x", None),
        ("periodic", "-1", None),
        ("revision", "5", "0"),
        ("revision", "5", "soon"),
    ]:
        with pytest.raises(ValueError, match="--auto-compaction"):
            AutoCompaction.parse(mode, retention, interval)


def _cfg(*argv: str, environ=None):
    parser = argparse.ArgumentParser()
    add_server_flags(parser)
    return config_from_args(parser.parse_args(list(argv)), environ or {})


def test_server_flags_and_environment_twins():
    assert _cfg().auto_compaction.enabled is False
    cfg = _cfg(
        "--auto-compaction-mode",
        "revision",
        "--auto-compaction-retention",
        "100",
        "--auto-compaction-check-interval",
        "1s",
    )
    assert cfg.auto_compaction == AutoCompaction("revision", 100, 0.0, 1.0)
    env = {"RAFTKV_AUTO_COMPACTION_RETENTION": "1h"}
    assert _cfg(environ=env).auto_compaction.period_s == 3600.0
    with pytest.raises(ClusterConfigError, match="--auto-compaction-retention"):
        _cfg("--auto-compaction-mode", "revision", "--auto-compaction-retention", "1h")
    with pytest.raises(ClusterConfigError, match="--auto-compaction-mode"):
        _cfg("--auto-compaction-mode", "sometimes")


def test_revision_policy_keeps_last_n_revisions():
    p = RevisionPolicy(retention=10, interval_s=300)
    assert p.tick_interval_s == 300
    assert p.on_tick(0, 5, True) is None  # rev - N <= 0: nothing to drop yet
    assert p.on_tick(300, 15, True) == 5
    p.done(5, ok=True)
    assert p.on_tick(600, 15, True) is None  # no new revisions: not again
    assert p.on_tick(900, 40, False) is None  # follower: paused
    assert p.on_tick(1200, 40, True) == 30
    p.done(30, ok=False)  # failed: retried at the next check
    assert p.on_tick(1500, 41, True) == 31


def test_periodic_policy_short_period_compacts_every_period_at_the_revision_one_period_ago():
    # period 10 s: samples every 1 s; the revision grows by 10 every second (rev = 1 + 10 t)
    p = PeriodicPolicy(10.0, now_s=0.0, revision=1)
    assert p.tick_interval_s == pytest.approx(1.0)
    compactions = []
    for t in range(1, 36):
        rev = p.on_tick(float(t), 1 + 10 * t, True)
        if rev is not None:
            compactions.append((t, rev))
            p.done(rev, True, float(t))
    # first at t=10 with the revision of t=0; then every 10 s with the oldest of the last 11
    # samples (etcd keeps period/retry + 1 of them): the one taken 11 s before, at t=9, 19
    assert compactions == [(10, 1), (20, 91), (30, 191)]


def test_periodic_policy_long_period_compacts_hourly_keeping_the_whole_period():
    # etcd: retention 2h -> compact every hour, each time at the oldest of the last 21 samples
    # (one every 6 min): the revision of 2 h 6 min before
    p = PeriodicPolicy(7200.0, now_s=0.0, revision=1)
    assert p.tick_interval_s == pytest.approx(360.0)  # 1h / 10
    compactions = []
    t = 0.0
    while t < 4 * 3600:
        t += 360.0
        rev = p.on_tick(t, int(t), True)  # revision == seconds since start
        if rev is not None:
            compactions.append((round(t), rev))
            p.done(rev, True, t)
    assert compactions == [(7200, 1), (10800, 3240), (14400, 6840)]


def test_periodic_policy_is_paused_on_followers_but_keeps_sampling():
    p = PeriodicPolicy(10.0, now_s=0.0, revision=1)
    for t in range(1, 15):
        assert p.on_tick(float(t), 100 + t, False) is None
    # leader again: overdue, compacts at once at the revision sampled 10 ticks ago
    assert p.on_tick(15.0, 200, True) == 104


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_compactor_compacts_through_the_given_path_only_as_leader():
    store = MVCCStore()
    clock = FakeClock()
    leader = [True]
    calls = []

    async def compact(rev):
        calls.append(rev)
        store.compact(rev)  # raises CompactedError for an already compacted revision

    c = Compactor(
        AutoCompaction("revision", 3, 0.0, 1.0),
        revision=lambda: store.revision,
        is_leader=lambda: leader[0],
        compact=compact,
        is_compacted_error=lambda e: isinstance(e, CompactedError),
        clock=clock,
    )
    for i in range(10):
        store.put(b"k", b"%d" % i)  # revision 11
    assert await c.tick() == 8
    assert store.compact_revision == 8
    assert store.range(b"k", revision=8).kvs[0].value == b"6"
    leader[0] = False
    store.put(b"k", b"x")
    assert await c.tick() is None  # follower: nothing proposed
    leader[0] = True
    store.compact(9)  # someone compacted further
    assert await c.tick() == 9  # 12 - 3 = 9: "already compacted"
    assert c.policy.last_compacted == 9  # ... counts as done
    assert calls == [8, 9] and c.compactions == 2


async def test_compactor_retries_after_a_failure():
    clock = FakeClock()
    outcomes = [RuntimeError("etcdserver: request timed out"), None]
    calls = []

    async def compact(rev):
        calls.append(rev)
        err = outcomes.pop(0)
        if err is not None:
            raise err

    c = Compactor(
        AutoCompaction("revision", 10, 0.0, 1.0),
        revision=lambda: 50,
        is_leader=lambda: True,
        compact=compact,
        clock=clock,
    )
    assert await c.tick() is None and c.compactions == 0
    assert await c.tick() == 40 and c.compactions == 1
    assert await c.tick() is None  # done: not again
    assert calls == [40, 40]


async def test_compactor_loop_runs_and_stops():
    store = MVCCStore()
    for i in range(5):
        store.put(b"k", b"%d" % i)

    c = Compactor(
        AutoCompaction("revision", 2, 0.0, 0.01),
        revision=lambda: store.revision,
        is_leader=lambda: True,
        compact=lambda rev: asyncio.sleep(0, store.compact(rev)),
    )
    c.start()
    deadline = asyncio.get_running_loop().time() + 5
    while c.compactions == 0 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    await c.stop()
    assert c.compactions == 1 and store.compact_revision == store.revision - 2
