"""The lessor's replicated half: grant / revoke / checkpoint applied from raft entries.

Pins etcd's lessor semantics (server/lease/lessor.go: Grant, Revoke, Checkpoint) and
etcd's gRPC error texts and codes (api/v3rpc/rpctypes), plus raftkv's entry and snapshot
formats and the determinism every replica relies on.
"""

import random

import msgpack
import pytest

from kvserver.kvpb.errors import GrpcCode
from kvserver.kvpb.lease import (
    MAX_LEASE_TTL_S,
    LeaseGrantRequest,
    LeaseGrantResponse,
    LeaseRevokeRequest,
    LeaseRevokeResponse,
)
from kvserver.lease.codec import (
    LeaseCheckpointRequest,
    LeaseCheckpointResponse,
    decode_lease_entry,
    encode_lease_entry,
    is_lease_entry,
)
from kvserver.lease.errors import LeaseExistsError, LeaseTTLTooLargeError, TooManyLeasesError
from kvserver.lease.lessor import HARD_MAX_LEASES, LeaseIdGenerator, Lessor, min_lease_ttl_s
from kvserver.lease.snapshot import frame_snapshot, split_snapshot
from kvserver.mvcc import (
    CodecError,
    EtcdError,
    EventType,
    InvalidArgumentError,
    LeaseNotFoundError,
    MVCCStore,
    PutRequest,
    SnapshotFormatError,
    encode_entry,
)

from .helpers import FakeClock, ids, make

# ---------------------------------------------------------------------------------------------
# Grant


def test_grant_with_client_chosen_id_and_attach_keys():
    """etcd LeaseGrant with ID != 0 keeps the ID; puts may then name the lease (the store
    asks the lessor through lease_exists)."""
    lessor, store, _ = make()
    res = lessor.apply(LeaseGrantRequest(ttl_s=10, lease_id=42))
    assert res.error is None
    assert res.response == LeaseGrantResponse(res.response.header, 42, 10)
    assert res.response.header.revision == store.revision == 1
    assert lessor.exists(42) and len(lessor) == 1
    assert store.apply(PutRequest(b"k", b"v", lease=42)).error is None
    assert isinstance(store.apply(PutRequest(b"k", b"v", lease=43)).error, LeaseNotFoundError)


def test_server_chosen_ids_are_unique_positive_and_skip_granted_ones():
    """etcd picks a positive int63 ID when the request has ID 0 (v3_server.LeaseGrant);
    raftkv picks it when proposing, so the log carries the final ID."""
    lessor, _, _ = make()
    gen = LeaseIdGenerator(member_id=0xABCD, now_ms=1_700_000_000_000)
    seen = set()
    for _ in range(200):
        req = lessor.prepare_grant(LeaseGrantRequest(ttl_s=5), gen)
        assert req.lease_id > 0 and req.lease_id < 1 << 63
        assert req.lease_id not in seen
        seen.add(req.lease_id)
        assert lessor.apply(req).error is None
    # a client-chosen ID that the generator would hand out next is skipped, not reused
    probe = LeaseIdGenerator(member_id=0xABCD, now_ms=1_700_000_000_000)
    for _ in range(201):
        nxt = probe.next()
    lessor.apply(LeaseGrantRequest(5, nxt))
    chosen = lessor.prepare_grant(LeaseGrantRequest(ttl_s=5), gen).lease_id
    assert chosen != nxt and chosen not in seen


def test_id_generators_of_different_members_do_not_collide():
    a = LeaseIdGenerator(1, 1_700_000_000_000)
    b = LeaseIdGenerator(2, 1_700_000_000_000)
    assert not {a.next() for _ in range(1000)} & {b.next() for _ in range(1000)}
    # a restart (later clock) does not reuse IDs either
    again = LeaseIdGenerator(1, 1_700_000_001_000)
    first = LeaseIdGenerator(1, 1_700_000_000_000)
    assert not {first.next() for _ in range(1000)} & {again.next() for _ in range(1000)}


