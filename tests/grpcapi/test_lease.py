"""etcd's Lease service over gRPC on a member's client URL.

Three in-process members; the client is grpc.aio with our generated stubs. Checks etcd's
answers and errors for every method, that KeepAlive and TimeToLive asked of a follower are
answered through the leader (forwarded; the header is the follower's, as etcd fills it),
that a forwarded call is never forwarded again, the auth checks (a user for every call,
write permission on the attached keys to revoke, the token carried to the leader), and the
real etcdctl 3.4 against a follower: ``lease grant``, ``timetolive --keys``, ``list``,
``keep-alive --once`` and ``revoke`` print what etcd prints.
"""

from __future__ import annotations

import asyncio
import base64

import grpc
import pytest

from kvserver.auth.perms import Permission, PermType
from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc
from kvserver.kvpb.lease import MAX_LEASE_TTL_S
from tests.support.auth_setup import caught_up, enable_auth
from tests.support.etcdctl import AsyncEtcdctl
from tests.support.grpc_members import dial, published, rpc_error, target, token
from tests.support.inprocess import configs, running, start_all, stop_all, wait_leader
from tests.support.wait import async_wait_for

WAIT_S = 15.0


async def keepalive(stub, ids, metadata=()):
    """One KeepAlive stream: each ID sent, its answer read before the next is sent."""
    call = stub.LeaseKeepAlive(metadata=metadata)
    answers = []
    for lease_id in ids:
        await call.write(rpc_pb2.LeaseKeepAliveRequest(ID=lease_id))
        answers.append(await call.read())
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    return answers


async def test_lease_calls_over_grpc(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        await published(members)
        async with (
            dial(follower) as channel,
            dial(leader) as to_leader,
        ):
            lease = rpc_pb2_grpc.LeaseStub(channel)
            kv = rpc_pb2_grpc.KVStub(channel)

            granted = await lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60))
            assert granted.ID > 0 and granted.TTL == 60 and granted.error == ""
            assert granted.header.member_id == follower.member_id
            assert granted.header.cluster_id == leader.cluster_id
            assert granted.header.revision == 1 and granted.header.raft_term > 0
            chosen = await lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=30, ID=0x1234))
            assert chosen.ID == 0x1234 and chosen.TTL == 30

            err = await rpc_error(lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=5, ID=0x1234)))
            assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert err.details() == "etcdserver: lease already exists"
            err = await rpc_error(
                lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=MAX_LEASE_TTL_S + 1))
            )
            assert err.code() is grpc.StatusCode.OUT_OF_RANGE
            assert err.details() == "etcdserver: too large lease TTL"
            err = await rpc_error(lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=-1)))
            assert err.code() is grpc.StatusCode.INVALID_ARGUMENT

            await kv.Put(rpc_pb2.PutRequest(key=b"k2", value=b"v", lease=granted.ID))
            await kv.Put(rpc_pb2.PutRequest(key=b"k1", value=b"v", lease=granted.ID))

            # Leader-only calls asked of a follower: the leader answers them.
            ttl = await lease.LeaseTimeToLive(
                rpc_pb2.LeaseTimeToLiveRequest(ID=granted.ID, keys=True)
            )
            assert ttl.header.member_id == follower.member_id
            assert ttl.ID == granted.ID and 0 < ttl.TTL <= 60 and ttl.grantedTTL == 60
            assert list(ttl.keys) == [b"k1", b"k2"]
            ttl = await lease.LeaseTimeToLive(rpc_pb2.LeaseTimeToLiveRequest(ID=granted.ID))
            assert list(ttl.keys) == [] and ttl.grantedTTL == 60
            unknown = await lease.LeaseTimeToLive(rpc_pb2.LeaseTimeToLiveRequest(ID=0x999))
            assert unknown.ID == 0x999 and unknown.TTL == -1 and unknown.grantedTTL == 0

            # One answer per request, in order; an unknown lease answers TTL 0, the stream
            # goes on.
            answers = await keepalive(lease, [granted.ID, 0x999, chosen.ID, granted.ID])
            assert [(a.ID, a.TTL) for a in answers] == [
                (granted.ID, 60),
                (0x999, 0),
                (0x1234, 30),
                (granted.ID, 60),
            ]
            assert {a.header.member_id for a in answers} == {follower.member_id}
            assert all(a.header.revision == 3 for a in answers)
            direct = await keepalive(rpc_pb2_grpc.LeaseStub(to_leader), [chosen.ID, 0x999])
            assert [(a.ID, a.TTL) for a in direct] == [(0x1234, 30), (0x999, 0)]

            listed = await lease.LeaseLeases(rpc_pb2.LeaseLeasesRequest())
            assert sorted(s.ID for s in listed.leases) == sorted([granted.ID, 0x1234])
            assert listed.header.member_id == follower.member_id
            assert listed.header.revision == 3

            revoked = await lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=granted.ID))
            assert revoked.header.revision == 4  # the keys' deletion
            got = await kv.Range(rpc_pb2.RangeRequest(key=b"k", range_end=b"l"))
            assert got.count == 0
            gone = await lease.LeaseTimeToLive(rpc_pb2.LeaseTimeToLiveRequest(ID=granted.ID))
            assert gone.TTL == -1
            err = await rpc_error(lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=granted.ID)))
            assert err.code() is grpc.StatusCode.NOT_FOUND
            assert err.details() == "etcdserver: requested lease not found"
            listed = await lease.LeaseLeases(rpc_pb2.LeaseLeasesRequest())
            assert [s.ID for s in listed.leases] == [0x1234]

            # A call that was already forwarded is not forwarded again.
            forwarded = (("x-raftkv-forwarded", "1"),)
            err = await rpc_error(
                lease.LeaseTimeToLive(
                    rpc_pb2.LeaseTimeToLiveRequest(ID=chosen.ID), metadata=forwarded
                )
            )
            assert err.code() is grpc.StatusCode.UNAVAILABLE
            assert err.details() == "etcdserver: not leader"
            stream = lease.LeaseKeepAlive(metadata=forwarded)
            await stream.write(rpc_pb2.LeaseKeepAliveRequest(ID=chosen.ID))
            err = await rpc_error(stream.read())
            assert err.code() is grpc.StatusCode.UNAVAILABLE
            assert err.details() == "etcdserver: not leader"


