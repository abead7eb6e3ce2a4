"""Forged peer frames change nothing; three members in one event loop.

An attacker reads the cluster ID and the member IDs from ``GET /raft/members`` (it is open:
a joining member needs it) and opens ``/raft/stream`` with crafted frames:

- from an ID that is not a member: refused with 404 ``sender not found`` as etcd's stream
  handler does (``peerGetter.Get(from) == nil``), so a proposal is never applied, a heartbeat
  of term + 1000 or 2**64 - 1 does not depose the leader, and a forged append does not make
  a follower diverge;
- with a member's ID (possible until peer TLS exists) and impossible values (a term past the
  bound of kvserver.rafthttp.validate, entries of a term above the message's): the frame is
  dropped and the stream closed;
- after each attack the cluster has the same leader at the same term, accepts writes, no
  member has the forged key, all members agree on the revision, and a member restarted
  afterwards rejoins.

Also: a message the sender cannot encode (msgpack's OverflowError)
is dropped with an ERROR, and that peer's sender task keeps running.
"""

import dataclasses
import logging

import aiohttp
import pytest

from kvserver.assembly.member import Member
from kvserver.kvpb.kv import PutRequest, RangeRequest
from raft import Entry, Message, MessageType
from tests.kvserver.peer_attack import (
    CLUSTER_HEADER,
    FORGED_KEY,
    FROM_HEADER,
    STRANGER,
    TO_HEADER,
    attack_url,
    forged_payload,
)
from tests.support.inprocess import configs, wait_leader


async def attack(member: Member, sender: int, messages: list[Message]) -> str:
    return await attack_url(
        member.cfg.listen_peer_urls[0], member.cluster_id, sender, member.member_id, messages
    )


async def cluster(tmp_path) -> tuple[list, list[Member], Member]:
    cfgs = configs(tmp_path)
    members = [Member(c) for c in cfgs]
    for m in members:
        await m.start()
    leader = await wait_leader(members)
    await leader.node.sm.put(PutRequest(b"before", b"1"))
    for m in members:  # every member has applied the leader's entries of its term
        await m.node.sm.range(RangeRequest(b"before"))
    return cfgs, members, leader


async def assert_unharmed(members: list[Member], leader: Member, term: int) -> None:
    """Same leader, same term, writes still commit, nobody has the forged key, one revision."""
    for m in members:
        assert m.node.term == term, (m.cfg.name, m.node.term, term)
        assert m.node.leader == leader.member_id, (m.cfg.name, m.node.leader)
    follower = next(m for m in members if m is not leader)
    resp = await follower.node.sm.put(PutRequest(b"after", b"2"))
    revisions = set()
    for m in members:
        got = await m.node.sm.range(RangeRequest(FORGED_KEY))
        assert got.count == 0, f"{m.cfg.name} applied the forged write"
        after = await m.node.sm.range(RangeRequest(b"after"))
        assert after.count == 1
        revisions.add(after.header.revision)
    assert revisions == {resp.header.revision}, revisions


async def assert_restart_is_fine(cfgs, members: list[Member], i: int) -> None:
    await members[i].stop()
    members[i] = Member(cfgs[i])
    await members[i].start()
    leader = await wait_leader(members)
    resp = await leader.node.sm.put(PutRequest(b"restarted", b"3"))
    got = await members[i].node.sm.range(RangeRequest(b"restarted"))
    assert got.count == 1 and got.header.revision == resp.header.revision


async def test_a_proposal_from_a_stranger_is_refused_and_never_applied(tmp_path, caplog):
    cfgs, members, leader = await cluster(tmp_path)
    try:
        term = leader.node.term
        prop = Message(
            type=MessageType.MsgProp,
            to=0,
            frm=STRANGER,
            entries=(Entry(0, 0, data=forged_payload()),),
        )
        outcomes = []
        with caplog.at_level(logging.WARNING, logger="kvserver.rafthttp.transport"):
            for m in members:
                for _ in range(3):  # refusals are logged, but rate-limited
                    outcomes.append(
                        await attack(m, STRANGER, [dataclasses.replace(prop, to=m.member_id)])
                    )
        await assert_unharmed(members, leader, term)
        assert outcomes == ["refused 404"] * 9, outcomes
        refusals = [r for r in caplog.records if "sender not found" in r.getMessage()]
        assert len(refusals) == len(members), [r.getMessage() for r in refusals]
        assert all(m.transport.refused_by_peer[STRANGER] == 3 for m in members)
        # Each refusal asked the other members whether they know the sender (a member
        # whose registry is behind accepts a newcomer they list): none does.
        for m in members:
            task = m.transport._vouch_task
            if task is not None:
                await task
            assert (
                await attack(m, STRANGER, [dataclasses.replace(prop, to=m.member_id)])
                == "refused 404"
            )
            assert not m.transport._vouched
    finally:
        for m in members:
            await m.stop()


