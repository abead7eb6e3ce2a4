"""The soak's CI mode (tests/chaos/soak.py): one round of every soak nemesis -- kill, pause,
restart, partition, full disk, failing fsync, slow disk, clock step -- on five members (two
members hit at once), with a few thousand keys loaded first. Three members meet each of
these faults in test_chaos_ci.py (kill, pause, partition, restart) and tests/faults (disk,
fsync, slow disk, clock), so a three-member round here would repeat them at CI's expense;
``python -m tests.chaos --soak --rounds 1 --members 3`` runs one by hand. The full
soak (``python -m tests.chaos --soak``: 100 rounds at a million keys) runs by hand; its
numbers are in docs/reliability.md.

The assertions are the safety properties of every round: no acknowledged write lost, the
register history linearizable (a definite verdict), no bank read off the total, every fault
healed; and that the slow leader handed leadership away. Needs root (network namespaces)
and gcc and libfaketime (the disk shim and the clock).
"""

from __future__ import annotations

import pytest

from tests.chaos.requirements import need_netns
from tests.chaos.soak import SOAK_FAULTS, SoakConfig, run_soak, table

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]


def test_soak_one_round_of_every_nemesis_on_five_members(tmp_path):
    need_netns()
    report = run_soak(SoakConfig(rounds=1, keys=5000, members=5, out_dir=str(tmp_path / "soak")))
    print(table(report))
    assert report["faults"] == SOAK_FAULTS
    (rnd,) = report["rounds"]
    assert rnd["errors"] == [], report["problems"]
    assert rnd["lost"] == 0
    assert rnd["linearizable"] == "OK"
    assert rnd["bank_violations"] == 0
    assert rnd["slow_leader_moved"] == [True]
    assert report["ok"], report["problems"]