def test_prepare_grant_needs_a_generator_for_id_zero():
    lessor, _, _ = make()
    with pytest.raises(ValueError):
        lessor.prepare_grant(LeaseGrantRequest(ttl_s=5))


def test_duplicate_id_is_lease_already_exists():
    """etcd: ErrGRPCLeaseExist = FailedPrecondition 'etcdserver: lease already exists'."""
    lessor, _, _ = make()
    assert lessor.apply(LeaseGrantRequest(10, 7)).error is None
    res = lessor.apply(LeaseGrantRequest(99, 7))
    assert isinstance(res.error, LeaseExistsError)
    assert str(res.error) == "etcdserver: lease already exists"
    assert res.error.grpc_code == GrpcCode.FAILED_PRECONDITION and res.error.http_status == 412
    assert lessor.lookup(7).ttl_s == 10  # unchanged
    with pytest.raises(LeaseExistsError):
        lessor.prepare_grant(LeaseGrantRequest(10, 7))  # early answer before proposing


def test_ttl_bounds():
    """etcd: TTL > MaxLeaseTTL (9e9 s) -> OutOfRange 'etcdserver: too large lease TTL'; a TTL
    below the minimum is raised to it (0 too). raftkv refuses negative TTLs."""
    lessor, _, _ = make(min_ttl_s=3)
    with pytest.raises(LeaseTTLTooLargeError) as exc:
        lessor.prepare_grant(LeaseGrantRequest(MAX_LEASE_TTL_S + 1, 1))
    assert str(exc.value) == "etcdserver: too large lease TTL"
    assert exc.value.grpc_code == GrpcCode.OUT_OF_RANGE and exc.value.http_status == 400
    assert lessor.prepare_grant(LeaseGrantRequest(MAX_LEASE_TTL_S, 1)).ttl_s == MAX_LEASE_TTL_S
    assert lessor.prepare_grant(LeaseGrantRequest(0, 1)).ttl_s == 3
    assert lessor.prepare_grant(LeaseGrantRequest(2, 1)).ttl_s == 3
    assert lessor.prepare_grant(LeaseGrantRequest(4, 1)).ttl_s == 4
    with pytest.raises(InvalidArgumentError) as neg:
        lessor.prepare_grant(LeaseGrantRequest(-1, 1))
    assert neg.value.http_status == 400 and "negative" in str(neg.value)
    # the applied side re-checks what reaches the log
    assert isinstance(
        lessor.apply(LeaseGrantRequest(MAX_LEASE_TTL_S + 1, 9)).error, LeaseTTLTooLargeError
    )
    assert isinstance(lessor.apply(LeaseGrantRequest(0, 9)).error, InvalidArgumentError)
    assert isinstance(lessor.apply(LeaseGrantRequest(5, 0)).error, LeaseNotFoundError)
    assert isinstance(lessor.apply(LeaseGrantRequest(5, 1 << 63)).error, InvalidArgumentError)
    assert len(lessor) == 0


def test_min_lease_ttl_follows_etcd_formula():
    """etcd: minTTL = ceil((3 * electionTicks / 2) * heartbeat)."""
    assert min_lease_ttl_s(100, 1000) == 2
    assert min_lease_ttl_s(100, 3000) == 5
    assert min_lease_ttl_s(50, 500) == 1


def test_max_leases_is_checked_when_proposing_and_the_hard_bound_when_applying(monkeypatch):
    lessor, _, _ = make(max_leases=3)
    gen = ids()
    for _ in range(3):
        assert lessor.apply(lessor.prepare_grant(LeaseGrantRequest(5), gen)).error is None
    with pytest.raises(TooManyLeasesError) as exc:
        lessor.prepare_grant(LeaseGrantRequest(5), gen)
    assert exc.value.grpc_code == GrpcCode.RESOURCE_EXHAUSTED
    # entries already in the log still apply (the admission bound is per member) ...
    assert lessor.apply(LeaseGrantRequest(5, 1000)).error is None
    # ... up to the replicated hard bound, a code constant
    monkeypatch.setattr("kvserver.lease.lessor.HARD_MAX_LEASES", 5)
    assert lessor.apply(LeaseGrantRequest(5, 1001)).error is None
    assert isinstance(lessor.apply(LeaseGrantRequest(5, 1002)).error, TooManyLeasesError)
    assert HARD_MAX_LEASES == 1_000_000


