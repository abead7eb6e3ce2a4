"""Three members in one event loop, real storage and transport, no subprocesses.

Fast checks of the node driver's contract: proposals through a follower
commit via the leader; linearizable reads see every acknowledged write; a member restarted
from its data directory recovers its state from snapshot + WAL; a member that was down while
the others snapshotted and compacted catches up through a snapshot; write batching gives
fewer WAL fsyncs than entries.
"""

import asyncio

import pytest

from kvserver.assembly.member import Member
from kvserver.kvpb.kv import PutRequest, RangeRequest, prefix_range_end
from tests.support.inprocess import configs, start_all, stop_all, wait_leader
from tests.support.wait import async_wait_for


def kv(member: Member):
    return member.node.sm


async def test_writes_through_a_follower_and_linearizable_reads_everywhere(tmp_path):
    members = await start_all(configs(tmp_path))
    try:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        resp = await kv(follower).put(PutRequest(b"job/1", b"running"))
        assert resp.header.member_id == follower.member_id
        await asyncio.gather(
            *(kv(m).put(PutRequest(b"job/%d" % i, b"done")) for i, m in enumerate(members * 10))
        )
        for m in members:
            got = await kv(m).range(RangeRequest(b"job/", prefix_range_end(b"job/")))
            assert got.count == 30 and got.header.revision == resp.header.revision + 30
    finally:
        await stop_all(members)


async def test_group_commit_gives_fewer_fsyncs_than_entries(tmp_path):
    """Proposals arriving while a Ready is being written share the next Ready and its one
    fsync (one fsync per batch, not per request)."""

    members = await start_all(configs(tmp_path))
    try:
        leader = await wait_leader(members)
        before = dict(leader.storage.stats())
        await asyncio.gather(*(kv(leader).put(PutRequest(b"k%d" % i, b"v")) for i in range(400)))
        after = leader.storage.stats()
        entries = after["wal_entries"] - before["wal_entries"]
        syncs = after["wal_syncs"] - before["wal_syncs"]
        assert entries >= 400
        assert syncs * 4 <= entries, f"{syncs} fsyncs for {entries} entries"
    finally:
        await stop_all(members)


async def test_restarted_member_recovers_from_snapshot_and_wal(tmp_path):
    cfgs = configs(
        tmp_path, snapshot_count=50, snapshot_catchup_entries=10, snapshot_catchup_bytes=0
    )

    members = await start_all(cfgs)
    try:
        await wait_leader(members)
        for i in range(120):
            await kv(members[i % 3]).put(PutRequest(b"r%03d" % i, b"%d" % i))
        victim = members[2]
        # snapshots are made in the background: wait for the victim's, bounded
        await async_wait_for(lambda: victim.node.snapshot_index > 0, 30.0, "a snapshot")
        await victim.stop()
        members[2] = Member(cfgs[2])
        await members[2].start()
        got = await kv(members[2]).range(RangeRequest(b"r", b"s"))
        assert got.count == 120
        assert {kv.key: kv.value for kv in got.kvs}[b"r119"] == b"119"
        # the snapshot it loaded is kept for followers mapped from its file, not in the heap
        kept = members[2].storage.raft_storage.snapshot()
        assert kept.metadata.index > 0 and isinstance(kept.data, memoryview)
    finally:
        await stop_all(members)


