"""Retried lease grants and revokes are applied once (the lessor's request-id dedup table).

A grant or revoke entry with ``client_id != 0`` whose ``(client_id, request_id)`` was applied
before changes nothing and answers the first outcome — the first lease ID even when the retry
was proposed with another server-chosen ID, the first error too — on every replica alike,
after a snapshot restore and after a leader change. Shown at the lessor, at ``RaftKV``'s
apply / snapshot level, through the HTTP API over ``LocalKV`` and on in-process members.
"""

import random

import msgpack
import pytest

from kvserver.kvpb.lease import (
    LeaseGrantRequest,
    LeaseGrantResponse,
    LeaseRevokeRequest,
    LeaseRevokeResponse,
)
from kvserver.lease.codec import LeaseCheckpointRequest, encode_lease_entry
from kvserver.lease.errors import LeaseExistsError, TooManyLeasesError
from kvserver.lease.lessor import Lessor
from kvserver.mvcc import (
    EventType,
    InvalidArgumentError,
    LeaseNotFoundError,
    MVCCStore,
    PutRequest,
    SnapshotFormatError,
    encode_entry,
)
from kvserver.server.replicated_kv import RaftKV
from tests.api.fakes import LocalKV
from tests.api.helpers import serve
from tests.support.apply_now import raftkv_without_raft
from tests.support.inprocess import configs, start_all, stop_all

from .helpers import FakeClock, ids, kv, make, wait_promoted

CID = 0xC11E
IDS_HEADERS = ("X-Raftkv-Client-Id", "X-Raftkv-Request-Id")


def grant_entry(lessor: Lessor, gen, ttl_s=10, lease_id=0, cid=CID, rid=1) -> bytes:
    """What a member proposes for a client's grant (ID chosen at propose time)."""
    req = lessor.prepare_grant(
        LeaseGrantRequest(ttl_s, lease_id), gen, client_id=cid, request_id=rid
    )
    return encode_lease_entry(req, cid, rid)


# ---------------------------------------------------------------------------------------------
# Lessor level


def test_retried_server_chosen_grant_applies_once_with_the_first_id():
    lessor, store, _ = make()
    gen = ids()
    first_entry = grant_entry(lessor, gen)
    retry_entry = grant_entry(lessor, gen)  # proposed before the first applied: another ID
    assert first_entry != retry_entry
    first = lessor.apply_entry(first_entry)
    assert first.error is None and not first.duplicate and len(lessor) == 1
    store.apply(PutRequest(b"k", b"v"))  # the revision moves on meanwhile
    again = lessor.apply_entry(retry_entry)
    assert again.duplicate and again.error is None and again.events == ()
    assert again.response == first.response  # same ID, TTL and first revision
    assert again.revision == store.revision == 2
    assert len(lessor) == 1 and lessor.exists(first.response.lease_id)
    # a retry proposed after the first applied also gets the first answer
    late = lessor.apply_entry(grant_entry(lessor, gen))
    assert late.duplicate and late.response == first.response and len(lessor) == 1


def test_retried_client_chosen_grant_reaches_the_log_and_answers_the_first_response():
    lessor, _, _ = make()
    gen = ids()
    first = lessor.apply_entry(grant_entry(lessor, gen, ttl_s=30, lease_id=7))
    assert first.response == LeaseGrantResponse(first.response.header, 7, 30)
    # prepare_grant no longer refuses the retry early ("already exists")...
    again = lessor.apply_entry(grant_entry(lessor, gen, ttl_s=30, lease_id=7))
    assert again.duplicate and again.response == first.response
    # ...but still refuses another request for the same ID
    with pytest.raises(LeaseExistsError):
        grant_entry(lessor, gen, ttl_s=30, lease_id=7, rid=2)
    other = lessor.apply(LeaseGrantRequest(30, 7), CID, 2)
    assert other.error == LeaseExistsError() and not other.duplicate


def test_retry_is_not_refused_early_when_the_table_is_full():
    lessor, _, _ = make(max_leases=1)
    gen = ids()
    first = lessor.apply_entry(grant_entry(lessor, gen))
    with pytest.raises(TooManyLeasesError):
        grant_entry(lessor, gen, rid=2)
    again = lessor.apply_entry(grant_entry(lessor, gen))
    assert again.duplicate and again.response == first.response and len(lessor) == 1


