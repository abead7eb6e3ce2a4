"""etcd's Maintenance service over gRPC on a member's client URL.

Three in-process members. With grpc.aio clients and our stubs: Status on every member,
alarms raised, listed, refusing writes and disarmed, Defragment, HashKV equal on every member
and following the revision asked for (compacted and future revisions refused as etcd does),
the Snapshot stream as etcd's snapshot file (a bolt database and its SHA-256), MoveLeader
(leader only, a bad target refused), Downgrade unimplemented, and with auth enabled root
only for everything but Status.

With the real etcdctl 3.4, run as a subprocess (asyncio's, so the members keep serving
meanwhile): ``endpoint status|health|hashkv --cluster``, ``alarm list|disarm``, ``defrag``,
``snapshot save`` (the file read by ``etcdctl snapshot status`` and restored with ``raftkv
snapshot restore`` into a new cluster that serves the saved keys), and ``move-leader``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import urllib.error
import urllib.request

import grpc
import pytest

from bolt import BoltReader
from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc
from kvserver.etcdsnap.importer import read_etcd_db
from kvserver.kvpb.headers import ETCD_VERSION
from kvserver.mvcc.store import MVCCStore
from tests.support import async_procs
from tests.support.auth_setup import enable_auth
from tests.support.etcdctl import AsyncEtcdctl
from tests.support.grpc_members import dial, published, refused
from tests.support.inprocess import configs, running, wait_leader
from tests.support.wait import async_wait_for

RUN_TIMEOUT_S = 60.0
WAIT_S = 15.0
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def maintenance(channel) -> rpc_pb2_grpc.MaintenanceStub:
    return rpc_pb2_grpc.MaintenanceStub(channel)


async def put_keys(member, n: int, prefix: bytes = b"k") -> int:
    """``n`` puts through ``member``; the revision of the last."""
    async with dial(member) as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        rev = 0
        for i in range(n):
            put = await kv.Put(rpc_pb2.PutRequest(key=prefix + b"%03d" % i, value=b"v%d" % i))
            rev = put.header.revision
        return rev


async def all_applied(members) -> int:
    """Wait until every member has applied the same index (and so the same revision)."""

    def same():
        applied = {m.node.applied for m in members}
        return (
            len(applied) == 1 and members[0].node.applied >= members[0].node.status()["committed"]
        )

    await async_wait_for(same, WAIT_S, "every member at the same applied index")
    return members[0].kv.store.revision


async def expect_error(call, code: grpc.StatusCode, details: str) -> None:
    assert await refused(call) == (code, details)


async def test_status_alarm_and_defragment(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        rev = await put_keys(leader, 3)
        await published(members)  # no more entries after these
        await all_applied(members)
        for m in members:
            async with dial(m) as channel:
                st = await maintenance(channel).Status(rpc_pb2.StatusRequest())
            node = m.node.status()
            assert st.header.member_id == m.member_id
            assert st.header.cluster_id == m.cluster_id
            assert st.header.revision == rev
            assert st.version == ETCD_VERSION
            assert st.leader == leader.member_id
            assert st.raftTerm == m.node.term and st.header.raft_term == st.raftTerm
            assert st.raftIndex == node["committed"] and st.raftAppliedIndex == node["applied"]
            assert st.dbSize == st.dbSizeInUse == m.kv.store.db_size_bytes > 0
            assert not st.isLearner and list(st.errors) == []

        follower = next(m for m in members if m is not leader)
        async with dial(follower) as channel:
            mt = maintenance(channel)
            kv = rpc_pb2_grpc.KVStub(channel)
            nospace = rpc_pb2.AlarmRequest(
                action=rpc_pb2.AlarmRequest.ACTIVATE,
                memberID=leader.member_id,
                alarm=rpc_pb2.NOSPACE,
            )
            raised = await mt.Alarm(nospace)
            assert [(a.memberID, a.alarm) for a in raised.alarms] == [
                (leader.member_id, rpc_pb2.NOSPACE)
            ]
            listed = await mt.Alarm(rpc_pb2.AlarmRequest())  # GET, every type
            assert [(a.memberID, a.alarm) for a in listed.alarms] == [
                (leader.member_id, rpc_pb2.NOSPACE)
            ]
            assert (await mt.Alarm(rpc_pb2.AlarmRequest(alarm=rpc_pb2.CORRUPT))).alarms == []
            st = await mt.Status(rpc_pb2.StatusRequest())
            assert list(st.errors) == [f"memberID:{leader.member_id} alarm:NOSPACE "]
            await expect_error(
                kv.Put(rpc_pb2.PutRequest(key=b"x", value=b"y")),
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "etcdserver: mvcc: database space exceeded",
            )
            disarm = rpc_pb2.AlarmRequest(
                action=rpc_pb2.AlarmRequest.DEACTIVATE,
                memberID=leader.member_id,
                alarm=rpc_pb2.NOSPACE,
            )
            assert len((await mt.Alarm(disarm)).alarms) == 1
            assert (await mt.Alarm(rpc_pb2.AlarmRequest())).alarms == []
            await kv.Put(rpc_pb2.PutRequest(key=b"x", value=b"y"))
            await expect_error(
                mt.Alarm(rpc_pb2.AlarmRequest(action=7)),
                grpc.StatusCode.INVALID_ARGUMENT,
                "raftkv: unknown alarm action 7",
            )

            before = await mt.Status(rpc_pb2.StatusRequest())
            defrag = await mt.Defragment(rpc_pb2.DefragmentRequest())
            assert defrag.header.member_id == follower.member_id
            after = await mt.Status(rpc_pb2.StatusRequest())
            assert after.dbSize == before.dbSize == after.dbSizeInUse

            code, details = await refused(mt.Downgrade(rpc_pb2.DowngradeRequest(version="3.4.0")))
            assert code is grpc.StatusCode.UNIMPLEMENTED
            assert "Downgrade is not supported" in (details or "")


async def test_hashkv_is_equal_on_every_member_and_follows_the_revision(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        await put_keys(leader, 20)
        mid = await put_keys(leader, 5, prefix=b"k")  # overwrites k000..k004
        async with dial(leader) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            await kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"k010", range_end=b"k015"))
        rev = await all_applied(members)

        async def hashes(revision: int = 0) -> list[rpc_pb2.HashKVResponse]:
            out = []
            for m in members:
                async with dial(m) as channel:
                    out.append(
                        await maintenance(channel).HashKV(rpc_pb2.HashKVRequest(revision=revision))
                    )
            return out

        now = await hashes()
        assert {(h.hash, h.hash_revision, h.compact_revision, h.header.revision) for h in now} == {
            (now[0].hash, rev, -1, rev)
        }
        assert [h.header.member_id for h in now] == [m.member_id for m in members]
        at_mid = await hashes(mid)
        assert len({h.hash for h in at_mid}) == 1 and at_mid[0].hash_revision == mid
        assert at_mid[0].hash != now[0].hash

        async with dial(members[1]) as channel:
            mt = maintenance(channel)
            whole = await mt.Hash(rpc_pb2.HashRequest())
            assert (whole.hash, whole.header.revision) == (now[0].hash, rev)
            await expect_error(
                mt.HashKV(rpc_pb2.HashKVRequest(revision=rev + 1)),
                grpc.StatusCode.OUT_OF_RANGE,
                "etcdserver: mvcc: required revision is a future revision",
            )
            await rpc_pb2_grpc.KVStub(channel).Compact(rpc_pb2.CompactionRequest(revision=mid))
        await all_applied(members)
        compacted = await hashes()
        # The history before the compaction is gone from the hash, the same on every member
        # (however far each has got with cutting the old versions).
        assert len({(h.hash, h.compact_revision) for h in compacted}) == 1
        assert compacted[0].compact_revision == mid and compacted[0].hash != now[0].hash
        async with dial(members[2]) as channel:
            await expect_error(
                maintenance(channel).HashKV(rpc_pb2.HashKVRequest(revision=mid)),
                grpc.StatusCode.OUT_OF_RANGE,
                "etcdserver: mvcc: required revision has been compacted",
            )
            after = await maintenance(channel).HashKV(rpc_pb2.HashKVRequest(revision=mid + 1))
            assert after.hash_revision == mid + 1


async def read_snapshot(member) -> tuple[list[rpc_pb2.SnapshotResponse], bytes]:
    async with dial(member) as channel:
        messages = [m async for m in maintenance(channel).Snapshot(rpc_pb2.SnapshotRequest())]
    return messages, b"".join(m.blob for m in messages)


async def test_snapshot_stream_is_etcds_snapshot_file(tmp_path, monkeypatch):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        async with dial(leader) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            for i in range(300):  # values big enough for several messages
                await kv.Put(rpc_pb2.PutRequest(key=b"big%03d" % i, value=os.urandom(4096)))
        rev = await all_applied(members)
        follower = next(m for m in members if m is not leader)
        serialized = 0
        serialize = MVCCStore.serialize

        def counted(store, *args, **kwargs):
            nonlocal serialized
            serialized += store is follower.kv.store
            return serialize(store, *args, **kwargs)

        monkeypatch.setattr(MVCCStore, "serialize", counted)
        messages, data = await read_snapshot(follower)
        assert serialized == 1  # the image is produced once, then sent from its spill file

        assert len(messages) > 2
        assert len(data) % 4096 == 32  # whole bolt pages, then the SHA-256
        assert data[-32:] == hashlib.sha256(data[:-32]).digest()
        assert [m.remaining_bytes for m in messages] == [
            len(data) - sum(len(x.blob) for x in messages[: i + 1]) for i in range(len(messages))
        ]
        assert messages[-1].remaining_bytes == 0
        assert {(m.header.member_id, m.header.revision) for m in messages} == {
            (follower.member_id, rev)
        }
        summary = read_etcd_db(BoltReader(data[:-32])).summary
        assert (summary.revision, summary.keys) == (rev, 300)
        # The stream the handler took is closed: the store may cut compacted versions.
        assert follower.kv.store._open_streams == 0


async def test_move_leader(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        follower, other = [m for m in members if m is not leader]
        async with dial(follower) as channel:
            await expect_error(
                maintenance(channel).MoveLeader(
                    rpc_pb2.MoveLeaderRequest(targetID=other.member_id)
                ),
                grpc.StatusCode.FAILED_PRECONDITION,
                "etcdserver: not leader",
            )
        async with dial(leader) as channel:
            mt = maintenance(channel)
            await expect_error(
                mt.MoveLeader(rpc_pb2.MoveLeaderRequest(targetID=12345)),
                grpc.StatusCode.FAILED_PRECONDITION,
                "etcdserver: bad leader transferee",
            )
            same = await mt.MoveLeader(rpc_pb2.MoveLeaderRequest(targetID=leader.member_id))
            assert same.header.member_id == leader.member_id
            await mt.MoveLeader(rpc_pb2.MoveLeaderRequest(targetID=follower.member_id))
        # The call returns once the old leader sees the target lead.
        assert leader.node.leader == follower.member_id
        assert (await wait_leader(members)) is follower


async def test_with_auth_everything_but_status_needs_root(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        root, alice = await enable_auth(leader, app=())  # alice: a role without permissions
        async with dial(leader) as channel:
            mt = maintenance(channel)

            def calls(token: str | None):
                md = (("token", token),) if token else None
                return [
                    mt.Alarm(rpc_pb2.AlarmRequest(), metadata=md),
                    mt.Defragment(rpc_pb2.DefragmentRequest(), metadata=md),
                    mt.Hash(rpc_pb2.HashRequest(), metadata=md),
                    mt.HashKV(rpc_pb2.HashKVRequest(), metadata=md),
                    mt.MoveLeader(
                        rpc_pb2.MoveLeaderRequest(targetID=leader.member_id), metadata=md
                    ),
                    _first_snapshot_message(mt, md),
                ]

            for call in calls(None):
                await expect_error(
                    call, grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty"
                )
            for call in calls(alice):
                await expect_error(
                    call, grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied"
                )
            for call in calls(root):
                await call
            for md in (None, (("token", alice),), (("token", "not-a-token"),)):
                st = await mt.Status(rpc_pb2.StatusRequest(), metadata=md)
                assert st.header.member_id == leader.member_id


async def _first_snapshot_message(mt, metadata) -> rpc_pb2.SnapshotResponse:
    stream = mt.Snapshot(rpc_pb2.SnapshotRequest(), metadata=metadata)
    try:
        async for message in stream:
            return message
    finally:
        stream.cancel()
    raise AssertionError("an empty snapshot stream")


# --- etcdctl 3.4 -----------------------------------------------------------------------------


def etcdctl(members) -> AsyncEtcdctl:
    """etcdctl at ``members``' client URLs, given time for defrag and snapshot calls."""
    return AsyncEtcdctl(
        [m.cfg.advertise_client_urls[0] for m in members],
        "--command-timeout=20s",
        timeout_s=RUN_TIMEOUT_S,
    )