# ---------------------------------------------------------------------------------------------
# Revoke


def test_revoke_deletes_attached_keys_in_one_revision_and_returns_their_events():
    """etcd lessor.Revoke: attached keys deleted in sorted order in one txn (one revision),
    then the lease is gone: later puts naming it fail with lease not found."""
    lessor, store, _ = make()
    lessor.apply(LeaseGrantRequest(10, 1))
    lessor.apply(LeaseGrantRequest(10, 2))
    for key in (b"z", b"a", b"m"):
        store.apply(PutRequest(key, b"v", lease=1))
    store.apply(PutRequest(b"other", b"v", lease=2))
    store.apply(PutRequest(b"free", b"v"))
    rev = store.revision
    res = lessor.apply(LeaseRevokeRequest(1))
    assert res.error is None and isinstance(res.response, LeaseRevokeResponse)
    assert res.revision == store.revision == rev + 1 == res.response.header.revision
    assert [(e.type, e.kv.key, e.kv.mod_revision) for e in res.events] == [
        (EventType.DELETE, b"a", rev + 1),
        (EventType.DELETE, b"m", rev + 1),
        (EventType.DELETE, b"z", rev + 1),
    ]
    assert all(e.prev_kv is not None and e.prev_kv.lease == 1 for e in res.events)
    assert not lessor.exists(1) and store.keys_with_lease(1) == []
    assert store.get(b"other") is not None and store.get(b"free") is not None
    assert isinstance(store.apply(PutRequest(b"a", b"v", lease=1)).error, LeaseNotFoundError)


def test_revoke_without_keys_does_not_advance_the_revision():
    lessor, store, _ = make()
    lessor.apply(LeaseGrantRequest(10, 1))
    res = lessor.apply(LeaseRevokeRequest(1))
    assert res.error is None and res.events == () and store.revision == 1


def test_revoke_unknown_lease_is_not_found():
    """etcd: ErrGRPCLeaseNotFound = NotFound 'etcdserver: requested lease not found' (404)."""
    lessor, _, _ = make()
    res = lessor.apply(LeaseRevokeRequest(5))
    assert isinstance(res.error, LeaseNotFoundError)
    assert str(res.error) == "etcdserver: requested lease not found"
    assert res.error.http_status == 404


def test_keys_moved_to_another_lease_survive_the_revoke():
    lessor, store, _ = make()
    lessor.apply(LeaseGrantRequest(10, 1))
    lessor.apply(LeaseGrantRequest(10, 2))
    store.apply(PutRequest(b"a", b"1", lease=1))
    store.apply(PutRequest(b"a", b"2", lease=2))
    assert lessor.apply(LeaseRevokeRequest(1)).events == ()
    assert store.get(b"a").value == b"2"
    assert [e.kv.key for e in lessor.apply(LeaseRevokeRequest(2)).events] == [b"a"]


# ---------------------------------------------------------------------------------------------
# Checkpoint


def test_checkpoint_sets_and_clears_remaining_ttl_and_ignores_unknown_ids():
    lessor, _, _ = make()
    lessor.apply(LeaseGrantRequest(600, 1))
    res = lessor.apply(LeaseCheckpointRequest(((1, 250), (99, 10))))
    assert res.error is None and isinstance(res.response, LeaseCheckpointResponse)
    assert lessor.lookup(1).remaining_ttl_s == 250 and not lessor.exists(99)
    lessor.apply(LeaseCheckpointRequest(((1, 0),)))
    assert lessor.lookup(1).remaining_ttl_s == 0


# ---------------------------------------------------------------------------------------------
# Entries


