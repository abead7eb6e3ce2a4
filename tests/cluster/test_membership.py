"""Membership changes on real ``raftkv serve`` processes (slow).

A three-node cluster with data and a small ``--snapshot-count`` (so a newcomer catches up by
snapshot): a fourth node is added as a learner and started with ``--initial-cluster-state
existing``; it serves every key serializably, is promoted (CLI), an old follower is removed
(its process exits with etcd's message), writes continue, the cluster survives a SIGKILL of
one node, and finally the leader removes itself: it hands over and exits, writes continue.
"""

import signal
import subprocess
import sys

import pytest

from kvserver.client import Client
from kvserver.membership.service import REMOVED_MESSAGE
from tests.cluster.harness import (
    SNAPSHOT_OFTEN_ARGS,
    get_prefix,
    leader_of,
    put,
    status,
    wait_healthy,
)
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


def cli(endpoints, *argv):
    return subprocess.run(
        [sys.executable, "-m", "kvserver.cli", "member", *argv, "--endpoints", ",".join(endpoints)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def wait_exit(cluster, node, timeout_s=30.0):
    wait_for(lambda: node.proc.poll() is not None, timeout_s, f"{node.name} to exit")
    assert node.proc.returncode == 0, cluster.log_tail(node)
    assert REMOVED_MESSAGE in cluster.log_tail(node, 60)


def test_learner_joins_by_snapshot_promote_remove_kill_and_leader_removal(make_cluster):
    cluster = make_cluster(3, extra_args=SNAPSHOT_OFTEN_ARGS)
    leader = wait_healthy(cluster)
    data = {f"k/{i:03d}": f"v{i}" for i in range(150)}
    for key, value in data.items():
        put(leader.client_url, key, value)

    with Client(cluster.endpoints, timeout_s=20) as client:
        joiner = cluster.joining_node("node4")
        added = client.member_add([joiner.peer_url], is_learner=True)
        assert added.member.is_learner and added.member.peer_urls == (joiner.peer_url,)
        new_id = added.member.id

        cluster.start_node(joiner)
        wait_for(
            lambda: (
                joiner.alive()
                and status(joiner) is not None
                and get_prefix(joiner.client_url, "k/", serializable=True) == data
            ),
            60,
            "the learner to serve every key",
        )
        assert status(joiner)["id"] == f"{new_id:x}" or status(joiner)["id"] == new_id
        assert "restored snapshot" in cluster.log_tail(joiner, 200)

        # promote through the CLI (refused until the learner is in sync: retry)
        def promoted():
            res = cli(cluster.endpoints, "promote", f"{new_id:x}")
            return res.returncode == 0 and res

        wait_for(promoted, 30, "the promotion", interval_s=0.3)
        listing = cli(cluster.endpoints, "list")
        assert listing.returncode == 0 and "node4" in listing.stdout
        members = {m.id: m for m in client.member_list()}
        assert not members[new_id].is_learner and members[new_id].name == "node4"
        assert members[new_id].client_urls == (joiner.client_url,)

        # remove an old follower: its process exits
        leader = wait_healthy(cluster, among=[n for n in cluster.nodes if n.alive()])
        victim = next(n for n in cluster.nodes[:3] if n is not leader)
        victim_id = next(m.id for m in client.member_list() if m.name == victim.name)
        client.member_remove(victim_id)
        wait_exit(cluster, victim)
        live = [n for n in cluster.nodes if n is not victim]
        client.put("after/remove", "1")
        assert {m.name for m in client.member_list()} == {n.name for n in live}

        # the three voters survive killing one of them (not the leader)
        leader = wait_healthy(cluster, among=live)
        other = next(n for n in live if n is not leader and n is not joiner)
        cluster.kill(other, signal.SIGKILL)
        client.put("after/kill", "1")
        cluster.start_node(other)
        wait_healthy(cluster, among=live)

        # the leader removes itself: hands over and exits; the others go on
        leader = wait_healthy(cluster, among=live)
        leader_id = next(m.id for m in client.member_list() if m.name == leader.name)
        client.member_remove(leader_id)
        wait_exit(cluster, leader)
        rest = [n for n in live if n is not leader]
        new_leader = wait_healthy(cluster, among=rest)
        assert new_leader is not leader
        client.put("after/leader", "1")
        for n in rest:
            wait_for(
                lambda n=n: (
                    get_prefix(n.client_url, "after/", serializable=True)
                    == {"after/remove": "1", "after/kill": "1", "after/leader": "1"}
                ),
                20,
                f"{n.name} to have every write",
            )
        assert leader_of(cluster, rest) is not None
