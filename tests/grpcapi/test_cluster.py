"""etcd's Cluster service over gRPC on a member's client URL.

In-process members (three, and one that joins); the client is grpc.aio with our generated
stubs. Every call is made on a follower, so the changes are forwarded to the leader. Checks
the members' fields, etcd's errors (peer URLs in use, bad URLs, too many learners, an
unready learner, promoting a voter, an unknown member), a learner that joins, is promoted
and is removed, the root-only changes with auth enabled (MemberList needs no user), and the
real etcdctl 3.4: ``member list -w json``, ``member add --learner``, ``member promote``,
``member remove`` print what etcd prints.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
import grpc
import pytest

from kvserver.assembly.member import Member
from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc
from kvserver.membership.reconfig import MSG_LEARNER_NOT_READY, MSG_UNHEALTHY
from tests.support.auth_setup import caught_up, enable_auth
from tests.support.etcdctl import AsyncEtcdctl
from tests.support.grpc_members import dial, published, rpc_error, target, token
from tests.support.inprocess import configs_with_joiners, running, wait_leader
from tests.support.wait import async_wait_for

T = TypeVar("T")
WAIT_S = 15.0


async def retry_change(call: Callable[[], Awaitable[T]], timeout_s: float = WAIT_S) -> T:
    """Retry a member change while the cluster is not ready for it (etcd's clients retry
    Unavailable; an unready learner or an unhealthy cluster passes with time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as err:
            retry = err.code() is grpc.StatusCode.UNAVAILABLE or err.details() in (
                MSG_LEARNER_NOT_READY,
                MSG_UNHEALTHY,
            )
            if loop.time() >= deadline or not retry:
                raise
        await asyncio.sleep(0.05)


def fields(m: rpc_pb2.Member) -> tuple:
    return (m.ID, m.name, list(m.peerURLs), list(m.clientURLs), m.isLearner)


def expected(member: Member, learner: bool = False) -> tuple:
    cfg = member.cfg
    return (
        member.member_id,
        cfg.name,
        list(cfg.initial_advertise_peer_urls),
        list(cfg.advertise_client_urls),
        learner,
    )


async def test_member_calls_over_grpc(tmp_path):
    initial, (join_cfg,) = configs_with_joiners(tmp_path)
    joiner: Member | None = None
    async with running(initial) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        await published(members)
        try:
            async with dial(follower) as channel:
                cluster = rpc_pb2_grpc.ClusterStub(channel)

                listed = await cluster.MemberList(rpc_pb2.MemberListRequest())
                assert [fields(m) for m in listed.members] == sorted(expected(m) for m in members)
                h = listed.header
                assert (h.cluster_id, h.member_id, h.revision) == (
                    leader.cluster_id,
                    follower.member_id,
                    0,
                )
                assert h.raft_term == leader.node.term
                again = await cluster.MemberList(rpc_pb2.MemberListRequest(linearizable=True))
                assert again.members == listed.members

                peer_urls = list(join_cfg.initial_advertise_peer_urls)
                added = await retry_change(
                    lambda: cluster.MemberAdd(
                        rpc_pb2.MemberAddRequest(peerURLs=peer_urls, isLearner=True)
                    )
                )
                new_id = added.member.ID
                assert fields(added.member) == (new_id, "", peer_urls, [], True)
                assert added.header.member_id == follower.member_id  # etcd's: the member asked
                assert added.header.revision == 0
                assert sorted(m.ID for m in added.members) == sorted(
                    [new_id, *(m.member_id for m in members)]
                )

                for request, code, text in (
                    (
                        rpc_pb2.MemberAddRequest(peerURLs=peer_urls),
                        grpc.StatusCode.FAILED_PRECONDITION,
                        "etcdserver: Peer URLs already exists",
                    ),
                    (
                        rpc_pb2.MemberAddRequest(peerURLs=["http://127.0.0.1:1"], isLearner=True),
                        grpc.StatusCode.FAILED_PRECONDITION,
                        "etcdserver: too many learner members in cluster",
                    ),
                    (
                        rpc_pb2.MemberAddRequest(peerURLs=["notaurl"]),
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "etcdserver: given member URLs are invalid",
                    ),
                ):
                    err = await rpc_error(cluster.MemberAdd(request))
                    assert (err.code(), err.details()) == (code, text)
                err = await rpc_error(
                    cluster.MemberPromote(rpc_pb2.MemberPromoteRequest(ID=new_id))
                )
                assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
                assert err.details() == MSG_LEARNER_NOT_READY
                err = await rpc_error(
                    cluster.MemberPromote(rpc_pb2.MemberPromoteRequest(ID=leader.member_id))
                )
                assert err.details() == "etcdserver: can only promote a learner member"
                for call in (
                    cluster.MemberPromote(rpc_pb2.MemberPromoteRequest(ID=0x42)),
                    cluster.MemberRemove(rpc_pb2.MemberRemoveRequest(ID=0x42)),
                    cluster.MemberUpdate(
                        rpc_pb2.MemberUpdateRequest(ID=0x42, peerURLs=["http://127.0.0.1:2"])
                    ),
                ):
                    err = await rpc_error(call)
                    assert err.code() is grpc.StatusCode.NOT_FOUND
                    assert err.details() == "etcdserver: member not found"

                # The learner starts, catches up, publishes itself, and is promoted.
                joiner = Member(join_cfg)
                await joiner.start()
                assert joiner.member_id == new_id
                await async_wait_for(
                    lambda: leader.membership.registry.get(new_id).client_urls,
                    WAIT_S,
                    "the learner's client URLs",
                )
                await learner_answers_as_etcds(joiner)
                promoted = await retry_change(
                    lambda: cluster.MemberPromote(rpc_pb2.MemberPromoteRequest(ID=new_id))
                )
                assert expected(joiner) in [fields(m) for m in promoted.members]

                # An update to the peer URLs it has changes nothing but is answered.
                updated = await cluster.MemberUpdate(
                    rpc_pb2.MemberUpdateRequest(ID=new_id, peerURLs=peer_urls)
                )
                assert expected(joiner) in [fields(m) for m in updated.members]
                err = await rpc_error(
                    cluster.MemberUpdate(
                        rpc_pb2.MemberUpdateRequest(
                            ID=new_id, peerURLs=list(leader.cfg.initial_advertise_peer_urls)
                        )
                    )
                )
                assert err.details() == "etcdserver: Peer URLs already exists"

                removed = await retry_change(
                    lambda: cluster.MemberRemove(rpc_pb2.MemberRemoveRequest(ID=new_id))
                )
                assert sorted(fields(m) for m in removed.members) == sorted(
                    expected(m) for m in members
                )
                await async_wait_for(
                    lambda: joiner.membership.removed.is_set(), WAIT_S, "the joiner to learn it"
                )
                # The stub's member answers from what it applied; the leader answered the
                # removal, and this follower may apply it a moment later (a busy machine).
                await async_wait_for(
                    lambda: follower.membership.registry.get(new_id) is None,
                    WAIT_S,
                    "the follower to apply the removal",
                )
                listed = await cluster.MemberList(rpc_pb2.MemberListRequest())
                assert [m.ID for m in listed.members] == sorted(m.member_id for m in members)
        finally:
            if joiner is not None:
                await joiner.stop()


async def learner_answers_as_etcds(learner: Member) -> None:
    """A learner serves Status and serializable ranges only; every other call, streams too,
    is refused Unavailable (etcd 3.4's interceptors), over gRPC and over the gateway."""
    refused = "etcdserver: rpc not supported for learner"
    async with dial(learner) as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        status = await rpc_pb2_grpc.MaintenanceStub(channel).Status(rpc_pb2.StatusRequest())
        assert status.header.member_id == learner.member_id
        await kv.Range(rpc_pb2.RangeRequest(key=b"k", serializable=True))
        for call in (
            kv.Range(rpc_pb2.RangeRequest(key=b"k")),
            kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v")),
            rpc_pb2_grpc.ClusterStub(channel).MemberList(rpc_pb2.MemberListRequest()),
            rpc_pb2_grpc.LeaseStub(channel).LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60)),
        ):
            err = await rpc_error(call)
            assert (err.code(), err.details()) == (grpc.StatusCode.UNAVAILABLE, refused)
        watch = rpc_pb2_grpc.WatchStub(channel).Watch()
        err = await rpc_error(watch.read())
        assert (err.code(), err.details()) == (grpc.StatusCode.UNAVAILABLE, refused)
    # The JSON gateway the same (etcd's reaches its gRPC server): 503 with etcd's error body.
    url = learner.cfg.advertise_client_urls[0]
    async with aiohttp.ClientSession() as http:
        for path, body in (
            ("/v3/maintenance/status", {}),
            ("/v3/kv/range", {"key": "aw==", "serializable": True}),
        ):
            async with http.post(url + path, json=body) as resp:
                assert resp.status == 200, (path, await resp.text())
        for path, body in (
            ("/v3/kv/range", {"key": "aw=="}),
            ("/v3beta/kv/put", {"key": "aw==", "value": "dg=="}),
            ("/v3/cluster/member/list", {}),
            ("/v3/lease/grant", {"TTL": 60}),
            ("/v3/watch", {"create_request": {"key": "aw=="}}),
        ):
            async with http.post(url + path, json=body) as resp:
                got = await resp.json()
                assert resp.status == 503, (path, got)
                assert (got["code"], got["message"]) == (14, refused), path
        async with http.get(url + "/health") as resp:  # raftkv's own routes: as on any member
            assert resp.status in (200, 503)
            assert "health" in await resp.json()


