"""Membership changes on real members in one event loop (real storage, transport, raft).

A learner joins a running three-member cluster (``--initial-cluster-state existing``), catches
up through a snapshot (small ``snapshot_count``), publishes its name and client URLs, is
promoted, and a follower is removed (it learns it and sets ``removed``); the leader removing
itself hands leadership over. Errors are etcd's.
"""

import pytest

from kvserver.assembly.member import Member
from kvserver.kvpb.kv import PutRequest, RangeRequest, prefix_range_end
from kvserver.kvpb.service_errors import ServiceError
from kvserver.membership.reconfig import (
    MSG_BAD_URLS,
    MSG_LEARNER_NOT_READY,
    MSG_MEMBER_NOT_FOUND,
    MSG_NOT_LEARNER,
    MSG_PEER_URL_EXIST,
    MSG_UNHEALTHY,
)
from tests.support.inprocess import (
    configs_with_joiners,
    retry_membership_change,
    wait_leader,
)
from tests.support.wait import async_wait_for

WAIT_S = 15.0


async def test_learner_joins_by_snapshot_is_promoted_and_a_follower_is_removed(tmp_path):
    initial, (join_cfg,) = configs_with_joiners(
        tmp_path, snapshot_count=20, snapshot_catchup_entries=5, snapshot_catchup_bytes=0
    )

    members = [Member(c) for c in initial]
    joiner = None
    try:
        for m in members:
            await m.start()
        leader = await wait_leader(members)
        for i in range(60):
            await leader.kv.put(PutRequest(b"k/%03d" % i, b"v%d" % i))
        # everyone published its name and client URLs through the leader
        await async_wait_for(
            lambda: all(m.client_urls for m in leader.membership.registry.list()),
            WAIT_S,
            "client URLs of the initial members",
        )
        # the registry is replicated state: identical everywhere once applied
        await async_wait_for(
            lambda: all(
                m.membership.registry.list() == leader.membership.registry.list() for m in members
            ),
            WAIT_S,
            "identical registries",
        )

        resp = await retry_membership_change(
            lambda: leader.kv.member_add(
                list(join_cfg.initial_advertise_peer_urls), is_learner=True
            )
        )
        new_id = resp.member.id
        assert resp.member.is_learner and resp.member.name == ""
        assert {m.id for m in resp.members} == {m.member_id for m in members} | {new_id}
        with pytest.raises(ServiceError) as err:  # same peer URLs again
            await leader.kv.member_add(list(join_cfg.initial_advertise_peer_urls), True)
        assert err.value.message == MSG_PEER_URL_EXIST
        with pytest.raises(ServiceError) as err:  # an unstarted learner
            await leader.kv.member_promote(new_id)
        assert err.value.message == MSG_LEARNER_NOT_READY

        joiner = Member(join_cfg)
        await joiner.start()
        assert joiner.member_id == new_id and joiner.cluster_id == leader.cluster_id
        await async_wait_for(
            lambda: joiner.node.applied >= leader.node.applied and joiner.node.snapshot_index > 0,
            WAIT_S,
            "the learner to catch up",
        )
        got = await joiner.kv.range(RangeRequest(b"k/", prefix_range_end(b"k/"), serializable=True))
        assert got.count == 60
        # the learner received a snapshot: it knows every member from it
        assert {m.id for m in joiner.membership.registry.list()} == {
            m.id for m in leader.membership.registry.list()
        }
        await async_wait_for(
            lambda: leader.membership.registry.get(new_id).name == join_cfg.name,
            WAIT_S,
            "the learner's name to be published",
        )
        assert joiner.kv.status().is_learner

        await retry_membership_change(lambda: leader.kv.member_promote(new_id))
        assert new_id in leader.node.conf_state.voters
        with pytest.raises(ServiceError) as err:
            await leader.kv.member_promote(new_id)
        assert err.value.message == MSG_NOT_LEARNER
        await async_wait_for(
            lambda: not joiner.kv.status().is_learner, WAIT_S, "the joiner to be a voter"
        )

        victim = next(m for m in members if m is not leader)
        resp = await retry_membership_change(lambda: leader.kv.member_remove(victim.member_id))
        assert victim.member_id not in {m.id for m in resp.members}
        await async_wait_for(
            lambda: victim.membership.removed.is_set(), WAIT_S, "the victim to learn it"
        )
        with pytest.raises(ServiceError) as err:
            await leader.kv.member_remove(victim.member_id)
        assert err.value.message == MSG_MEMBER_NOT_FOUND
        await victim.stop()
        members.remove(victim)

        put = await leader.kv.put(PutRequest(b"after", b"removal"))
        assert put.header.revision > 0
        live = [*members, joiner]
        for m in live:
            await async_wait_for(
                lambda m=m: m.node.applied >= leader.node.applied, WAIT_S, "replication"
            )
            assert m.membership.registry.list() == leader.membership.registry.list()
            assert len(m.membership.registry.list()) == 3
    finally:
        for m in [*members, *([joiner] if joiner else [])]:
            await m.stop()


async def test_the_leader_removes_itself_and_hands_over(tmp_path):
    initial, _ = configs_with_joiners(tmp_path, joiners=0)

    members = [Member(c) for c in initial]
    try:
        for m in members:
            await m.start()
        leader = await wait_leader(members)
        await async_wait_for(
            lambda: all(m.name for m in leader.membership.registry.list()), WAIT_S, "names"
        )
        await retry_membership_change(lambda: leader.kv.member_remove(leader.member_id))
        assert leader.membership.removed.is_set()
        rest = [m for m in members if m is not leader]
        new = await wait_leader(rest)
        assert new is not leader
        await leader.stop()
        resp = await new.kv.put(PutRequest(b"k", b"v"))
        assert resp.header.revision >= 2
        assert [m.id for m in new.membership.registry.list()] == sorted(m.member_id for m in rest)
    finally:
        for m in members:
            await m.stop()


async def test_changes_on_a_follower_say_not_leader_and_list_works_everywhere(tmp_path):
    initial, _ = configs_with_joiners(tmp_path, joiners=0)

    members = [Member(c) for c in initial]
    try:
        for m in members:
            await m.start()
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        with pytest.raises(ServiceError) as err:
            await follower.kv.member_add(["http://127.0.0.1:1"], True)
        assert err.value.message == "etcdserver: not leader" and err.value.retryable
        listed = await follower.kv.member_list()
        assert [m.id for m in listed.members] == sorted(m.member_id for m in members)
        assert listed.header.member_id == follower.member_id
        with pytest.raises(ServiceError) as err:
            await leader.kv.member_add(["not a url"], True)
        assert err.value.message == MSG_BAD_URLS
        with pytest.raises(ServiceError) as err:
            await leader.kv.member_remove(12345)
        assert err.value.message == MSG_MEMBER_NOT_FOUND
        # a voter that never starts: 3 of 4 started is still a quorum, so it is added;
        # then not every voter is connected: the next add is refused as unhealthy
        await async_wait_for(
            lambda: all(m.name for m in leader.membership.registry.list()), WAIT_S, "names"
        )
        await retry_membership_change(lambda: leader.kv.member_add(["http://127.0.0.1:1"], False))
        with pytest.raises(ServiceError) as err:
            await leader.kv.member_add(["http://127.0.0.1:2"], True)
        assert err.value.message == MSG_UNHEALTHY
    finally:
        for m in members:
            await m.stop()