async def test_keepalive_stream_through_a_follower_outlives_the_leader(tmp_path):
    members = await start_all(configs(tmp_path))
    try:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        await published(members)
        async with dial(follower) as channel:
            lease = rpc_pb2_grpc.LeaseStub(channel)
            granted = await lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60))
            stream = lease.LeaseKeepAlive()
            await stream.write(rpc_pb2.LeaseKeepAliveRequest(ID=granted.ID))
            first = await stream.read()
            assert (first.ID, first.TTL) == (granted.ID, 60)

            await leader.stop()
            members.remove(leader)
            new_leader = await wait_leader(members)
            await async_wait_for(
                lambda: new_leader.kv.lessor.is_primary, WAIT_S, "the new leader's lessor"
            )
            # The same stream: renewed by the new leader (through a new stream to it, or by
            # the follower itself if it won the election).
            await stream.write(rpc_pb2.LeaseKeepAliveRequest(ID=granted.ID))
            again = await stream.read()
            assert (again.ID, again.TTL) == (granted.ID, 60)
            assert again.header.member_id == follower.member_id
            await stream.done_writing()
            assert await stream.read() is grpc.aio.EOF
    finally:
        await stop_all(members)


async def test_keepalive_with_hasleader_is_refused_without_a_leader(tmp_path):
    async with running(configs(tmp_path)) as members:
        await wait_leader(members)
        alone, *others = members
        async with dial(alone) as channel:
            lease = rpc_pb2_grpc.LeaseStub(channel)
            granted = await lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60))
            answers = await keepalive(lease, [granted.ID], metadata=(("hasleader", "true"),))
            assert answers[0].TTL == 60  # with a leader the metadata changes nothing
            kept = lease.LeaseKeepAlive(metadata=(("hasleader", "true"),))
            await kept.write(rpc_pb2.LeaseKeepAliveRequest(ID=granted.ID))
            assert (await kept.read()).TTL == 60
            for m in others:
                await m.stop()
            await async_wait_for(lambda: alone.node.leader == 0, WAIT_S, "no leader")
            # the open stream ends once the member has known no leader for a while
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async with asyncio.timeout(WAIT_S):
                    await kept.read()
            assert (err.value.code(), err.value.details()) == (
                grpc.StatusCode.UNAVAILABLE,
                "etcdserver: no leader",
            )
            call = lease.LeaseKeepAlive(metadata=(("hasleader", "true"),))
            # refused as the stream opens, before any request (a request written now could
            # find the call ended, and grpc.aio would then report its own failure)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            assert err.value.details() == "etcdserver: no leader"