def test_retried_revoke_answers_the_first_response_and_changes_nothing():
    lessor, store, _ = make()
    lessor.apply(LeaseGrantRequest(10, 5))
    store.apply(PutRequest(b"a", b"1", lease=5))
    first = lessor.apply(LeaseRevokeRequest(5), CID, 9)
    assert first.error is None and [e.type for e in first.events] == [EventType.DELETE]
    assert first.response == LeaseRevokeResponse(first.response.header)
    # the same ID is granted again (another request) and a key attached
    lessor.apply(LeaseGrantRequest(10, 5), CID, 10)
    store.apply(PutRequest(b"b", b"2", lease=5))
    revision = store.revision
    again = lessor.apply_entry(encode_lease_entry(LeaseRevokeRequest(5), CID, 9))
    assert again.duplicate and again.response == first.response and again.events == ()
    assert again.response.header.revision == first.response.header.revision < revision
    assert lessor.exists(5) and store.keys_with_lease(5) == [b"b"]
    assert store.revision == revision


def test_a_first_error_is_the_answer_to_its_retries():
    lessor, _, _ = make()
    first = lessor.apply(LeaseRevokeRequest(5), CID, 1)
    assert first.error == LeaseNotFoundError()
    lessor.apply(LeaseGrantRequest(10, 5))
    again = lessor.apply(LeaseRevokeRequest(5), CID, 1)
    assert again.duplicate and again.error == LeaseNotFoundError() and again.response is None
    assert lessor.exists(5)  # the retry did not revoke the lease granted meanwhile


def test_different_request_ids_and_clients_are_independent_and_client_zero_is_not_deduped():
    lessor, _, _ = make()
    gen = ids()
    a = lessor.apply_entry(grant_entry(lessor, gen, rid=1))
    b = lessor.apply_entry(grant_entry(lessor, gen, rid=2))
    c = lessor.apply_entry(grant_entry(lessor, gen, cid=CID + 1, rid=1))
    assert not (a.duplicate or b.duplicate or c.duplicate)
    assert len({a.response.lease_id, b.response.lease_id, c.response.lease_id}) == 3
    # client 0: no dedup (the second identical grant is refused as usual)
    assert lessor.apply(LeaseGrantRequest(10, 99), 0, 1).error is None
    second = lessor.apply(LeaseGrantRequest(10, 99), 0, 1)
    assert second.error == LeaseExistsError() and not second.duplicate
    assert not lessor.remembers(0, 1) and lessor.remembers(CID, 1)


def test_a_pair_reused_for_another_kind_of_request_is_refused_and_changes_nothing():
    lessor, _, _ = make()
    lessor.apply(LeaseGrantRequest(10, 5), CID, 1)
    res = lessor.apply(LeaseRevokeRequest(5), CID, 1)
    assert res.duplicate and isinstance(res.error, InvalidArgumentError)
    assert lessor.exists(5)
    lessor.apply(LeaseRevokeRequest(5), CID, 2)
    res = lessor.apply(LeaseGrantRequest(10, 6), CID, 2)
    assert res.duplicate and isinstance(res.error, InvalidArgumentError)
    assert not lessor.exists(6)


def test_checkpoints_are_not_deduplicated():
    lessor, _, _ = make(primary=False)
    lessor.apply(LeaseGrantRequest(100, 5))
    lessor.apply(LeaseCheckpointRequest(((5, 40),)), CID, 1)
    lessor.apply(LeaseCheckpointRequest(((5, 30),)), CID, 1)
    assert lessor.lookup(5).remaining_ttl_s == 30 and not lessor.remembers(CID, 1)


def test_bounds_evict_like_the_store_table():
    lessor, _, _ = make(dedup_ids_per_client=2, dedup_max_clients=2)
    for rid in (1, 2, 3):
        lessor.apply(LeaseGrantRequest(10, rid), CID, rid)
    assert not lessor.remembers(CID, 1) and lessor.remembers(CID, 3)
    # evicted: the retry is applied again (here: the lease exists, so "already exists")
    assert lessor.apply(LeaseGrantRequest(10, 1), CID, 1).error == LeaseExistsError()
    # a third client evicts the least recently used one
    lessor.apply(LeaseGrantRequest(10, 20), 2, 1)
    lessor.apply(LeaseGrantRequest(10, 30), 3, 1)
    assert not lessor.remembers(CID, 3) and lessor.remembers(2, 1)
    assert lessor.dedup.client_count == 2 and len(lessor.dedup) == 2


# ---------------------------------------------------------------------------------------------
# Snapshots


