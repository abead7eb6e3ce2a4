"""A member whose registry is behind still accepts a member added while it was down.

The peer port refuses senders that are not members (404), but "member" is what this
member's registry says, and a member that was down while another was added does not know the
newcomer until it has caught up, which it can only do from the leader. If the newcomer leads,
the lagging member would refuse its leader forever (etcd's stream handler names this case and
works around it through its pipeline, which accepts any sender). raftkv asks the members it
knows (``GET /raft/members`` on their peer URLs, the registry they replicated) and accepts the
sender once one of them lists it (kvserver.rafthttp.transport, "vouched" peers).
"""

import asyncio

from kvserver.assembly.member import Member
from kvserver.kvpb.kv import PutRequest, RangeRequest, prefix_range_end
from raft import Message, MessageType
from tests.support.inprocess import (
    agreed_leader,
    configs_with_joiners,
    retry_membership_change,
    wait_leader,
)
from tests.support.wait import WaitTimeout, async_wait_for

WAIT_S = 15.0


async def _hand_leadership_to(joiner: Member, live: list[Member]) -> None:
    """Ask the leader of the moment to hand leadership to ``joiner`` (what a forwarded
    transfer request does), again after each attempt that did not take: raft gives a
    transfer up after an election timeout, and on a loaded machine the newcomer's campaign
    can lose to a member that timed out first (etcd's clients retry MoveLeader too)."""
    deadline = asyncio.get_running_loop().time() + 2 * WAIT_S
    while agreed_leader(live) is not joiner:
        if asyncio.get_running_loop().time() > deadline:
            raise WaitTimeout(f"the newcomer still not leading after {2 * WAIT_S:g} s")
        current = agreed_leader(live)
        if current is not None:
            current.node.receive(
                [
                    Message(
                        type=MessageType.MsgTransferLeader,
                        to=current.member_id,
                        frm=joiner.member_id,
                    )
                ]
            )
        try:
            await async_wait_for(lambda: agreed_leader(live) is joiner, 3, "the newcomer leading")
        except WaitTimeout:
            continue  # given up, or another member won: ask whoever leads now


async def test_a_restarted_member_follows_a_leader_added_while_it_was_down(tmp_path):
    initial, (join_cfg,) = configs_with_joiners(tmp_path)

    members = [Member(c) for c in initial]
    everyone = list(members)
    try:
        for m in members:
            await m.start()
        leader = await wait_leader(members)
        lagging = next(m for m in members if m is not leader)
        down_at = members.index(lagging)
        # The lagging member misses everything from here on: its raft node drops every
        # peer message while its streams stay up. (Stopping it instead made the test a
        # race: etcd's strict reconfig check, which raftkv follows, refuses a member add
        # while a voter is disconnected, and the leader notices a stopped member within
        # a heartbeat.)
        lagging.node.receive = lambda msgs: None
        live = [m for m in members if m is not lagging]

        resp = await retry_membership_change(
            lambda: leader.kv.member_add(
                list(join_cfg.initial_advertise_peer_urls), is_learner=True
            )
        )
        joiner = Member(join_cfg)
        everyone.append(joiner)
        await joiner.start()
        live.append(joiner)
        await async_wait_for(
            lambda: joiner.node.applied >= leader.node.applied, WAIT_S, "the learner"
        )
        await retry_membership_change(lambda: leader.kv.member_promote(resp.member.id))
        await async_wait_for(
            lambda: joiner.member_id in joiner.node.conf_state.voters,
            WAIT_S,
            "the promotion applied on the joiner",
        )
        await _hand_leadership_to(joiner, live)
        for i in range(5):
            await joiner.kv.put(PutRequest(b"k/%d" % i, b"v"))

        await lagging.stop()
        restarted = Member(initial[down_at])
        everyone[down_at] = restarted
        await restarted.start()
        await async_wait_for(
            lambda: (
                restarted.node.leader == joiner.member_id
                and restarted.node.applied >= joiner.node.applied
            ),
            20,
            "the restarted member to follow the newcomer",
        )
        got = await restarted.kv.range(
            RangeRequest(b"k/", prefix_range_end(b"k/"), serializable=True)
        )
        assert got.count == 5
        assert joiner.member_id in {m.id for m in restarted.membership.registry.list()}
    finally:
        for m in everyone:
            if m.node is not None:
                await m.stop()