async def test_member_changes_need_root(tmp_path):
    initial, _ = configs_with_joiners(tmp_path, joiners=0)
    async with running(initial) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        await published(members)
        tokens = await enable_auth(leader)  # alice holds no role
        await caught_up(follower, leader)
        root, alice = token(tokens.root), token(tokens.alice)
        async with dial(follower) as channel:
            cluster = rpc_pb2_grpc.ClusterStub(channel)
            # MemberList: no user needed; a bad token is not even looked at (as etcd 3.4).
            for metadata in ((), alice, (("token", "not-a-token"),)):
                listed = await cluster.MemberList(rpc_pb2.MemberListRequest(), metadata=metadata)
                assert len(listed.members) == 3

            remove = rpc_pb2.MemberRemoveRequest(ID=0x42)
            err = await rpc_error(cluster.MemberRemove(remove))
            assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert err.details() == "etcdserver: user name is empty"
            err = await rpc_error(cluster.MemberRemove(remove, metadata=alice))
            assert err.code() is grpc.StatusCode.PERMISSION_DENIED
            assert err.details() == "etcdserver: permission denied"
            err = await rpc_error(
                cluster.MemberAdd(
                    rpc_pb2.MemberAddRequest(peerURLs=["http://127.0.0.1:3"], isLearner=True),
                    metadata=alice,
                )
            )
            assert err.details() == "etcdserver: permission denied"
            # root passes the check; the leader (forwarded, with root's token) answers.
            err = await rpc_error(cluster.MemberRemove(remove, metadata=root))
            assert err.details() == "etcdserver: member not found"
            added = await retry_change(
                lambda: cluster.MemberAdd(
                    rpc_pb2.MemberAddRequest(peerURLs=["http://127.0.0.1:3"], isLearner=True),
                    metadata=root,
                )
            )
            assert added.header.member_id == follower.member_id
            removed = await cluster.MemberRemove(
                rpc_pb2.MemberRemoveRequest(ID=added.member.ID), metadata=root
            )
            assert len(removed.members) == 3