def test_snapshot_restore_keeps_the_table_and_its_order():
    lessor, _, _ = make(dedup_ids_per_client=2, dedup_max_clients=2)
    gen = ids()
    grant = lessor.apply_entry(grant_entry(lessor, gen, rid=1))
    lessor.apply(LeaseGrantRequest(10, 4))
    revoke = lessor.apply(LeaseRevokeRequest(4), CID, 2)
    failed = lessor.apply(LeaseRevokeRequest(4), 2, 1)
    assert failed.error == LeaseNotFoundError()
    lessor.apply(LeaseGrantRequest(-1, 8), 2, 2)  # an InvalidArgumentError outcome
    blob = lessor.snapshot()
    other = Lessor(
        store=MVCCStore(), clock=FakeClock(), dedup_ids_per_client=2, dedup_max_clients=2
    )
    other.restore(blob)
    assert other.snapshot() == blob
    assert other.dedup.export() == lessor.dedup.export()
    for replica in (lessor, other):  # the same answers on both (first grant: another ID)
        assert replica.apply_entry(grant_entry(replica, gen, rid=1)).response == grant.response
        assert replica.apply(LeaseRevokeRequest(4), CID, 2).response == revoke.response
        assert replica.apply(LeaseRevokeRequest(4), 2, 1).error == LeaseNotFoundError()
    assert other.snapshot() == lessor.snapshot()
    # the order came along: a new client evicts the least recently used one (CID) on both
    for replica in (lessor, other):
        replica.apply(LeaseGrantRequest(10, 50), 3, 1)
        assert not replica.remembers(CID, 1) and replica.remembers(2, 1)
    assert other.snapshot() == lessor.snapshot()


def test_version_1_snapshot_restores_with_an_empty_table():
    lessor, _, _ = make()
    lessor.apply(LeaseGrantRequest(10, 5), CID, 1)
    old = msgpack.packb({"magic": "raftkv-lease-snapshot", "version": 1, "leases": [[3, 20, 0]]})
    lessor.restore(old)
    assert lessor.exists(3) and not lessor.exists(5) and len(lessor.dedup) == 0


def _v2(dedup):
    return msgpack.packb(
        {"magic": "raftkv-lease-snapshot", "version": 2, "leases": [[1, 5, 0]], "dedup": dedup}
    )


@pytest.mark.parametrize(
    "blob",
    [
        msgpack.packb({"magic": "raftkv-lease-snapshot", "version": 2, "leases": []}),
        _v2([[0, []]]),  # client 0 is never remembered
        _v2([[1, []], [1, []]]),  # a client twice
        _v2([[1, [[1, [2, 3]], [1, [2, 3]]]]]),  # a request id twice
        _v2([[1, [[1, [9, 3]]]]]),  # unknown outcome
        _v2([[1, [[1, [1, 3, 4]]]]]),  # short grant outcome
        _v2([[1, [[1, [0, "nope", "x"]]]]]),  # unknown error tag
        _v2([[-1, [[1, [2, 3]]]]]),  # negative client id
        _v2("x"),
    ],
)
def test_damaged_dedup_table_is_refused_and_changes_nothing(blob):
    lessor, _, _ = make()
    lessor.apply(LeaseGrantRequest(10, 9), CID, 1)
    before = lessor.snapshot()
    with pytest.raises(SnapshotFormatError):
        lessor.restore(blob)
    assert lessor.snapshot() == before


# ---------------------------------------------------------------------------------------------
# RaftKV: apply, snapshot, propose path


def raftkv(member_id: int) -> RaftKV:
    return raftkv_without_raft(cluster_id=1, member_id=member_id, name=f"m{member_id}", members=())


def test_raftkv_replicas_answer_a_retry_alike_also_after_a_snapshot():
    a, b = raftkv(1), raftkv(2)
    gen_a, gen_b = ids(1), ids(2)  # the first attempt went to member 1, the retry to 2
    first = grant_entry(a.lessor, gen_a, ttl_s=60)
    retry = grant_entry(b.lessor, gen_b, ttl_s=60)
    assert first != retry
    log = [first, encode_entry(PutRequest(b"k", b"v")), retry]
    answers = {m: [m.apply(i + 1, e) for i, e in enumerate(log)] for m in (a, b)}
    assert answers[a] == answers[b]
    assert answers[a][2] == answers[a][0] and len(a.lessor) == len(b.lessor) == 1
    # a member that restores a snapshot taken here answers the next retry the same
    c = raftkv(3)
    c.restore(b"".join(a.snapshot_chunks()))
    later = grant_entry(c.lessor, ids(3), ttl_s=60)
    assert {m.apply(4, later) for m in (a, b, c)} == {answers[a][0]}
    assert a.lessor.snapshot() == b.lessor.snapshot() == c.lessor.snapshot()


