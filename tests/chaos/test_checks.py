"""The chaos checks catch what they are meant to catch (fast: no processes, no network)."""

from __future__ import annotations

from tests.chaos import checks
from tests.chaos import kvhttp as h
from tests.chaos.nemesis import ALL_FAULTS, expand, needs_network
from tests.chaos.workloads import Bank, Recorder

LOCK, RES = "chaos/lock/owner", "chaos/lock/resource"
HISTORY = [
    (2, "PUT", "chaos/a", "1", 2),
    (3, "PUT", "chaos/b", "x", 3),
    (3, "PUT", "chaos/c", "y", 3),  # one txn: two events at one revision
    (4, "PUT", "chaos/a", "2", 2),
    (5, "DELETE", "chaos/b", "", 0),
]


def test_lost_writes_are_acked_writes_missing_from_the_history():
    acked = [("chaos/a", 2, "register"), ("chaos/a", 4, "register"), ("chaos/c", 3, "bank")]
    assert checks.lost_writes(acked, HISTORY) == []
    assert checks.lost_writes([*acked, ("chaos/a", 6, "register")], HISTORY) == [
        "register: chaos/a@6"
    ]
    # a delete at that revision is not the put that was acknowledged
    assert checks.lost_writes([("chaos/b", 5, "bank")], HISTORY) == ["bank: chaos/b@5"]


def test_a_watcher_must_see_the_reference_once_and_in_order():
    assert checks.watch_problems("w", HISTORY, HISTORY, 5) == []
    assert checks.watch_problems("w", [*HISTORY, (6, "PUT", "chaos/z", "", 6)], HISTORY, 5) == []
    missing = checks.watch_problems("w", HISTORY[:2] + HISTORY[3:], HISTORY, 5)
    assert len(missing) == 1 and "missing 1" in missing[0]
    twice = checks.watch_problems("w", HISTORY[:3] + HISTORY[2:], HISTORY, 5)
    assert any("delivered twice" in p for p in twice)
    swapped = [HISTORY[0], HISTORY[3], HISTORY[1], HISTORY[2], HISTORY[4]]
    assert any("out of order" in p for p in checks.watch_problems("w", swapped, HISTORY, 5))
    changed = [*HISTORY[:3], (4, "PUT", "chaos/a", "other", 2), HISTORY[4]]
    assert checks.watch_problems("w", changed, HISTORY, 5)


def test_replicas_must_hold_the_same_history():
    assert checks.replica_problems({"n1": HISTORY, "n2": list(HISTORY)}) == []
    (problem,) = checks.replica_problems({"n1": HISTORY, "n2": HISTORY[:-1]})
    assert "n2 differs from n1 at event 4" in problem
    forged = [*HISTORY[:3], (4, "PUT", "chaos/forged", "x", 4), HISTORY[4]]
    assert checks.replica_problems({"n1": HISTORY, "n2": HISTORY, "n3": forged})


def _lock_history(*writes):
    return [
        (10, "PUT", LOCK, "client-0", 10),
        (11, "PUT", RES, "10:0:0", 11),
        (12, "DELETE", LOCK, "", 0),
        (13, "PUT", LOCK, "client-1", 13),
        (14, "PUT", RES, "13:1:0", 11),
        *writes,
    ]


def test_fencing_accepts_writes_by_the_current_holder_only():
    assert checks.fencing_violations(_lock_history(), LOCK, RES) == (2, [])
    checked, stale = checks.fencing_violations(
        _lock_history((15, "PUT", RES, "10:0:1", 11)), LOCK, RES
    )
    assert checked == 3 and any("token 10" in v for v in stale)
    free = _lock_history((15, "DELETE", LOCK, "", 0), (16, "PUT", RES, "13:1:1", 11))
    assert "while the lock was free" in checks.fencing_violations(free, LOCK, RES)[1][0]
    assert checks.fencing_violations([(3, "PUT", RES, "garbage", 3)], LOCK, RES)[1]


def test_percentile_is_nearest_rank():
    assert checks.percentile([], 50) is None
    assert checks.percentile([3.0], 99) == 3.0
    assert checks.percentile([1, 2, 3, 4], 50) == 2
    assert checks.percentile(list(range(1, 101)), 99) == 99
    assert checks.percentile([5, 1, 9], 99) == 9


def test_nemesis_names_expand_and_partitions_need_the_network():
    assert expand("all") == ALL_FAULTS
    assert expand("kill,pause-leader,kill") == ["kill-leader", "kill-follower", "pause-leader"]
    assert needs_network(expand("partition")) and not needs_network(expand("kill,restart"))
    try:
        expand("kill,flood")
    except ValueError as exc:
        assert "flood" in str(exc)
    else:
        raise AssertionError("an unknown nemesis must be refused")


def _snapshot(revision: int, values: list[int]) -> dict:
    return {
        "header": {"revision": str(revision)},
        "kvs": [
            {
                "key": h.b64(f"chaos/bank/a{i}"),
                "value": h.b64(str(v)),
                "mod_revision": str(revision),
            }
            for i, v in enumerate(values)
        ],
    }


def test_bank_snapshots_total_the_initial_amount_or_predate_the_accounts():
    bank = Bank(["http://unused"], Recorder(), seed=1, clients=1, accounts=3)
    bank.setup_revision = 10
    bank.check_snapshot(_snapshot(10, [100, 100, 100]), "a", member=0)
    bank.check_snapshot(_snapshot(12, [50, 150, 100]), "b", member=0)
    bank.check_snapshot(_snapshot(1, []), "stale serializable", member=0)  # legal, but old
    assert bank.violations == [] and bank.before_setup == 1
    assert bank.went_back_count == 1 and "revision 1 after 12" in bank.went_back[0]
    bank.check_snapshot(_snapshot(13, [50, 150, 99]), "lost a coin")
    bank.check_snapshot(_snapshot(14, [150, 150]), "lost an account")
    bank.check_snapshot(_snapshot(5, [100]), "accounts before their creation")
    assert len(bank.violations) == 3 and bank.reads == 6
