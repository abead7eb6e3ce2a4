"""etcd's Watch service over gRPC on a member's client URL.

Three in-process members; the client is grpc.aio with our generated stubs. Checks several
watchers on one stream (key, range, from-key, prev_kv, filters, start revision, client-chosen
ids, cancel, progress requests and notifications, compaction, fragments) with etcd's
headers, the stream's ends (client cancel, disconnect, server stop, hub close), request
back-pressure, the ``hasleader`` metadata (refused without a leader, ended when the leader is
lost), etcd's auth refusals and cancel reasons, and the real etcdctl 3.4: ``watch --prefix
--prev-kv``, ``--rev`` and ``--interactive`` print what they print against etcd 3.4.23.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import grpc
import pytest

from kvserver.api.grpc import convert
from kvserver.api.grpc.watch import (
    MAX_QUEUED_RESPONSES,
    MSG_UNMARSHAL,
    REASON_PERMISSION_DENIED,
    encode_response,
)
from kvserver.auth import store as S
from kvserver.auth.perms import Permission, PermType
from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc
from kvserver.kvpb import kv as K
from kvserver.kvpb.errors import MSG_COMPACTED
from kvserver.kvpb.service_errors import no_leader, stopping
from kvserver.kvpb.watch import WatchResponse
from kvserver.watch.hub import MSG_DUPLICATE_WATCH_ID, MSG_WATCH_STOPPED
from tests.support import async_procs
from tests.support.auth_setup import caught_up, enable_auth
from tests.support.etcdctl import AsyncEtcdctl
from tests.support.grpc_members import dial, frontends_ready, target
from tests.support.inprocess import configs, running, wait_leader
from tests.support.wait import async_wait_for

WAIT_S = 15.0
BIG_PUTS = 3  # 1 MiB values, on a channel whose window stays 64 KiB (no BDP probing)
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0)]
ETCDCTL_TIMEOUT_S = 30.0
HASLEADER = (("hasleader", "true"),)
NOPUT, NODELETE = rpc_pb2.WatchCreateRequest.NOPUT, rpc_pb2.WatchCreateRequest.NODELETE


@pytest.fixture(params=[0, 1], ids=["member", "frontend"])
def frontends(request) -> int:
    """Watch calls served by the member itself, or kept by a front end that fans out the
    member's feeds (``kvserver.api.grpc.watch_fanout``): a client sees the same."""
    return request.param


@asynccontextmanager
async def cluster(tmp_path, frontends: int = 0):
    async with running(configs(tmp_path, grpc_frontends=frontends)) as members:
        if frontends:
            await frontends_ready(members, frontends)
        yield members


def create(**fields) -> rpc_pb2.WatchRequest:
    return rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(**fields))


def cancel(watch_id: int) -> rpc_pb2.WatchRequest:
    return rpc_pb2.WatchRequest(cancel_request=rpc_pb2.WatchCancelRequest(watch_id=watch_id))


PROGRESS = rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest())


async def read(call, n: int = 1) -> list[rpc_pb2.WatchResponse]:
    out = []
    for _ in range(n):
        resp = await asyncio.wait_for(call.read(), WAIT_S)
        assert resp is not grpc.aio.EOF, f"the stream ended after {out}"
        out.append(resp)
    return out


async def read_one(call) -> rpc_pb2.WatchResponse:
    return (await read(call))[0]