async def test_raftkv_lease_methods_answer_retries_the_first_outcome():
    kv = raftkv(1)

    first = await kv.lease_grant(30, client_id=CID, request_id=1)
    assert await kv.lease_grant(30, client_id=CID, request_id=1) == first
    chosen = await kv.lease_grant(30, 77, client_id=CID, request_id=2)
    assert await kv.lease_grant(30, 77, client_id=CID, request_id=2) == chosen
    with pytest.raises(LeaseExistsError):  # without ids: refused at propose time
        await kv.lease_grant(30, 77)
    revoked = await kv.lease_revoke(77, client_id=CID, request_id=3)
    assert await kv.lease_revoke(77, client_id=CID, request_id=3) == revoked
    with pytest.raises(LeaseNotFoundError):
        await kv.lease_revoke(77, client_id=CID, request_id=4)
    assert list((await kv.lease_leases()).leases) == [first.lease_id]
    assert first.header.member_id == 1 and first.header.raft_term == 3


# ---------------------------------------------------------------------------------------------
# HTTP API (LocalKV) and in-process members


async def test_api_same_grant_and_revoke_twice_with_the_same_headers():
    async with serve(LocalKV(bind_leases=True)) as api:
        h1 = dict(zip(IDS_HEADERS, ("12", "1"), strict=True))
        status, first = await api.post("/v3/lease/grant", {"TTL": 30}, headers=h1)
        assert status == 200 and int(first["ID"]) > 0
        assert await api.post("/v3/lease/grant", {"TTL": 30}, headers=h1) == (200, first)
        h2 = dict(zip(IDS_HEADERS, ("12", "2"), strict=True))
        status, second = await api.post("/v3/lease/grant", {"TTL": 30}, headers=h2)
        assert status == 200 and second["ID"] != first["ID"]
        status, listed = await api.post("/v3/lease/leases", {})
        assert sorted(x["ID"] for x in listed["leases"]) == sorted([first["ID"], second["ID"]])
        h3 = dict(zip(IDS_HEADERS, ("12", "3"), strict=True))
        revoked = await api.post("/v3/lease/revoke", {"ID": first["ID"]}, headers=h3)
        assert revoked[0] == 200
        assert await api.post("/v3/lease/revoke", {"ID": first["ID"]}, headers=h3) == revoked
        # without ids a retry is a new request: not found
        status, body = await api.post("/v3/lease/revoke", {"ID": first["ID"]})
        assert status == 404 and body["error"] == "etcdserver: requested lease not found"


async def test_retry_through_another_member_and_after_a_leader_change(tmp_path):
    members = await start_all(configs(tmp_path))
    live = list(members)
    try:
        leader = await wait_promoted(members)
        follower = next(m for m in members if m is not leader)
        first = await kv(leader).lease_grant(60, client_id=CID, request_id=1)
        again = await kv(follower).lease_grant(60, client_id=CID, request_id=1)
        assert again.lease_id == first.lease_id
        assert again.header.revision == first.header.revision
        await leader.stop()
        live = [m for m in members if m is not leader]
        new = await wait_promoted(live)
        after = await kv(new).lease_grant(60, client_id=CID, request_id=1)
        assert after.lease_id == first.lease_id
        for m in live:
            assert list((await kv(m).lease_leases()).leases) == [first.lease_id]
    finally:
        await stop_all(live)


@pytest.mark.parametrize("seed", range(10))
def test_replicas_with_retries_stay_identical_also_when_one_restores_midway(seed):
    """Random grants/revokes with repeated (client, request) pairs: a leader, a follower and
    a member that restores the leader's snapshot halfway answer every entry alike."""
    rng = random.Random(seed)
    leader, _, _ = make(primary=True, dedup_ids_per_client=3, dedup_max_clients=2)
    follower, _, _ = make(primary=False, dedup_ids_per_client=3, dedup_max_clients=2)
    late = Lessor(store=MVCCStore(), clock=FakeClock(), dedup_ids_per_client=3, dedup_max_clients=2)
    entries = []
    for _ in range(120):
        cid, rid, lid = rng.choice([0, 1, 2, 3]), rng.randint(1, 5), rng.randint(1, 4)
        req = LeaseGrantRequest(10, lid) if rng.random() < 0.5 else LeaseRevokeRequest(lid)
        entries.append(encode_lease_entry(req, cid, rid))
    for i, entry in enumerate(entries):
        if i == len(entries) // 2:
            late.restore(leader.snapshot())
        a, b = leader.apply_entry(entry), follower.apply_entry(entry)
        assert (a.response, a.error, a.duplicate) == (b.response, b.error, b.duplicate)
        if i >= len(entries) // 2:
            c = late.apply_entry(entry)
            assert (a.response, a.error, a.duplicate) == (c.response, c.error, c.duplicate)
    assert leader.snapshot() == follower.snapshot() == late.snapshot()