def test_entry_round_trip_and_kind_detection():
    reqs = [
        LeaseGrantRequest(ttl_s=30, lease_id=7),
        LeaseGrantRequest(ttl_s=MAX_LEASE_TTL_S, lease_id=-5),
        LeaseRevokeRequest(7),
        LeaseCheckpointRequest(((7, 12), (8, 0))),
        LeaseCheckpointRequest(()),
    ]
    for req in reqs:
        data = encode_lease_entry(req, client_id=3, request_id=9)
        assert is_lease_entry(data)
        assert decode_lease_entry(data) == (3, 9, req)
    assert not is_lease_entry(encode_entry(PutRequest(b"k", b"v"), 3, 9))
    assert not is_lease_entry(b"")
    with pytest.raises(CodecError):
        encode_lease_entry(LeaseGrantRequest(ttl_s=5))  # ID must be final in the log
    with pytest.raises(CodecError):
        encode_lease_entry(PutRequest(b"k"))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        msgpack.packb([76, 0, 0]),
        msgpack.packb([76, 0, 0, []]),
        msgpack.packb([76, 0, 0, [9, 1]]),
        msgpack.packb([76, 0, 0, [1, 5]]),
        msgpack.packb([76, 0, 0, [1, "x", 5]]),
        msgpack.packb([76, 0, 0, [1, 1 << 63, 5]]),
        msgpack.packb([76, 0, 0, [3, [[1]]]]),
        msgpack.packb([76, "a", 0, [2, 1]]),
        msgpack.packb([1, 0, 0, [2, 1]]),
    ],
)
def test_undecodable_entries_are_an_error_result_not_a_crash(data):
    lessor, _, _ = make()
    res = lessor.apply_entry(data)
    assert isinstance(res.error, InvalidArgumentError) and res.response is None


def test_apply_refuses_non_lease_requests():
    lessor, _, _ = make()
    assert isinstance(lessor.apply(PutRequest(b"k")).error, InvalidArgumentError)


# ---------------------------------------------------------------------------------------------
# Snapshots


def test_snapshot_round_trip_keeps_ttls_and_checkpoints_and_comes_back_as_follower():
    lessor, store, clock = make()
    for lid, ttl in ((3, 10), (1, 600), (2, 20)):
        lessor.apply(LeaseGrantRequest(ttl, lid))
    lessor.apply(LeaseCheckpointRequest(((1, 400),)))
    blob = lessor.snapshot()
    other = Lessor(store=MVCCStore(), clock=FakeClock())
    other.restore(blob)
    assert [(i.lease_id, i.ttl_s, i.remaining_ttl_s) for i in map(other.lookup, (1, 2, 3))] == [
        (1, 600, 400),
        (2, 20, 0),
        (3, 10, 0),
    ]
    assert other.snapshot() == blob
    assert not other.is_primary and other.lookup(1).expiry == float("inf")
    assert other.expired() == []
    # a primary that restores keeps deadlines (now + remaining or granted TTL)
    clock.advance(5)
    lessor.restore(blob)
    assert lessor.is_primary and lessor.remaining_s(1) == 400 and lessor.remaining_s(2) == 20
    lessor.restore(None)
    assert len(lessor) == 0


@pytest.mark.parametrize(
    "blob",
    [
        b"garbage\xc1",
        msgpack.packb({"magic": "nope", "version": 1, "leases": []}),
        msgpack.packb({"magic": "raftkv-lease-snapshot", "version": 3, "leases": []}),
        msgpack.packb({"magic": "raftkv-lease-snapshot", "version": 1, "leases": [[1, 5]]}),
        msgpack.packb({"magic": "raftkv-lease-snapshot", "version": 1, "leases": [[0, 5, 0]]}),
        msgpack.packb({"magic": "raftkv-lease-snapshot", "version": 1, "leases": [[1, 0, 0]]}),
        msgpack.packb(
            {"magic": "raftkv-lease-snapshot", "version": 1, "leases": [[1, 5, 0], [1, 6, 0]]}
        ),
    ],
)
def test_damaged_snapshot_is_refused_and_changes_nothing(blob):
    lessor, _, _ = make()
    lessor.apply(LeaseGrantRequest(10, 1))
    with pytest.raises(SnapshotFormatError):
        lessor.restore(blob)
    assert lessor.exists(1)