async def test_heartbeats_of_a_higher_term_from_a_stranger_depose_no_leader(tmp_path):
    """term + 1000 and 2**64 - 1 (the value that left the cluster leaderless forever)."""

    cfgs, members, leader = await cluster(tmp_path)
    try:
        term = leader.node.term
        outcomes = []
        for forged_term in (term + 1000, (1 << 64) - 1):
            for m in members:
                hb = Message(
                    type=MessageType.MsgHeartbeat,
                    to=m.member_id,
                    frm=STRANGER,
                    term=forged_term,
                )
                outcomes.append(await attack(m, STRANGER, [hb]))
        await assert_unharmed(members, leader, term)
        assert outcomes == ["refused 404"] * 6, outcomes
        await assert_restart_is_fine(cfgs, members, members.index(leader))
    finally:
        for m in members:
            await m.stop()


async def test_a_forged_append_from_a_stranger_makes_no_follower_diverge(tmp_path):
    cfgs, members, leader = await cluster(tmp_path)
    try:
        term = leader.node.term
        f = next(m for m in members if m is not leader)
        log = f.node.raw.raft.log
        last = log.last_index()
        app = Message(
            type=MessageType.MsgApp,
            to=f.member_id,
            frm=STRANGER,
            term=term + 1,
            log_term=log.last_term(),
            index=last,
            commit=last + 1,
            entries=(Entry(term + 1, last + 1, data=forged_payload()),),
        )
        outcome = await attack(f, STRANGER, [app])
        await assert_unharmed(members, leader, term)
        assert outcome == "refused 404"
        await assert_restart_is_fine(cfgs, members, members.index(f))
    finally:
        for m in members:
            await m.stop()


async def test_impossible_values_under_a_members_id_are_dropped_and_the_stream_closed(tmp_path):
    """Until peer TLS, anyone can claim a member's ID; impossible values still get nowhere:
    a term past the bound (2**64 - 1 overflowed the pre-vote term before), an appended entry
    of a term above the message's, a message whose ``from`` is not the stream's sender."""

    cfgs, members, leader = await cluster(tmp_path)
    try:
        term = leader.node.term
        f = next(m for m in members if m is not leader)
        other = next(m for m in members if m is not leader and m is not f)
        hb = Message(
            type=MessageType.MsgHeartbeat,
            to=leader.member_id,
            frm=f.member_id,
            term=(1 << 64) - 1,
        )
        outcomes = [await attack(leader, f.member_id, [hb])]
        log = f.node.raw.raft.log
        last = log.last_index()
        app = Message(
            type=MessageType.MsgApp,
            to=f.member_id,
            frm=leader.member_id,
            term=term,
            log_term=log.last_term(),
            index=last,
            commit=last + 1,
            entries=(Entry(term + 1, last + 1, data=forged_payload()),),
        )
        outcomes.append(await attack(f, leader.member_id, [app]))
        spoofed = Message(
            type=MessageType.MsgHeartbeat, to=f.member_id, frm=STRANGER, term=term + 1000
        )
        outcomes.append(await attack(f, other.member_id, [spoofed]))
        await assert_unharmed(members, leader, term)
        assert outcomes == ["closed"] * 3, outcomes
        await assert_restart_is_fine(cfgs, members, members.index(f))
    finally:
        for m in members:
            await m.stop()


async def test_a_message_that_cannot_be_encoded_is_dropped_and_the_sender_keeps_running(
    tmp_path, caplog
):
    cfgs, members, leader = await cluster(tmp_path)
    try:
        f = next(m for m in members if m is not leader)
        sender = leader.transport._peers[f.member_id]
        bad = Message(
            type=MessageType.MsgHeartbeat, to=f.member_id, frm=leader.member_id, term=1 << 64
        )  # msgpack raises OverflowError
        with caplog.at_level(logging.ERROR, logger="kvserver.rafthttp.transport"):
            leader.transport.send([bad])
            resp = await leader.node.sm.put(PutRequest(b"next", b"1"))
            got = await f.node.sm.range(RangeRequest(b"next"))
        assert got.count == 1 and got.header.revision == resp.header.revision
        assert not sender.task.done(), "the peer sender task ended"
        assert sender.connected
        assert any("cannot be encoded" in r.getMessage() and r.exc_info for r in caplog.records), [
            r.getMessage() for r in caplog.records
        ]
    finally:
        for m in members:
            await m.stop()


@pytest.mark.parametrize(
    "headers",
    [
        {FROM_HEADER: str(STRANGER)},
        {TO_HEADER: "12345"},
    ],
)
async def test_snapshot_requests_get_the_same_checks(tmp_path, headers):
    """``POST /raft/snapshot`` from a stranger: 404; meant for another member: 412."""

    cfgs, members, leader = await cluster(tmp_path)
    try:
        f = next(m for m in members if m is not leader)
        base = {
            CLUSTER_HEADER: str(f.cluster_id),
            FROM_HEADER: str(leader.member_id),
            TO_HEADER: str(f.member_id),
        }
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f.cfg.listen_peer_urls[0] + "/raft/snapshot",
                data=b"\0\0\0\1\x90",
                headers={**base, **headers},
            ) as r:
                status, text = r.status, await r.text()
        want = (404, "sender not found") if FROM_HEADER in headers else (412, "to field")
        assert (status, text[: len(want[1])]) == want, (status, text)
    finally:
        for m in members:
            await m.stop()