@pytest.mark.external
async def test_etcdctl_endpoint_alarm_and_defrag(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        ctl = etcdctl(members[:1])  # --cluster finds the others through MemberList
        await put_keys(leader, 10)
        await published(members)
        rev = await all_applied(members)
        by_url = {m.cfg.advertise_client_urls[0]: m for m in members}

        status = await ctl.json("endpoint", "status", "--cluster")
        assert sorted(s["Endpoint"] for s in status) == sorted(by_url)
        for s in status:
            m = by_url[s["Endpoint"]]
            st = s["Status"]
            assert st["header"]["member_id"] == m.member_id
            assert st["header"]["revision"] == rev
            assert st["leader"] == leader.member_id
            assert st["raftAppliedIndex"] == m.node.applied
            assert st["dbSize"] == st["dbSizeInUse"] > 0

        code, _, health = await ctl.call("endpoint", "health", "--cluster")  # on stderr
        assert code == 0 and health.count("is healthy") == 3, health

        hashes = await ctl.json("endpoint", "hashkv", "--cluster")
        assert sorted(h["Endpoint"] for h in hashes) == sorted(by_url)
        assert len({h["HashKV"]["hash"] for h in hashes}) == 1
        assert {h["HashKV"]["header"]["revision"] for h in hashes} == {rev}

        assert (await ctl.run("alarm", "list")) == ""
        async with dial(leader) as channel:
            await maintenance(channel).Alarm(
                rpc_pb2.AlarmRequest(
                    action=rpc_pb2.AlarmRequest.ACTIVATE,
                    memberID=leader.member_id,
                    alarm=rpc_pb2.NOSPACE,
                )
            )
        listed = await ctl.run("alarm", "list")
        assert listed.strip() == f"memberID:{leader.member_id} alarm:NOSPACE"
        disarmed = await ctl.run("alarm", "disarm")
        assert disarmed.strip() == f"memberID:{leader.member_id} alarm:NOSPACE"
        assert (await ctl.run("alarm", "list")) == ""
        assert all(len(m.kv.alarms.get()) == 0 for m in members)

        defrag = await ctl.run("defrag", "--cluster")
        assert defrag.count("Finished defragmenting etcd member") == 3, defrag


@pytest.mark.external
async def test_etcdctl_snapshot_save_then_raftkv_restore(tmp_path):
    async with running(configs(tmp_path / "old")) as members:
        leader = await wait_leader(members)
        await put_keys(leader, 50, prefix=b"saved/")
        async with dial(leader) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            await kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"saved/000"))
            saved = await kv.Range(rpc_pb2.RangeRequest(key=b"saved/", range_end=b"saved0"))
        await all_applied(members)
        path = str(tmp_path / "backup.db")
        follower = next(m for m in members if m is not leader)
        out = await etcdctl([follower]).run("snapshot", "save", path)
        assert out.strip() == f"Snapshot saved at {path}"
        old_cluster = leader.cluster_id

    status = await raftkv("snapshot", "status", path, "--json")
    info = json.loads(status)
    assert (info["format"], info["revision"], info["keys"]) == ("etcd", saved.header.revision, 49)
    etcd_status = json.loads(await etcdctl([]).run("snapshot", "status", path, "-w", "json"))
    assert etcd_status["revision"] == saved.header.revision

    cfgs = configs(tmp_path / "new", prefix="r", token="restored")
    for cfg in cfgs:
        await raftkv(
            "snapshot",
            "restore",
            path,
            "--data-dir",
            cfg.data_dir,
            "--name",
            cfg.name,
            "--initial-cluster",
            cfg.initial_cluster,
            "--initial-cluster-token",
            cfg.initial_cluster_token,
            "--initial-advertise-peer-urls",
            cfg.initial_advertise_peer_urls[0],
        )
    async with running(cfgs) as restored:
        await wait_leader(restored)
        for m in restored:
            async with dial(m) as channel:
                got = await rpc_pb2_grpc.KVStub(channel).Range(
                    rpc_pb2.RangeRequest(key=b"saved/", range_end=b"saved0")
                )
            assert list(got.kvs) == list(saved.kvs)
            assert got.header.cluster_id != old_cluster