def test_snapshot_frame_in_front_of_the_mvcc_stream():
    """The lease blob travels framed in front of the MVCC snapshot; a snapshot without the
    frame (made before leases existed) is all MVCC stream."""
    lessor, store, _ = make()
    lessor.apply(LeaseGrantRequest(10, 1))
    store.apply(PutRequest(b"k", b"v", lease=1))
    data = frame_snapshot(lessor.snapshot()) + b"".join(store.serialize())
    blob, rest = split_snapshot(data)
    restored_store = MVCCStore.restore([rest])
    restored = Lessor(store=restored_store, clock=FakeClock())
    restored.restore(blob)
    assert restored_store.keys_with_lease(1) == [b"k"] and restored.exists(1)
    assert restored_store.lease_exists is not None and restored_store.lease_exists(1)
    plain = b"".join(store.serialize())
    assert split_snapshot(plain)[0] is None and bytes(split_snapshot(plain)[1]) == plain
    with pytest.raises(SnapshotFormatError):
        split_snapshot(data[:10])
    with pytest.raises(SnapshotFormatError):
        split_snapshot(frame_snapshot(b"x" * 100)[:50])


# ---------------------------------------------------------------------------------------------
# Determinism


def _random_ops(rng: random.Random, n: int) -> list:
    ops = []
    for _ in range(n):
        r = rng.random()
        lid = rng.choice([0, 1, 2, 3, 4, 5, -7])
        if r < 0.35:
            ops.append(("grant", LeaseGrantRequest(rng.choice([-1, 0, 1, 5, 600]), lid)))
        elif r < 0.55:
            ops.append(("revoke", LeaseRevokeRequest(lid)))
        elif r < 0.65:
            ops.append(("checkpoint", LeaseCheckpointRequest(((lid, rng.randint(0, 50)),))))
        elif r < 0.95:
            ops.append(("put", PutRequest(rng.choice([b"a", b"b", b"c", b"d"]), b"v", lid)))
        else:
            ops.append(("timing", rng.random()))
    return ops


@pytest.mark.parametrize("seed", range(20))
def test_replicated_part_is_deterministic_whatever_the_role_and_clock(seed):
    """Two members apply the same entries: one is the leader with its own clock, keeping
    leases alive and promoting/demoting in between; the other is a follower with another
    clock. Results, events, store state and snapshot bytes are identical."""
    rng = random.Random(seed)
    ops = _random_ops(rng, 150)
    leader, lstore, lclock = make(primary=True, checkpoint_interval_s=1.0)
    follower, fstore, _ = make(primary=False, clock=FakeClock(5.0))
    for kind, op in ops:
        if kind == "timing":
            lclock.advance(op * 3)
            leader.expired()  # a real driver would propose revokes; here only listed
            leader.due_checkpoints()
            if op < 0.1:
                leader.demote()
            elif op < 0.2:
                leader.promote(op)
            for lid in (1, 2, 3):
                try:
                    leader.keepalive(lid)
                except EtcdError:
                    pass  # not found, expired or not primary: timing only, never replicated
            continue
        if kind == "put":
            a, b = lstore.apply(op), fstore.apply(op)
        elif kind == "grant" and op.lease_id == 0:
            a, b = leader.apply(op), follower.apply(op)  # cannot be encoded: ID not final
        else:
            entry = encode_lease_entry(op)
            a, b = leader.apply_entry(entry), follower.apply_entry(entry)
        assert (a.response, a.error, a.events, a.revision) == (
            b.response,
            b.error,
            b.events,
            b.revision,
        )
    assert leader.snapshot() == follower.snapshot()
    assert b"".join(lstore.serialize()) == b"".join(fstore.serialize())