async def ended_with(call) -> grpc.aio.AioRpcError:
    """The status that ends ``call`` (every response before it is skipped)."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with asyncio.timeout(WAIT_S):
            while True:
                resp = await call.read()
                assert resp is not grpc.aio.EOF, "the stream ended with OK"
    return err.value


def events(resp) -> list[tuple[str, bytes, bytes, bytes | None]]:
    """(type, key, value, prev value or None) of each event."""
    return [
        (
            "DELETE" if ev.type == ev.DELETE else "PUT",
            ev.kv.key,
            ev.kv.value,
            ev.prev_kv.value if ev.HasField("prev_kv") else None,
        )
        for ev in resp.events
    ]


def is_progress(resp) -> bool:
    return not (resp.events or resp.created or resp.canceled or resp.compact_revision)


def header_is(resp, member, revision: int) -> bool:
    h = resp.header
    return (h.cluster_id, h.member_id, h.revision, h.raft_term) == (
        member.cluster_id,
        member.member_id,
        revision,
        member.node.term,
    )


async def test_watchers_on_one_stream(tmp_path, frontends):
    async with cluster(tmp_path, frontends) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        async with dial(follower) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            rev = (await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"0"))).header.revision
            await async_wait_for(lambda: follower.kv.store.revision >= rev, WAIT_S, "apply")
            call = rpc_pb2_grpc.WatchStub(channel).Watch()
            await call.write(create(key=b"a"))  # id 0
            await call.write(create(key=b"a", range_end=b"c", prev_kv=True))  # id 1
            await call.write(create(key=b"b", range_end=b"\0", filters=[NOPUT]))  # id 2
            await call.write(create(watch_id=7, range_end=b"\0", filters=[NODELETE]))  # all
            await call.write(create(key=b"a", watch_id=7))  # taken: refused
            await call.write(create(key=b"z", start_revision=-1))  # refused as compacted
            await call.write(create(key=b"a", start_revision=rev, watch_id=9))  # replays "a"
            created = await read(call, 7)
            assert [(r.watch_id, r.created, r.canceled) for r in created] == [
                (0, True, False),
                (1, True, False),
                (2, True, False),
                (7, True, False),
                (-1, True, True),
                (-1, True, True),
                (9, True, False),
            ]
            assert created[4].cancel_reason == MSG_DUPLICATE_WATCH_ID
            assert created[5].cancel_reason == MSG_COMPACTED
            assert all(header_is(r, follower, rev) for r in created)
            replayed = await read_one(call)
            assert (replayed.watch_id, events(replayed)) == (9, [("PUT", b"a", b"0", None)])

            put = await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"1"))
            await kv.Put(rpc_pb2.PutRequest(key=b"b", value=b"2"))
            await kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"a", range_end=b"c"))
            last = put.header.revision + 2
            got: dict[int, list] = {}
            while sum(len(v) for v in got.values()) < 11:
                resp = await read_one(call)
                assert header_is(resp, follower, resp.events[0].kv.mod_revision)
                got.setdefault(resp.watch_id, []).extend(events(resp))
            assert got == {
                0: [("PUT", b"a", b"1", None), ("DELETE", b"a", b"", None)],
                1: [
                    ("PUT", b"a", b"1", b"0"),
                    ("PUT", b"b", b"2", None),
                    ("DELETE", b"a", b"", b"1"),
                    ("DELETE", b"b", b"", b"2"),
                ],
                2: [("DELETE", b"b", b"", None)],
                7: [("PUT", b"a", b"1", None), ("PUT", b"b", b"2", None)],
                9: [("PUT", b"a", b"1", None), ("DELETE", b"a", b"", None)],
            }

            # Cancel: an unknown id is ignored; a known one answers canceled.
            await call.write(cancel(42))
            await call.write(cancel(1))
            canceled = await read_one(call)
            assert (canceled.watch_id, canceled.canceled) == (1, True)
            assert header_is(canceled, follower, last)
            # Progress: every watcher is synced, so at once, watch id -1.
            await call.write(PROGRESS)
            progress = await read_one(call)
            assert progress.watch_id == -1 and is_progress(progress)
            assert header_is(progress, follower, last)

            # The client half-closes: its watchers go on.
            await call.done_writing()
            await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"3"))
            assert {r.watch_id for r in await read(call, 3)} == {0, 7, 9}
            assert follower.kv.watch_hub.watcher_count == 4
            call.cancel()
            await async_wait_for(
                lambda: follower.kv.watch_hub.watcher_count == 0, WAIT_S, "watchers removed"
            )


async def test_progress_compaction_and_fragments(tmp_path, frontends):
    async with cluster(tmp_path, frontends) as members:
        leader = await wait_leader(members)
        async with dial(leader) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            # History of more than one replay chunk, in 12 revisions of 128 keys.
            for t in range(12):
                ops = [
                    rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"h/%04d" % (t * 128 + i)))
                    for i in range(128)
                ]
                txn = await kv.Txn(rpc_pb2.TxnRequest(success=ops))
            head = txn.header.revision
            stub = rpc_pb2_grpc.WatchStub(channel)

            # A progress request while the watcher replays is answered after the replay.
            call = stub.Watch()
            await call.write(create(key=b"h/", range_end=b"h0", start_revision=1))
            await call.write(PROGRESS)
            assert (await read_one(call)).created
            seen = 0
            while seen < 12 * 128:
                resp = await read_one(call)
                assert resp.events, resp
                seen += len(resp.events)
            assert seen == 12 * 128
            progress = await read_one(call)
            assert progress.watch_id == -1 and is_progress(progress)
            assert header_is(progress, leader, head)

            # progress_notify: the member's periodic tick reaches a quiet watcher.
            await call.write(create(key=b"q", progress_notify=True))
            quiet = (await read_one(call)).watch_id
            assert leader.kv.watch_hub.progress_tick() == 1
            tick = await read_one(call)
            assert tick.watch_id == quiet and is_progress(tick) and header_is(tick, leader, head)
            call.cancel()

            # A start revision that was compacted: canceled, compact_revision, no revision.
            await kv.Compact(rpc_pb2.CompactionRequest(revision=head))
            call = stub.Watch()
            await call.write(create(key=b"h/0001", start_revision=2))
            assert (await read_one(call)).created
            compacted = await read_one(call)
            assert compacted.canceled and compacted.compact_revision == head
            assert compacted.header.revision == 0 and compacted.header.member_id
            call.cancel()

            # Fragments: one revision over etcd's limit (request bytes + gRPC overhead) is
            # split for the watcher that asked, whole for the other.
            big = b"x" * (800 * 1024)
            for k in (b"f1", b"f2", b"f3"):
                await kv.Put(rpc_pb2.PutRequest(key=k, value=big))
            call = stub.Watch()
            await call.write(create(key=b"f", range_end=b"g", prev_kv=True, fragment=True))
            await call.write(create(key=b"f", range_end=b"g", prev_kv=True, watch_id=5))
            await read(call, 2)
            await kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"f", range_end=b"g"))
            parts = await read(call, 3)
            split = [p for p in parts if p.watch_id == 0]
            whole = [p for p in parts if p.watch_id == 5]
            assert [p.fragment for p in split] == [True, False]
            assert [len(p.events) for p in split] == [2, 1]
            assert [(len(p.events), p.fragment) for p in whole] == [(3, False)]
            keys = [ev.kv.key for p in split for ev in p.events]
            assert keys == [b"f1", b"f2", b"f3"] == [ev.kv.key for ev in whole[0].events]
            assert all(ev.prev_kv.value == big for p in parts for ev in p.events)
            call.cancel()


async def test_the_stream_ends_and_frees_its_watchers(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        a, b = [m for m in members if m is not leader]
        hub = leader.kv.watch_hub

        # Client disconnect: the channel closes under an open call.
        channel = dial(leader)
        call = rpc_pb2_grpc.WatchStub(channel).Watch()
        await call.write(create(key=b"k"))
        await call.write(create(key=b"l"))
        await read(call, 2)
        assert hub.watcher_count == 2
        await channel.close()
        await async_wait_for(lambda: hub.watcher_count == 0, WAIT_S, "watchers removed")

        # A request that is not a WatchRequest ends the call as grpc-go ends etcd's.
        async with dial(leader) as channel:
            call = channel.stream_stream("/etcdserverpb.Watch/Watch")()
            await call.write(b"\x0a\x03\x0a\x05ab")  # a create request cut short
            err = await ended_with(call)
            assert err.code() is grpc.StatusCode.INTERNAL
            assert err.details().startswith(MSG_UNMARSHAL + ": ")
        assert hub.watcher_count == 0

        # The client sends requests and reads nothing: once the member's writes wait for
        # the client (its window is full of big events) and MAX_QUEUED_RESPONSES responses
        # wait in the hub, the member stops reading requests; it goes on when the client reads.
        async with dial(leader, options=SMALL_WINDOW) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            call = rpc_pb2_grpc.WatchStub(channel).Watch()
            await call.write(create(key=b"big"))
            await read_one(call)
            big = b"v" * (1 << 20)
            for _ in range(BIG_PUTS):
                await kv.Put(rpc_pb2.PutRequest(key=b"big", value=big))
            n = 2 * MAX_QUEUED_RESPONSES
            refused = hub.stats["refused"]
            for _ in range(n):
                await call.write(create(key=b"k", range_end=b"a"))  # empty range: refused
            await async_wait_for(
                lambda: hub.stats["refused"] - refused >= MAX_QUEUED_RESPONSES - BIG_PUTS,
                WAIT_S,
                "the first requests applied",
            )
            applied = hub.stats["refused"] - refused
            # A round trip on the same connection: the member had every chance to read more.
            await kv.Range(rpc_pb2.RangeRequest(key=b"k"))
            assert hub.stats["refused"] - refused == applied <= MAX_QUEUED_RESPONSES
            answers = await read(call, BIG_PUTS + n)
            assert [len(r.events) for r in answers[:BIG_PUTS]] == [1] * BIG_PUTS
            assert all(r.canceled and r.watch_id == -1 for r in answers[BIG_PUTS:])
            assert hub.stats["refused"] - refused == n
            call.cancel()

        # The hub closes (the member is stopping): what it queued, then Unavailable.
        async with dial(a) as channel:
            call = rpc_pb2_grpc.WatchStub(channel).Watch()
            await call.write(create(key=b"k"))
            await read_one(call)
            a.kv.watch_hub.close()
            last = await read_one(call)
            assert last.canceled and last.cancel_reason == MSG_WATCH_STOPPED
            err = await ended_with(call)
            assert (err.code(), err.details()) == (grpc.StatusCode.UNAVAILABLE, stopping().message)

        # The gRPC server stops: the call is canceled, its watchers leave the hub.
        async with dial(b) as channel:
            call = rpc_pb2_grpc.WatchStub(channel).Watch()
            await call.write(create(key=b"k"))
            await read_one(call)
            assert b.kv.watch_hub.watcher_count == 1
            assert b.grpc is not None
            await b.grpc.stop()
            await async_wait_for(
                lambda: b.kv.watch_hub.watcher_count == 0, WAIT_S, "watchers removed"
            )
            await ended_with(call)


async def test_hasleader_refused_without_a_leader_and_ended_when_it_is_lost(tmp_path, frontends):
    async with cluster(tmp_path, frontends) as members:
        await wait_leader(members)
        watched, *others = members
        async with dial(watched) as channel:
            stub = rpc_pb2_grpc.WatchStub(channel)
            required = stub.Watch(metadata=HASLEADER)
            plain = stub.Watch()
            for call in (required, plain):
                await call.write(create(key=b"k"))
                assert (await read_one(call)).created
            for m in others:
                await m.stop()
            await async_wait_for(lambda: watched.node.leader == 0, WAIT_S, "no leader")
            err = await ended_with(required)
            assert (err.code(), err.details()) == (grpc.StatusCode.UNAVAILABLE, no_leader().message)

            refused = stub.Watch(metadata=HASLEADER)
            # refused as the stream opens, before any request (a request written now could
            # find the call ended, and grpc.aio would then report its own failure)
            err = await ended_with(refused)
            assert (err.code(), err.details()) == (grpc.StatusCode.UNAVAILABLE, no_leader().message)

            # Without the metadata the stream is served from the local store as before.
            await plain.write(PROGRESS)
            assert (await read_one(plain)).watch_id == -1
            assert watched.kv.watch_hub.watcher_count == 1
            plain.cancel()


async def test_auth_refusals_as_etcd(tmp_path, frontends):
    async with cluster(tmp_path, frontends) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        # alice may read a/ .. a0 only
        root, alice = await enable_auth(leader, app=[Permission(PermType.READ, b"a/", b"a0")])
        await caught_up(follower, leader)
        async with dial(follower) as channel:
            stub = rpc_pb2_grpc.WatchStub(channel)
            call = stub.Watch(metadata=(("token", alice),))
            await call.write(create(key=b"a/", range_end=b"a0"))
            await call.write(create(key=b"a/1"))
            await call.write(create(key=b"b"))
            await call.write(create(key=b"a/", range_end=b"\0"))  # from a/ on: beyond a0
            await call.write(create(range_end=b"\0"))  # every key
            answers = await read(call, 5)
            assert [(r.watch_id, r.created, r.canceled) for r in answers] == [
                (0, True, False),
                (1, True, False),
                (-1, True, True),
                (-1, True, True),
                (-1, True, True),
            ]
            assert REASON_PERMISSION_DENIED == (
                "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
            )
            assert {r.cancel_reason for r in answers[2:]} == {REASON_PERMISSION_DENIED}
            assert all(r.header.revision and r.header.member_id for r in answers)

            await rpc_pb2_grpc.KVStub(channel).Put(
                rpc_pb2.PutRequest(key=b"a/1", value=b"v"), metadata=(("token", root),)
            )
            got = await read(call, 2)
            assert sorted(r.watch_id for r in got) == [0, 1]

            # Permission revoked: the watchers of that range are canceled.
            await leader.kv.auth.propose(S.RoleRevokePermission("app", b"a/", b"a0"))
            revoked = await read(call, 2)
            assert sorted(r.watch_id for r in revoked) == [0, 1]
            assert all(r.canceled and r.cancel_reason == REASON_PERMISSION_DENIED for r in revoked)
            await async_wait_for(
                lambda: follower.kv.watch_hub.watcher_count == 0, WAIT_S, "watchers removed"
            )
            call.cancel()

            # No token, a bad token: the stream opens, its creates are refused.
            for metadata, reason in [
                ((), "rpc error: code = InvalidArgument desc = etcdserver: user name is empty"),
                (
                    (("token", "forged"),),
                    "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token",
                ),
            ]:
                call = stub.Watch(metadata=metadata)
                await call.write(create(key=b"a/1"))
                refused = await read_one(call)
                assert (refused.watch_id, refused.canceled, refused.cancel_reason) == (
                    -1,
                    True,
                    reason,
                )
                call.cancel()


def test_big_response_in_pieces_equals_one_message():
    evs = tuple(
        K.Event(
            K.EventType.PUT if i % 3 else K.EventType.DELETE,
            K.KeyValue(b"k%05d" % i, b"v" * (i % 5), 2, i + 2, 1 + i % 3, 0),
            K.KeyValue(b"k%05d" % i, b"p", 2, 2, 1, 7) if i % 2 else None,
        )
        for i in range(2500)
    )
    resp = WatchResponse(K.ResponseHeader(0, 0, 2501, 0), 3, fragment=True, events=evs)
    pieces = encode_response(resp, 11, 12, 13, step=333)
    whole = rpc_pb2.WatchResponse(
        header=rpc_pb2.ResponseHeader(cluster_id=11, member_id=12, revision=2501, raft_term=13),
        watch_id=3,
        fragment=True,
        events=[convert.event_to_pb(ev) for ev in evs],
    )
    assert rpc_pb2.WatchResponse.FromString(pieces) == whole
    assert pieces == whole.SerializeToString()


# --- etcdctl ----------------------------------------------------------------------------------


async def read_lines(proc, n: int) -> list[str]:
    lines = []
    assert proc.stdout is not None
    for _ in range(n):
        line = await asyncio.wait_for(proc.stdout.readline(), ETCDCTL_TIMEOUT_S)
        assert line, f"etcdctl ended after {lines}"
        lines.append(line.decode().rstrip("\n"))
    return lines


# What etcdctl 3.4.23 prints for these changes against etcd 3.4.23.
WATCHED_PREV_KV = "PUT foo1 a PUT foo1 a foo1 b DELETE foo1 b foo1  PUT foo2 c".split(" ")
WATCHED_FROM_REV = "PUT foo1 a PUT foo1 b DELETE foo1  PUT foo2 c".split(" ")


@pytest.mark.external
async def test_etcdctl_watch(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        ctl = AsyncEtcdctl([target(follower)])
        hub = follower.kv.watch_hub
        async with dial(leader) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            watch = await ctl.start("watch", "foo", "--prefix", "--prev-kv")
            procs = [watch]
            try:
                await async_wait_for(lambda: hub.watcher_count == 1, WAIT_S, "etcdctl's watch")
                first = (await kv.Put(rpc_pb2.PutRequest(key=b"foo1", value=b"a"))).header
                await kv.Put(rpc_pb2.PutRequest(key=b"foo1", value=b"b"))
                await kv.Put(rpc_pb2.PutRequest(key=b"bar", value=b"x"))
                await kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"foo1"))
                head = (await kv.Put(rpc_pb2.PutRequest(key=b"foo2", value=b"c"))).header
                assert await read_lines(watch, len(WATCHED_PREV_KV)) == WATCHED_PREV_KV

                await async_wait_for(
                    lambda: follower.kv.store.revision >= head.revision, WAIT_S, "apply"
                )
                replay = await ctl.start("watch", "foo", "--prefix", f"--rev={first.revision}")
                procs.append(replay)
                assert await read_lines(replay, len(WATCHED_FROM_REV)) == WATCHED_FROM_REV

                interactive = await ctl.start("watch", "--interactive", stdin=True)
                procs.append(interactive)
                assert interactive.stdin is not None
                interactive.stdin.write(b"watch foo2\n")
                await interactive.stdin.drain()
                await async_wait_for(lambda: hub.watcher_count == 3, WAIT_S, "the third watch")
                interactive.stdin.write(b"progress\n")
                await interactive.stdin.drain()
                assert await read_lines(interactive, 1) == [f"progress notify: {head.revision}"]
                await kv.Put(rpc_pb2.PutRequest(key=b"foo2", value=b"d"))
                assert await read_lines(interactive, 3) == ["PUT", "foo2", "d"]
            finally:
                for proc in procs:
                    await async_procs.stop(proc, ETCDCTL_TIMEOUT_S)
        await async_wait_for(lambda: hub.watcher_count == 0, WAIT_S, "etcdctl's watchers gone")
