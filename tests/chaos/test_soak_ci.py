"""The soak's CI mode (tests/chaos/soak.py): one round of every soak nemesis -- kill, pause,
restart, partition, full disk, failing fsync, slow disk, clock step -- on three members,
then on five (two members hit at once), with a few thousand keys loaded first. The full
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


@pytest.mark.parametrize("members", [3, 5])
def test_soak_one_round_of_every_nemesis(tmp_path, members):
    need_netns()
    report = run_soak(
        SoakConfig(rounds=1, keys=5000, members=members, out_dir=str(tmp_path / "soak"))
    )
    print(table(report))
    assert report["faults"] == SOAK_FAULTS
    (rnd,) = report["rounds"]
    assert rnd["errors"] == [], report["problems"]
    assert rnd["lost"] == 0
    assert rnd["linearizable"] == "OK"
    assert rnd["bank_violations"] == 0
    assert rnd["slow_leader_moved"] == [True]
    assert report["ok"], report["problems"]
