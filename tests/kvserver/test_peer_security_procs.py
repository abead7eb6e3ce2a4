"""The forged-peer-frame attacks on real ``raftkv serve`` processes (slow): forged peer frames change
nothing, and the cluster is still fine after a full restart.

As the attacker did: read the cluster ID and member IDs from ``GET /raft/members`` on a peer
port, then open ``/raft/stream`` as an ID that is not a member and send a MsgProp with a put,
heartbeats of term + 1000 and 2**64 - 1 to every member, and a MsgApp that would make a
follower diverge; and, under a member's ID, a heartbeat of term 2**64 - 1. Every stream of a
stranger must be refused with 404, the impossible heartbeat must close its stream, and the
cluster must keep its leader and term, accept writes, never show the forged key, agree on the
revision, and come back after kill -9 of every member.
"""

import asyncio
import json
import urllib.request

import pytest

from kvserver.localcluster.launcher import LocalCluster
from raft import Entry, Message, MessageType
from tests.cluster.harness import b64, call, put, status, wait_healthy
from tests.kvserver.peer_attack import STRANGER, attack_url, forged_payload
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


def members_of(peer_url: str) -> tuple[int, list[int]]:
    with urllib.request.urlopen(peer_url + "/raft/members", timeout=5) as resp:
        body = json.loads(resp.read())
    return int(body["cluster_id"]), [m["id"] for m in body["members"]]


def revision_and_count(url: str, key: str) -> tuple[int, int]:
    code, body = call(url, "/v3/kv/range", {"key": b64(key)}, timeout_s=10)
    assert code == 200, (code, body)
    return int(body["header"]["revision"]), int(body.get("count", 0))


def test_forged_frames_from_outside_change_nothing_on_real_processes(tmp_path):
    c = LocalCluster(
        str(tmp_path), extra_args=["--heartbeat-interval", "50", "--election-timeout", "500"]
    )
    try:
        c.start()
        leader = wait_healthy(c, timeout_s=60)
        put(leader.client_url, "before", "1")
        cluster_id, ids = members_of(c.nodes[0].peer_url)
        assert STRANGER not in ids
        by_id = {int(status(n)["id"], 16): n for n in c.nodes}  # /v1/status: ids in hex
        assert sorted(by_id) == sorted(ids)
        leader_id = int(status(leader)["id"], 16)
        term = status(leader)["term"]
        follower_id = next(i for i in ids if i != leader_id)
        follower = by_id[follower_id]
        last = status(follower)["commit_index"]  # idle: the follower's last index

        def send(node, sender, to, messages):
            return asyncio.run(attack_url(node.peer_url, cluster_id, sender, to, messages))

        outcomes = []
        for mid, node in by_id.items():
            outcomes.append(
                send(
                    node,
                    STRANGER,
                    mid,
                    [
                        Message(
                            type=MessageType.MsgProp,
                            to=mid,
                            frm=STRANGER,
                            entries=(Entry(0, 0, data=forged_payload()),),
                        )
                    ],
                )
            )
            for forged_term in (term + 1000, (1 << 64) - 1):
                outcomes.append(
                    send(
                        node,
                        STRANGER,
                        mid,
                        [
                            Message(
                                type=MessageType.MsgHeartbeat,
                                to=mid,
                                frm=STRANGER,
                                term=forged_term,
                            )
                        ],
                    )
                )
        outcomes.append(
            send(
                follower,
                STRANGER,
                follower_id,
                [
                    Message(
                        type=MessageType.MsgApp,
                        to=follower_id,
                        frm=STRANGER,
                        term=term + 1,
                        log_term=term,
                        index=last,
                        commit=last + 1,
                        entries=(Entry(term + 1, last + 1, data=forged_payload()),),
                    )
                ],
            )
        )
        impersonated = send(
            leader,
            follower_id,
            leader_id,
            [
                Message(
                    type=MessageType.MsgHeartbeat, to=leader_id, frm=follower_id, term=(1 << 64) - 1
                )
            ],
        )

        # the harm first (so the old code fails on what went wrong), then the refusals
        for n in c.nodes:
            st = status(n)
            assert (st["term"], st["leader"]) == (term, format(leader_id, "x")), (n.name, st)
        rev = put(follower.client_url, "after", "2")
        for n in c.nodes:
            assert revision_and_count(n.client_url, "forged") == (rev, 0), n.name
        assert outcomes == ["refused 404"] * (3 * len(ids) + 1), outcomes
        assert impersonated == "closed"

        for n in c.nodes:  # kill -9 of every member: the WALs hold nothing forged
            c.kill(n)
        c.start()
        wait_healthy(c, timeout_s=60)
        rev = wait_for(lambda: _try_put(c), 30, "a write after the full restart")
        for n in c.nodes:
            assert revision_and_count(n.client_url, "forged") == (rev, 0), n.name
            assert status(n)["term"] < term + 100, (n.name, status(n))
    finally:
        c.stop()


def _try_put(c: LocalCluster) -> int | None:
    try:
        return put(c.nodes[0].client_url, "restarted", "3", timeout_s=5)
    except (AssertionError, OSError):
        return None