async def test_member_that_missed_compacted_entries_catches_up_by_snapshot(tmp_path):
    cfgs = configs(
        tmp_path, snapshot_count=30, snapshot_catchup_entries=5, snapshot_catchup_bytes=0
    )

    members = await start_all(cfgs)
    try:
        leader = await wait_leader(members)
        down = next(i for i, m in enumerate(members) if m is not leader)
        await members[down].stop()
        up = [m for i, m in enumerate(members) if i != down]
        for i in range(100):
            await kv(up[i % 2]).put(PutRequest(b"c%03d" % i, b"x"))
        # the log is cut once a snapshot is made, in the background: wait for it
        await async_wait_for(
            lambda: leader.storage.raft_storage.first_index() > 10, 30.0, "the leader's log cut"
        )
        members[down] = Member(cfgs[down])
        await members[down].start()
        node = members[down].node
        for _ in range(500):
            if node.applied >= leader.node.applied:
                break
            await asyncio.sleep(0.02)
        assert node.snapshot_index > 0, "caught up without a snapshot"
        got = await kv(members[down]).range(RangeRequest(b"c", b"d", serializable=True))
        assert got.count == 100
        # the snapshots kept for followers are mapped from their files, not held in memory
        # (the leader's own, and the one this member received)
        for member in (leader, members[down]):
            kept = member.storage.raft_storage.snapshot()
            assert kept.metadata.index > 0 and isinstance(kept.data, memoryview)
        # the replaced state is handed back to the OS, once per installed snapshot (a second
        # install is raft doing its job: the leader may snapshot and cut its five-entry
        # window again while this member installs the first); a log cut of entries this
        # small is not worth a trim (tests/kvserver/test_log_cut.py has the cuts that are)
        assert members[down].heap_trimmer.requested["snapshot-installed"] >= 1
        assert leader.heap_trimmer.requested["log-cut"] == 0
    finally:
        await stop_all(members)


@pytest.mark.parametrize("bad", [b"\x00", b"\xff" * 40, b"garbage that is not msgpack"])
async def test_peer_garbage_does_not_stop_a_member(tmp_path, bad):
    """A peer stream carrying garbage is closed; the member keeps serving."""
    import aiohttp

    members = await start_all(configs(tmp_path))
    try:
        await wait_leader(members)
        m = members[0]
        url = m.cfg.listen_peer_urls[0] + "/raft/stream"
        headers = {
            "X-Raftkv-Cluster-Id": str(m.cluster_id),
            "X-Raftkv-From": str(members[1].member_id),
        }
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(url, headers=headers) as ws:
                await ws.send_bytes(bad)
                msg = await ws.receive(timeout=5)
                assert msg.type in (
                    aiohttp.WSMsgType.CLOSE,
                    aiohttp.WSMsgType.CLOSED,
                    aiohttp.WSMsgType.CLOSING,
                )
            wrong = dict(headers, **{"X-Raftkv-Cluster-Id": "12345"})
            async with s.get(url, headers=wrong) as resp:
                assert resp.status == 412
        await kv(m).put(PutRequest(b"still", b"alive"))
    finally:
        await stop_all(members)


async def test_a_member_applies_its_own_writes_without_decoding_them(tmp_path, monkeypatch):
    """Each entry is decoded by the members that did not propose it; the proposer applies the
    request it holds, and the stores agree."""
    from kvserver.server import replicated_kv

    decoded: list[bytes] = []
    real = replicated_kv.decode_entry

    def counting(data):
        client_id, request_id, req = real(data)
        if isinstance(req, PutRequest) and req.key.startswith(b"own/"):
            decoded.append(req.key)
        return client_id, request_id, req

    monkeypatch.setattr(replicated_kv, "decode_entry", counting)
    members = await start_all(configs(tmp_path))
    try:
        await wait_leader(members)
        writes = [(m, b"own/%d" % i) for i, m in enumerate(members * 5)]
        answers = await asyncio.gather(*(kv(m).put(PutRequest(k, b"v")) for m, k in writes))
        last = max(a.header.revision for a in answers)
        contents = []
        for m in members:  # linearizable: every member has applied every write
            got = await kv(m).range(RangeRequest(b"own/", prefix_range_end(b"own/")))
            assert got.header.revision >= last
            contents.append([(x.key, x.mod_revision) for x in got.kvs])
            assert kv(m)._own_proposals == {}
        assert contents[0] == contents[1] == contents[2] and len(contents[0]) == len(writes)
        assert sorted(decoded) == sorted(k for _, k in writes for _ in range(2))
    finally:
        await stop_all(members)
