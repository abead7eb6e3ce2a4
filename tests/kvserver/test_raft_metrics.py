"""The raft metrics the alert rules need, read from real members' ``/metrics``.

- ``raftkv_raft_follower_lag_entries{peer}``: on the leader, per follower, committed entries
  it has not acknowledged; a stopped follower falls behind by what was committed without it
  and is back to 0 once restarted; followers export no sample.
- ``raftkv_raft_leader_changes_seen_total`` counts as etcd's ``leader_changes_seen`` does:
  once per new leader, never for losing one; ``raftkv_raft_leader_changes_total`` counts both.
  Both are checked against every leader a member's node was told of (recorded in the test).
"""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvserver.assembly.member import Member
from kvserver.kvpb.kv import PutRequest
from kvserver.server.node import Node
from tests.support.inprocess import configs, stop_all, wait_leader

LAG = "raftkv_raft_follower_lag_entries"


async def scrape(member: Member) -> dict[tuple[str, tuple], float]:
    url = member.cfg.advertise_client_urls[0] + "/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        text = await resp.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def lag_of(samples: dict, peer: Member) -> float | None:
    return samples.get((LAG, (("peer", f"{peer.member_id:x}"),)))


async def until(probe, timeout_s: float, what: str):
    """``await probe()`` until it is truthy (bounded); its value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        last = await probe()
        if last:
            return last
        assert loop.time() < deadline, f"timed out waiting for {what} (last: {last!r:.300})"
        await asyncio.sleep(0.05)


async def test_the_leader_reports_how_far_each_follower_is_behind(tmp_path):
    cfgs = configs(tmp_path)
    members = [Member(c) for c in cfgs]
    stopped: list[Member] = []
    try:
        for m in members:
            await m.start()
        leader = await wait_leader(members)
        followers = [m for m in members if m is not leader]

        async def all_caught_up():
            s = await scrape(leader)
            return all(lag_of(s, f) == 0 for f in followers) and s

        await until(all_caught_up, 15, "both followers at lag 0")
        for f in followers:
            assert not any(name == LAG for name, _ in await scrape(f)), "a follower exports lag"

        down = followers[0]
        i = members.index(down)
        await down.stop()
        stopped.append(down)
        for n in range(30):
            await leader.node.sm.put(PutRequest(b"lag/%d" % n, b"x"))
        s = await scrape(leader)
        assert lag_of(s, down) is not None and lag_of(s, down) >= 30, s
        await until(lambda: _lag_is(leader, followers[1], 0), 15, "the running follower at lag 0")

        members[i] = Member(cfgs[i])
        await members[i].start()
        await until(lambda: _lag_is(leader, down, 0), 30, "the restarted follower at lag 0")
    finally:
        await stop_all([m for m in members if m not in stopped])


async def _lag_is(leader: Member, follower: Member, value: float) -> bool:
    return lag_of(await scrape(leader), follower) == value


async def test_leader_changes_seen_count_new_leaders_only(tmp_path, monkeypatch):
    told: dict[int, list[int]] = {}  # node id -> the leader of every soft state it handled
    handle = Node._on_soft_state

    def record(self, ss):
        if ss.lead != self.leader:
            told.setdefault(self.id, []).append(ss.lead)
        handle(self, ss)

    monkeypatch.setattr(Node, "_on_soft_state", record)
    members = [Member(c) for c in configs(tmp_path)]
    stopped: list[Member] = []
    try:
        for m in members:
            await m.start()
        old = await wait_leader(members)
        await old.stop()
        stopped.append(old)
        survivors = [m for m in members if m is not old]
        new = await wait_leader(survivors)
        assert new is not old
        lost = 0
        for m in survivors:
            s = await scrape(m)
            changes = told[m.member_id]
            seen = [lead for lead in changes if lead != 0]
            lost += len(changes) - len(seen)
            assert s[("raftkv_raft_leader_changes_seen_total", ())] == len(seen) >= 2, changes
            assert s[("raftkv_raft_leader_changes_total", ())] == len(changes), changes
        # The winner was a candidate (leader unknown) for at least one Ready: a loss was
        # seen, and counted by one counter only.
        assert lost >= 1, told
    finally:
        await stop_all([m for m in members if m not in stopped])
