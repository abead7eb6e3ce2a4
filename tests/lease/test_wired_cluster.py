"""Leases wired into the running server: three in-process ``Member``s (real storage and
transport, one event loop), plus the state machine's snapshot framing on its own.

Shows: grant -> put with the lease -> revoke deletes the keys in one revision; a lease nobody
keeps alive is revoked by the leader's expiry task; a lease kept alive survives the leader
being stopped (the new leader promotes its lessor with extended deadlines); a follower's service
refuses keep-alive with a retryable ``etcdserver: not leader``, and its HTTP API forwards it to
the leader; the lease table is in snapshots.
"""

import asyncio
import json

import pytest

from kvserver.api.shared.leader import leader_client_url
from kvserver.kvpb.errors import LeaseNotFoundError
from kvserver.kvpb.kv import PutRequest, RangeRequest, prefix_range_end
from kvserver.kvpb.lease import LeaseGrantRequest
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.lease.codec import encode_lease_entry
from kvserver.mvcc.codec import encode_entry
from kvserver.server.replicated_kv import RaftKV
from tests.lease.helpers import kv, wait_promoted
from tests.support.apply_now import raftkv_without_raft
from tests.support.inprocess import configs, start_all, stop_all
from tests.support.wait import async_wait_for

POLL_S = 0.05


async def keys(member, prefix: bytes) -> list[bytes]:
    got = await kv(member).range(RangeRequest(prefix, prefix_range_end(prefix)))
    return [x.key for x in got.kvs]


async def test_revoke_deletes_the_leases_keys_in_one_revision(tmp_path):
    members = await start_all(configs(tmp_path))
    try:
        leader = await wait_promoted(members)
        follower = next(m for m in members if m is not leader)
        # grant through a follower: proposed through raft like any write
        grant = await kv(follower).lease_grant(60)
        lease = grant.lease_id
        assert grant.ttl_s == 60 and lease > 0
        assert grant.header.member_id == follower.member_id
        with pytest.raises(LeaseNotFoundError):
            await kv(leader).put(PutRequest(b"svc/x", b"1", lease=lease + 1))
        for name in (b"svc/a", b"svc/b", b"svc/c"):
            await kv(leader).put(PutRequest(name, b"up", lease=lease))
        before = (await kv(leader).range(RangeRequest(b"svc/"))).header.revision
        ttl = await kv(leader).lease_time_to_live(lease, keys=True)
        assert ttl.keys == (b"svc/a", b"svc/b", b"svc/c") and ttl.granted_ttl_s == 60
        for m in members:  # every member applied the grant
            assert [lease] == list((await kv(m).lease_leases()).leases)
        revoked = await kv(follower).lease_revoke(lease)
        assert revoked.header.revision == before + 1  # three deletions, one revision
        for m in members:
            assert await keys(m, b"svc/") == []
            assert len(kv(m).lessor) == 0
        with pytest.raises(LeaseNotFoundError):
            await kv(leader).lease_revoke(lease)
    finally:
        await stop_all(members)


async def test_follower_refuses_keepalive_with_retryable_not_leader(tmp_path):
    members = await start_all(configs(tmp_path))
    try:
        leader = await wait_promoted(members)
        lease = (await kv(leader).lease_grant(30)).lease_id
        follower = next(m for m in members if m is not leader)
        for call in (
            kv(follower).lease_keepalive(lease),
            kv(follower).lease_time_to_live(lease),
        ):
            with pytest.raises(ServiceError) as err:
                await call
            assert err.value.grpc_code == GrpcCode.UNAVAILABLE and err.value.retryable
            assert err.value.message == "etcdserver: not leader"
        assert (await kv(leader).lease_keepalive(lease)).ttl_s == 30
    finally:
        await stop_all(members)


async def test_a_lease_not_kept_alive_expires_and_its_key_is_deleted(tmp_path):
    members = await start_all(configs(tmp_path))
    try:
        leader = await wait_promoted(members)
        lease = (await kv(leader).lease_grant(2)).lease_id
        await kv(leader).put(PutRequest(b"eph/1", b"x", lease=lease))
        kept = (await kv(leader).lease_grant(60)).lease_id
        await kv(leader).put(PutRequest(b"eph/2", b"y", lease=kept))
        for _ in range(300):  # bounded poll (15 s) for the leader's revoke
            if all(not kv(m).lessor.exists(lease) for m in members):
                break
            await asyncio.sleep(POLL_S)
        for m in members:
            assert not kv(m).lessor.exists(lease) and kv(m).lessor.exists(kept)
            assert await keys(m, b"eph/") == [b"eph/2"]
        ttl = await kv(leader).lease_time_to_live(lease)
        assert ttl.ttl_s == -1
    finally:
        await stop_all(members)