async def raftkv(*args: str) -> str:
    code, out, err = await async_procs.run(
        [sys.executable, "-m", "kvserver.cli", *args], RUN_TIMEOUT_S, cwd=REPO
    )
    assert code == 0, f"raftkv {' '.join(args)}: {err}"
    return out


@pytest.mark.external
async def test_etcdctl_move_leader(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        ctl = etcdctl(members)
        follower = next(m for m in members if m is not leader)
        out = await ctl.run("move-leader", f"{follower.member_id:x}")
        assert out.strip() == (
            f"Leadership transferred from {leader.member_id:x} to {follower.member_id:x}"
        )
        assert (await wait_leader(members)) is follower
        assert "etcdserver: bad leader transferee" in await ctl.fails("move-leader", "1234")


async def test_snapshot_streams_past_the_bound_are_refused_in_both_dialects(tmp_path):
    """Each snapshot stream serializes the whole store (and an etcd-format one starts a
    conversion process): past --max-snapshot-streams, a call is refused at once."""
    async with running(configs(tmp_path, max_snapshot_streams=1)) as members:
        leader = await wait_leader(members)
        gate = leader.snapshot_gate
        messages, _ = await read_snapshot(leader)  # one at a time is served
        assert messages and gate.running == 0
        async with gate.stream():  # a stream in progress holds the only place
            async with dial(leader) as channel:
                stream = maintenance(channel).Snapshot(rpc_pb2.SnapshotRequest())
                code, details = await refused(stream.read())
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, details
            url = leader.cfg.advertise_client_urls[0] + "/v3/maintenance/snapshot"
            status, body = await asyncio.to_thread(post_raw, url)
            assert status == 429 and b"snapshot streams are running" in body
        assert gate.refused == 2
        messages, _ = await read_snapshot(leader)  # the place is free again
        assert messages


def post_raw(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