async def test_lease_auth(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        await published(members)
        # alice may write under a/ only
        tokens = await enable_auth(leader, app=[Permission(PermType.READWRITE, b"a/", b"a0")])
        await caught_up(follower, leader)
        root, alice = token(tokens.root), token(tokens.alice)
        async with dial(follower) as channel:
            lease = rpc_pb2_grpc.LeaseStub(channel)
            kv = rpc_pb2_grpc.KVStub(channel)

            # Every lease call needs a user (as the gateway's lease endpoints).
            err = await rpc_error(lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60)))
            assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert err.details() == "etcdserver: user name is empty"
            err = await rpc_error(lease.LeaseLeases(rpc_pb2.LeaseLeasesRequest()))
            assert err.details() == "etcdserver: user name is empty"
            err = await rpc_error(
                lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), metadata=(("token", "x"),))
            )
            assert err.details() == "etcdserver: invalid auth token"
            stream = lease.LeaseKeepAlive()
            err = await rpc_error(stream.read())
            assert err.details() == "etcdserver: user name is empty"

            mine = await lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), metadata=alice)
            others = await lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), metadata=alice)
            await kv.Put(rpc_pb2.PutRequest(key=b"a/1", value=b"v", lease=mine.ID), metadata=alice)
            await kv.Put(rpc_pb2.PutRequest(key=b"a/2", value=b"v", lease=others.ID), metadata=root)
            await kv.Put(rpc_pb2.PutRequest(key=b"b/1", value=b"v", lease=others.ID), metadata=root)

            # The token travels with a forwarded call: the leader answers alice.
            ttl = await lease.LeaseTimeToLive(
                rpc_pb2.LeaseTimeToLiveRequest(ID=others.ID, keys=True), metadata=alice
            )
            assert ttl.header.member_id == follower.member_id and list(ttl.keys) == [b"a/2", b"b/1"]
            answers = await keepalive(lease, [mine.ID, others.ID], metadata=alice)
            assert [a.TTL for a in answers] == [60, 60]
            assert {a.header.member_id for a in answers} == {follower.member_id}

            # Revoking needs write permission on every attached key.
            err = await rpc_error(
                lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=others.ID), metadata=alice)
            )
            assert err.code() is grpc.StatusCode.PERMISSION_DENIED
            assert err.details() == "etcdserver: permission denied"
            await lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=mine.ID), metadata=alice)
            await lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=others.ID), metadata=root)
            listed = await lease.LeaseLeases(rpc_pb2.LeaseLeasesRequest(), metadata=alice)
            assert list(listed.leases) == []

            # A forwarded call acts by its token only: without one, no user.
            forwarded = (("x-raftkv-forwarded", "1"),)
            async with dial(leader) as to_leader:
                err = await rpc_error(
                    rpc_pb2_grpc.LeaseStub(to_leader).LeaseTimeToLive(
                        rpc_pb2.LeaseTimeToLiveRequest(ID=1), metadata=forwarded
                    )
                )
            assert err.details() == "etcdserver: user name is empty"


# --- etcdctl ----------------------------------------------------------------------------------


def header_fields(member, revision: int) -> dict:
    """The header as etcdctl prints it flat in lease answers (etcd 3.4)."""
    return {
        "cluster_id": member.cluster_id,
        "member_id": member.member_id,
        "revision": revision,
        "raft_term": member.node.term,
    }


@pytest.mark.external
async def test_etcdctl_lease_commands(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        await published(members)
        ctl = AsyncEtcdctl([target(follower)])

        # etcd 3.4 prints {cluster_id, member_id, revision, raft_term, ID, TTL, Error}.
        granted = await ctl.json("lease", "grant", "100")
        lease_id = granted["ID"]
        assert granted == {**header_fields(follower, 1), "ID": lease_id, "TTL": 100, "Error": ""}
        hex_id = f"{lease_id:016x}"  # as etcdctl prints it
        await ctl.run("put", "k1", "v", f"--lease={hex_id}")
        await ctl.run("put", "k2", "v", f"--lease={hex_id}")

        # {header..., id, ttl, granted-ttl, keys (base64)}: forwarded to the leader.
        ttl = await ctl.json("lease", "timetolive", "--keys", hex_id)
        assert 0 < ttl.pop("ttl") <= 100
        assert ttl == {
            **header_fields(follower, 3),
            "id": lease_id,
            "granted-ttl": 100,
            "keys": [base64.b64encode(b"k1").decode(), base64.b64encode(b"k2").decode()],
        }
        text = await ctl.run("lease", "timetolive", "--keys", hex_id)
        assert text.startswith(f"lease {hex_id} granted with TTL(100s), remaining(")
        assert text.endswith("attached keys([k1 k2])\n")

        listed = await ctl.json("lease", "list")
        assert listed == {**header_fields(follower, 3), "leases": [{"id": lease_id}]}
        text = await ctl.run("lease", "list")
        assert text == f"found 1 leases\n{hex_id}\n"

        kept = await ctl.json("lease", "keep-alive", "--once", hex_id)
        assert kept == {**header_fields(follower, 3), "ID": lease_id, "TTL": 100}
        text = await ctl.run("lease", "keep-alive", "--once", hex_id)
        assert text == f"lease {hex_id} keepalived with TTL(100)\n"

        revoked = await ctl.json("lease", "revoke", hex_id)
        assert revoked == {"header": header_fields(follower, 4)}
        gone = await ctl.json("lease", "timetolive", hex_id)
        assert gone == {
            **header_fields(follower, 4),
            "id": lease_id,
            "ttl": -1,
            "granted-ttl": 0,
            "keys": None,
        }
        text = await ctl.run("lease", "timetolive", hex_id)
        assert text == f"lease {hex_id} already expired\n"

        # etcd's client turns the TTL-0 answer of an unknown lease into "not found".
        err = await ctl.fails("lease", "keep-alive", "--once", hex_id)
        assert "etcdserver: requested lease not found" in err
        err = await ctl.fails("lease", "revoke", hex_id)
        assert "failed to revoke lease (etcdserver: requested lease not found)" in err
