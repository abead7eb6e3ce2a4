"""The chaos suite against the docker-compose cluster: Docker's faults, the same checks.

One run of :mod:`tests.chaos.runner` with ``target="compose"``: deploy/docker-compose.yml's
three containers (built and started by ``deploy/up.sh up`` under a unique project name), and
every Docker nemesis at least once -- ``docker kill -s KILL`` + ``docker start`` of the leader
and of a follower, ``docker pause``/``unpause`` of each, all three killed and started again,
``docker network disconnect``/``connect`` of the leader and of a follower -- then two more
leader kills, while the register, bank, lock and watch clients run through the published
ports. The assertions are the safety properties of test_chaos_ci.py, never timings:
acknowledged writes lost == 0, a definite linearizable verdict, bank total constant, no two
lock holders' fenced writes interleave, watchers saw every change once and in order, every
member holds the same history; and ``down -v`` left no container, network or volume.

Needs Docker and Compose (skipped locally without them, a failure under
``RAFTKV_REQUIRE_EXTERNAL=1``, as tests/deploy).
"""

from __future__ import annotations

import json

import pytest

from tests.chaos.docker_members import UNSUPPORTED_FAULTS
from tests.chaos.nemesis import ALL_FAULTS
from tests.chaos.runner import ChaosConfig, run

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.docker,
    pytest.mark.external,
    pytest.mark.timeout(1800),
]


def test_docker_nemeses_keep_every_safety_property(tmp_path):
    out = tmp_path / "chaos"
    cfg = ChaosConfig(
        target="compose",
        duration_s=45,
        nemesis="all",
        out_dir=str(out),
        seed=11,
        hold_s=3.0,
        gap_s=1.0,
        failover_kills=2,
    )
    report = run(cfg)
    summary = {
        k: report.get(k)
        for k in (
            "rounds",
            "ops",
            "acked_writes",
            "lost_writes",
            "linearizability",
            "bank",
            "lock",
            "watch",
            "replicas",
            "failover",
            "cleanup",
            "problems",
        )
    }
    print(json.dumps(summary, indent=1, default=str))
    if not report["ok"]:
        for log in sorted((out / "data").glob("*.log")):
            print(f"----- {log.name} (tail) -----")
            print("\n".join(log.read_text(errors="replace").splitlines()[-40:]))
    assert report["network"]["mode"] == "compose"
    assert report["faults_left_out"] == UNSUPPORTED_FAULTS
    faults_run = {r["fault"] for r in report["timeline"] if "error" not in r}
    assert faults_run == set(ALL_FAULTS) - set(UNSUPPORTED_FAULTS), (
        f"not every Docker fault ran: {faults_run}"
    )
    assert report["acked_writes"] >= 300
    assert report["lost_writes"] == 0, report["lost_examples"]
    lin = report["linearizability"]
    assert lin["verdict"] == "OK" and lin["violations"] == 0, lin.get("explanation")
    assert lin["operations"] >= 300
    assert report["bank"]["violations"] == 0, report["bank"]["examples"]
    assert report["bank"]["reads_checked"] >= 30
    assert report["lock"]["overlaps"] == 0, report["lock"]["examples"]
    assert report["lock"]["fenced_writes_checked"] >= 5
    assert report["watch"]["complete_and_ordered"], report["watch"]
    assert report["replicas"]["identical"] and report["replicas"]["members_replayed"] == 3
    assert report["failover"]["kills"] >= 3  # every kill-leader got an acknowledged write
    assert report["cleanup"] == {"errors": [], "leftovers": []}
    assert report["problems"] == [] and report["ok"]