# --- etcdctl ----------------------------------------------------------------------------------


def member_as_etcdctl_prints_it(member: Member, learner: bool = False) -> dict:
    """etcd 3.4's ``-w json`` Member: empty fields left out (no isLearner for a voter)."""
    out = {
        "ID": member.member_id,
        "name": member.cfg.name,
        "peerURLs": list(member.cfg.initial_advertise_peer_urls),
        "clientURLs": list(member.cfg.advertise_client_urls),
    }
    return {**out, "isLearner": True} if learner else out


def cluster_header(member: Member) -> dict:
    """etcd 3.4's cluster answers: a header without revision."""
    return {
        "cluster_id": member.cluster_id,
        "member_id": member.member_id,
        "raft_term": member.node.term,
    }


@pytest.mark.external
async def test_etcdctl_member_commands(tmp_path):
    initial, (join_cfg,) = configs_with_joiners(tmp_path)
    joiner: Member | None = None
    async with running(initial) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        await published(members)
        ctl = AsyncEtcdctl([target(follower)])
        try:
            listed = await ctl.json("member", "list")
            assert listed == {
                "header": cluster_header(follower),
                "members": sorted(
                    (member_as_etcdctl_prints_it(m) for m in members), key=lambda m: m["ID"]
                ),
            }
            text = await ctl.run("member", "list")
            lines = sorted(text.splitlines())
            assert lines == sorted(
                f"{m.member_id:x}, started, {m.cfg.name}, "
                f"{m.cfg.initial_advertise_peer_urls[0]}, {m.cfg.advertise_client_urls[0]}, false"
                for m in members
            )

            peer_url = join_cfg.initial_advertise_peer_urls[0]
            added = await ctl.json(
                "member",
                "add",
                join_cfg.name,
                f"--peer-urls={peer_url}",
                "--learner",
            )
            new_id = added["member"]["ID"]
            new = {"ID": new_id, "peerURLs": [peer_url], "isLearner": True}
            assert added == {
                "header": cluster_header(follower),
                "member": new,
                "members": sorted(
                    [new, *(member_as_etcdctl_prints_it(m) for m in members)],
                    key=lambda m: m["ID"],
                ),
            }
            err = await ctl.fails("member", "add", "x", f"--peer-urls={peer_url}")
            assert "etcdserver: Peer URLs already exists" in err
            err = await ctl.fails("member", "promote", f"{new_id:x}")
            assert MSG_LEARNER_NOT_READY in err

            joiner = Member(join_cfg)
            await joiner.start()
            await async_wait_for(
                lambda: leader.membership.registry.get(new_id).client_urls,
                WAIT_S,
                "the learner's client URLs",
            )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_S
            while True:  # until the learner is in sync with the leader
                code, text, err = await ctl.call("member", "promote", f"{new_id:x}")
                if code == 0 or MSG_LEARNER_NOT_READY not in err or loop.time() > deadline:
                    break
                await asyncio.sleep(0.1)
            assert code == 0, err
            # etcdctl's "%16x": space-padded
            assert text == f"Member {new_id:16x} promoted in cluster {leader.cluster_id:16x}\n"
            listed = await ctl.json("member", "list")
            assert member_as_etcdctl_prints_it(joiner) in listed["members"]

            removed = await ctl.json("member", "remove", f"{new_id:x}")
            assert removed == {
                "header": cluster_header(follower),
                "members": sorted(
                    (member_as_etcdctl_prints_it(m) for m in members), key=lambda m: m["ID"]
                ),
            }
            err = await ctl.fails("member", "remove", f"{new_id:x}")
            assert "etcdserver: member not found" in err
        finally:
            if joiner is not None:
                await joiner.stop()
