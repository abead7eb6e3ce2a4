"""Hostile clients against the leader of a three-member cluster of real processes.

Each attack of ``kvserver.bench.h2_attacks`` runs against the leader's client URL while an
honest gRPC client sends a Put and a Range every half second with a 3 s deadline. After each
attack:

- the leader is the same member in the same term (no election happened);
- the leader's memory, its front ends' included, grew by at most 256 MB;
- every honest call succeeded within its deadline;
- the attacker got the protocol's answer (the GOAWAY or RST_STREAM code), or, for the
  attacks that never read, the budget it met moved in ``/metrics``.

The members run with the defaults a user gets (front-end processes included), except a
2 s drain timeout so a client that never reads is dropped within the test's time.
"""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

from kvserver.bench import h2_attacks as attacks
from kvserver.bench.abuse_victim import HonestClient, process_rss
from kvserver.localcluster.launcher import LocalCluster
from tests.cluster.harness import leader_of, put, status, wait_healthy
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

ATTACK_S = 3.0
MAX_GROWTH = 256 * 1024 * 1024
BIG_VALUE = b"v" * 100_000  # 20 of them: a 2 MB answer to one Range of the prefix

EXPECTED = {  # the attacker's answer, as AttackResult.answer() spells it (a prefix)
    "rapid_reset": "GOAWAY ENHANCE_YOUR_CALM",
    "table_updates": "GOAWAY COMPRESSION_ERROR",
    "header_lists": "GOAWAY COMPRESSION_ERROR",
    "zero_window": "GOAWAY ENHANCE_YOUR_CALM",
    "continuation_flood": "GOAWAY ENHANCE_YOUR_CALM",
    "ping_flood": "GOAWAY ENHANCE_YOUR_CALM",
    "open_streams": "RST_STREAM REFUSED_STREAM",
    "oversized_grpc": "RESOURCE_EXHAUSTED",
    "oversized_http": "HTTP 413",
    "watch_flood": "watches refused (raftkv: too many watchers)",
}
# (a SETTINGS flood's answers fit in the kernel's socket buffers: nothing is held here, so
# no budget is met; tests/grpcapi/test_budgets.py meets the control-frame budget itself)
BUDGET_MOVED = {"never_read": "output"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(
        str(tmp_path_factory.mktemp("abuse")),
        size=3,
        extra_args=["--client-drain-timeout-ms", "2000"],
    )
    c.start()
    try:
        wait_healthy(c)
        for i in range(20):
            assert put(c.nodes[0].client_url, f"abuse/big/{i:02d}", BIG_VALUE.decode()) > 0
        yield c
    finally:
        c.stop()


def budget_count(url: str, budget: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    match = re.search(
        rf'^raftkv_client_budget_exceeded_total\{{budget="{budget}"\}} (\S+)$', text, re.M
    )
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("name", sorted(attacks.ATTACKS))
def test_an_attack_on_the_leader_changes_nothing_for_anyone_else(cluster, name):
    leader = leader_of(cluster)
    assert leader is not None and leader.proc is not None
    before = status(leader)
    assert before is not None
    budget = BUDGET_MOVED.get(name)
    budget_before = budget_count(leader.client_url, budget) if budget else 0.0
    rss_before = process_rss(leader.proc.pid)
    honest = HonestClient(f"127.0.0.1:{leader.client_port}")
    honest.start()
    started = time.monotonic()
    result = attacks.ATTACKS[name]("127.0.0.1", leader.client_port, ATTACK_S)
    rss_peak = process_rss(leader.proc.pid)
    time.sleep(max(0.0, started + ATTACK_S - time.monotonic()))  # honest calls go on meanwhile
    report = honest.stop()
    after = status(leader)
    assert after is not None
    assert (after["leader"], after["term"]) == (before["leader"], before["term"]), "an election"
    grown = rss_peak - rss_before
    assert grown <= MAX_GROWTH, f"grew {grown >> 20} MB: {result}"
    assert report.calls >= 4 and not report.failures, report  # two rounds at least
    if name in EXPECTED:
        assert EXPECTED[name] in result.answer(), result
    if budget:  # (a front end reports its counts about once a second)
        wait_for(
            lambda: budget_count(leader.client_url, budget) > budget_before,
            10.0,
            f"the {budget} budget counted in /metrics",
        )