async def test_a_kept_alive_lease_survives_a_leader_change(tmp_path):
    members = await start_all(configs(tmp_path))
    try:
        old = await wait_promoted(members)
        lease = (await kv(old).lease_grant(2)).lease_id
        await kv(old).put(PutRequest(b"lock/owner", b"me", lease=lease))
        assert (await kv(old).lease_keepalive(lease)).ttl_s == 2
        await old.stop()
        rest = [m for m in members if m is not old]
        new = await wait_promoted(rest)
        assert new is not old
        # keep it alive through the new leader for longer than TTL + election timeout (2.2 s)
        renewals = 0
        for _ in range(9):
            assert (await kv(new).lease_keepalive(lease)).ttl_s == 2
            renewals += 1
            await asyncio.sleep(0.4)
        assert renewals == 9
        for m in rest:
            assert kv(m).lessor.exists(lease)
            assert await keys(m, b"lock/") == [b"lock/owner"]
        # and once nobody keeps it alive, the new leader expires it
        for _ in range(300):
            if not any(kv(m).lessor.exists(lease) for m in rest):
                break
            await asyncio.sleep(POLL_S)
        for m in rest:
            assert not kv(m).lessor.exists(lease)
            assert await keys(m, b"lock/") == []
    finally:
        await stop_all([m for m in members if m is not old])


def test_snapshot_carries_the_lease_table_and_restore_rebinds_the_store():
    def member(member_id: int) -> RaftKV:
        return raftkv_without_raft(cluster_id=1, member_id=member_id, name="m", members=())

    src = member(1)
    src.apply(1, encode_lease_entry(LeaseGrantRequest(30, 7)))
    src.apply(2, encode_entry(PutRequest(b"k", b"v", lease=7)))
    data = b"".join(src.snapshot_chunks())
    dst = member(2)
    dst.restore(data)
    assert dst.lessor.exists(7) and dst.lessor.lookup(7).ttl_s == 30
    assert dst.store.keys_with_lease(7) == [b"k"]
    # the restored store asks the restored lessor: an unknown lease is refused
    assert isinstance(
        dst.apply(3, encode_entry(PutRequest(b"x", b"", lease=8))), LeaseNotFoundError
    )
    assert dst.apply(4, encode_entry(PutRequest(b"x", b"", lease=7))).header.revision == 3
    # a snapshot from before leases (the bare MVCC stream) restores an empty table
    old = member(3)
    old.restore(b"".join(src.store.serialize()))
    assert len(old.lessor) == 0 and old.store.get(b"k") is not None


async def test_lease_routes_over_http_on_real_members(tmp_path):
    import aiohttp

    members = await start_all(configs(tmp_path))
    try:
        leader = await wait_promoted(members)
        follower = next(m for m in members if m is not leader)
        lurl = leader.cfg.advertise_client_urls[0]
        furl = follower.cfg.advertise_client_urls[0]
        async with aiohttp.ClientSession() as http:

            async def post(url, path, body):
                async with http.post(url + path, json=body) as resp:
                    return resp.status, resp.headers.get("Transfer-Encoding"), await resp.text()

            status, _, text = await post(furl, "/v3/lease/grant", {"TTL": 30})
            assert status == 200
            lease = json.loads(text)["ID"]
            status, _, _ = await post(
                lurl, "/v3/kv/put", {"key": "aw==", "value": "dg==", "lease": lease}
            )
            assert status == 200
            status, chunked, text = await post(lurl, "/v3/lease/keepalive", {"ID": lease})
            assert (status, chunked, text.count("\n")) == (200, "chunked", 1)
            assert json.loads(text)["result"]["TTL"] == "30"
            # Only the leader renews leases: a follower forwards the keep-alive to the leader's
            # client URL once the leader has published it (before that: "not leader").
            await async_wait_for(
                lambda: leader_client_url(kv(follower)) is not None, 15.0, "the leader's URL"
            )
            status, _, text = await post(furl, "/v3/lease/keepalive", {"ID": lease})
            assert status == 200 and json.loads(text)["result"]["TTL"] == "30"
            status, _, text = await post(lurl, "/v3/lease/timetolive", {"ID": lease, "keys": True})
            assert status == 200 and json.loads(text)["keys"] == ["aw=="]
            status, _, text = await post(furl, "/v3/kv/lease/leases", {})
            assert json.loads(text)["leases"] == [{"ID": lease}]
            status, _, text = await post(furl, "/v3/lease/revoke", {"ID": lease})
            assert status == 200
            status, _, text = await post(lurl, "/v3/kv/range", {"key": "aw=="})
            assert "kvs" not in json.loads(text)
    finally:
        await stop_all(members)
