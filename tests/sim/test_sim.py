"""Deterministic cluster simulation of the raft core.

Fixed seed ranges (never random per run): 100 seeds in the default suite, 2,000 in the slow
suite. Every seed alternates 3 and 5 nodes (even/odd) and checks election safety, log
matching, permanence of committed entries, leader completeness, state machine safety,
acknowledgements only after persisting, and linearizable reads after every step, then
liveness after healing; about a third of the seeds also change membership (add a learner,
promote it, remove a voter -- sometimes the leader). A failure message lists
each failing seed with its replay command: ``python -m tests.sim --seed S --nodes N --verbose``.

The mutation tests break the *driver* on purpose (the simulator's own part: fsync, reads,
network healing) and require the checkers to notice within a few seeds, so the end-to-end
path from a real anomaly to a failing seed is tested, not just the checkers in isolation.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raft import HardState
from tests.sim.checkers import SafetyViolation
from tests.sim.cluster import Cluster, ContractViolation, LivenessFailure
from tests.sim.disk import Disk
from tests.sim.history import LinearizabilityViolation
from tests.sim.runner import failure_report, run_seed, run_seeds
from tests.sim.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]

DEFAULT_SEEDS = range(0, 100)
SLOW_SEEDS = range(100, 2100)  # disjoint from the default range: `--seeds 2000 --start 100`


def test_default_seed_range_is_safe_and_live():
    results = run_seeds(DEFAULT_SEEDS.start, len(DEFAULT_SEEDS))
    failures = [r for r in results if not r.ok]
    assert not failures, "\n" + failure_report(failures)
    # the runs must actually exercise the interesting paths, or passing means little
    totals = {}
    for r in results:
        for k, v in r.stats.items():
            totals[k] = totals.get(k, 0) + v
    assert totals["crashes"] > 50
    assert totals["snapshots_sent"] > 5
    assert totals["app_snapshots"] > 100
    assert totals["reads"] > 500
    assert totals["writes"] > 1000
    assert totals["dropped"] > 1000
    assert totals["joiners"] > 10 and totals["removed"] > 5


@pytest.mark.slow
def test_two_thousand_seeds_are_safe_and_live():
    results = run_seeds(SLOW_SEEDS.start, len(SLOW_SEEDS))
    failures = [r for r in results if not r.ok]
    assert not failures, "\n" + failure_report(failures)


def test_same_seed_replays_the_same_run():
    for seed in (3, 4):
        a, b = run_seed(seed), run_seed(seed)
        assert (a.error, a.stats, a.digest) == (b.error, b.stats, b.digest)
        assert a.stats["msgs"] > 100


def test_replay_does_not_depend_on_hash_randomization():
    """The replay command runs in a new process: set/dict order hazards would show here."""
    outputs = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run(
            [sys.executable, "-m", "tests.sim", "--seed", "7", "--nodes", "5", "--verbose"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "digest=" in out.stdout, out.stdout + out.stderr
        outputs.add(out.stdout)
    assert len(outputs) == 1, outputs


def test_failing_seed_prints_replay_command(capsys, monkeypatch):
    import tests.sim.runner as runner
    from tests.sim.__main__ import main

    class Broken(Cluster):
        def _final_checks(self):
            raise SafetyViolation("injected")

    monkeypatch.setattr(runner, "Cluster", Broken)
    assert main(["--seeds", "2", "--start", "10"]) == 1
    out = capsys.readouterr().out
    assert "python -m tests.sim --seed 10 --nodes 3 --verbose" in out
    assert "python -m tests.sim --seed 11 --nodes 5 --verbose" in out
    assert "2 failed" in out


# -- mutations of the driver: the checkers must catch them -------------------------------


def _first_failure(cluster_cls, seeds, want=AssertionError, **overrides):
    """Run seeds (alternating 3/5 nodes) until one fails with ``want``; return that error."""
    for seed in seeds:
        sc = dataclasses.replace(Scenario.from_seed(seed, 3 if seed % 2 == 0 else 5), **overrides)
        try:
            cluster_cls(sc).run()
        except want as exc:
            return exc
        except AssertionError:
            continue
    return None


def test_mutation_no_fsync_is_caught(monkeypatch):
    """A driver that never fsyncs: acknowledgements go out for writes a crash loses."""
    monkeypatch.setattr(Disk, "sync", lambda self: None)
    exc = _first_failure(Cluster, range(20), want=(SafetyViolation, ContractViolation))
    assert exc is not None, "never syncing went unnoticed"


def test_mutation_forgetful_disk_is_caught(monkeypatch):
    """A disk that loses its last synced entries on a crash (commit capped to match, so the
    restart itself looks consistent): only the cross-node checkers can see the damage."""
    crash = Disk.crash

    def forgetful_crash(self, rng):
        crash(self, rng)
        if self.entries:
            del self.entries[-3:]
            last = self.durable_last_index()
            hs = self.hard_state
            if hs is not None and hs.commit > last:
                self.hard_state = HardState(hs.term, hs.vote, last)

    monkeypatch.setattr(Disk, "crash", forgetful_crash)
    exc = _first_failure(Cluster, range(40), want=SafetyViolation)
    assert exc is not None, "losing acknowledged entries went unnoticed"


def test_mutation_vote_not_persisted_is_caught(monkeypatch):
    write = Disk.write_hard_state
    monkeypatch.setattr(
        Disk, "write_hard_state", lambda self, hs: write(self, HardState(hs.term, 0, hs.commit))
    )
    exc = _first_failure(Cluster, range(10), want=ContractViolation)
    assert exc is not None and "grants its vote" in str(exc), exc


class AckBeforePersist(Cluster):
    """Every node sends its whole Ready (MsgAppResp, votes) before persisting it."""

    def _early_messages(self, n, msgs):
        return list(msgs)


def test_mutation_ack_before_persist_is_caught():
    exc = _first_failure(AckBeforePersist, range(10), want=ContractViolation, sends_first=True)
    assert exc is not None, "acknowledging before persisting went unnoticed"


class LocalReads(Cluster):
    """Serve reads from the local state machine at once (no ReadIndex): serializable."""

    def _client_read(self, c):
        alive = self._alive_ids()
        c.token += 1
        if not alive:
            self._at(self.now + 10, self._client_read_timeout, c, c.token)
            return
        n = self.nodes[self.rng.choice(alive)]
        op, rev = n.kv.get(c.key)
        self.history.read_done(c.rid, op, rev)
        self._client_idle(c)


def test_mutation_local_reads_are_caught():
    exc = _first_failure(LocalReads, range(60), want=LinearizabilityViolation)
    assert exc is not None, "serializable reads passed as linearizable"


class NeverHeals(Cluster):
    """The liveness phase loses every message."""

    def _begin_liveness(self):
        super()._begin_liveness()
        self.drop_rate = 1.0


def test_mutation_unhealed_network_fails_liveness():
    exc = _first_failure(NeverHeals, range(3), want=LivenessFailure)
    assert exc is not None
