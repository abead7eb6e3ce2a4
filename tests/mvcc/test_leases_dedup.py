"""Lease hooks and request-id deduplication of the MVCC store.

Leases follow etcd: a put attaches the key to its lease (detaching it from the old one),
a delete detaches it, and a revoke (lessor.Revoke) deletes the attached keys in key order in
one revision. Deduplication of retried requests is raftkv's own (etcd has none).
"""

import pytest

from kvserver.mvcc import (
    ApplyResult,
    CompactionRequest,
    DedupTable,
    DeleteRangeRequest,
    EventType,
    LeaseNotFoundError,
    MVCCStore,
    PutRequest,
    RangeRequest,
    RequestOp,
    TxnRequest,
)
from kvserver.mvcc.dedup import MISS


def test_put_with_unknown_lease_is_rejected():
    """etcd Put: a lease the lessor does not know -> `etcdserver: requested lease not found`
    (gRPC NotFound, HTTP 404), and nothing changes."""
    s = MVCCStore(lease_exists=lambda lease: lease == 5)
    res = s.apply(PutRequest(b"a", b"1", lease=6))
    assert isinstance(res.error, LeaseNotFoundError)
    assert str(res.error) == "etcdserver: requested lease not found"
    assert res.error.http_status == 404
    assert s.revision == 1 and s.key_count == 0
    assert s.apply(PutRequest(b"a", b"1", lease=5)).error is None


def test_lease_attach_detach_follow_puts_and_deletes():
    """etcd storeTxnWrite.put/delete: a put moves the key to its new lease, a put without a
    lease detaches it, a delete detaches it."""
    s = MVCCStore()
    s.put(b"a", b"1", lease=1)
    s.put(b"b", b"1", lease=1)
    s.put(b"c", b"1", lease=2)
    assert s.keys_with_lease(1) == [b"a", b"b"]
    s.put(b"b", b"2", lease=2)
    assert s.keys_with_lease(1) == [b"a"] and s.keys_with_lease(2) == [b"b", b"c"]
    s.put(b"b", b"3", ignore_lease=True)
    assert s.keys_with_lease(2) == [b"b", b"c"]
    s.put(b"b", b"4")
    assert s.keys_with_lease(2) == [b"c"]
    s.delete_range(b"c")
    assert s.keys_with_lease(2) == [] and s.lease_ids() == [1]


def test_delete_keys_of_lease_in_one_revision():
    """etcd lessor.Revoke: attached keys are deleted in sorted key order in one write txn
    (one revision); a lease without keys changes nothing."""
    s = MVCCStore()
    s.put(b"z", b"1", lease=7)
    s.put(b"a", b"1", lease=7)
    s.put(b"m", b"1", lease=8)
    res = s.delete_keys_of_lease(7)
    assert isinstance(res, ApplyResult)
    assert res.response.deleted == 2 and res.revision == 5 and s.revision == 5
    assert [(e.type, e.kv.key, e.kv.mod_revision) for e in res.events] == [
        (EventType.DELETE, b"a", 5),
        (EventType.DELETE, b"z", 5),
    ]
    assert s.keys_with_lease(7) == [] and s.get(b"m") is not None
    again = s.delete_keys_of_lease(7)
    assert again.response.deleted == 0 and again.events == () and s.revision == 5


def test_retried_write_applies_once():
    """A write retried with the same (client_id, request_id) is applied once; the
    retry gets the first response and no events (the log may hold duplicates)."""
    s = MVCCStore()
    first = s.apply(PutRequest(b"a", b"1"), client_id=9, request_id=1)
    again = s.apply(PutRequest(b"a", b"1"), client_id=9, request_id=1)
    assert not first.duplicate and again.duplicate
    assert again.response == first.response and again.events == ()
    assert s.revision == 2 and s.get(b"a").version == 1
    # another client, or the same client's next id, applies
    assert not s.apply(PutRequest(b"a", b"1"), client_id=8, request_id=1).duplicate
    assert not s.apply(PutRequest(b"a", b"1"), client_id=9, request_id=2).duplicate
    assert s.revision == 4
    # client_id 0 means no deduplication
    s.apply(PutRequest(b"a", b"1"), 0, 1)
    s.apply(PutRequest(b"a", b"1"), 0, 1)
    assert s.revision == 6


def test_remembered_errors_are_returned_again():
    """A request that failed fails the same way on retry, even if it would now succeed."""
    s = MVCCStore()
    bad = PutRequest(b"a", ignore_value=True)
    first = s.apply(bad, 3, 1)
    assert first.error is not None
    s.put(b"a", b"x")
    again = s.apply(bad, 3, 1)
    assert again.duplicate and again.error == first.error and s.revision == 2


def test_dedup_covers_every_write_type_but_not_reads():
    """Deletes, txns and compactions are deduplicated like puts; plain reads change nothing
    and are never remembered."""
    s = MVCCStore()
    s.put(b"a", b"1")
    s.put(b"b", b"1")
    txn = TxnRequest(success=(RequestOp.of(PutRequest(b"c", b"1")),))
    for rid, req in enumerate([txn, DeleteRangeRequest(b"a"), CompactionRequest(3)]):
        first = s.apply(req, 1, rid)
        rev = s.revision
        again = s.apply(req, 1, rid)
        assert first.error is None and not first.duplicate
        assert again.duplicate and again.response == first.response and s.revision == rev
    assert s.get(b"c").version == 1 and s.compact_revision == 3
    r1 = s.apply(RangeRequest(b"b"), 1, 50)
    r2 = s.apply(RangeRequest(b"b"), 1, 50)
    assert not r1.duplicate and not r2.duplicate
    assert s.dedup.lookup(1, 50) is MISS


def test_dedup_table_is_bounded_per_client_and_in_clients():
    """The table keeps the last N ids per client and the M most recently active clients;
    older ids fall out (and would be applied again)."""
    t = DedupTable(ids_per_client=3, max_clients=2)
    for rid in range(5):
        t.remember(1, rid, f"r{rid}")
    assert [t.lookup(1, rid) for rid in range(5)] == [MISS, MISS, "r2", "r3", "r4"]
    assert len(t) == 3
    t.remember(2, 1, "a")
    t.remember(1, 5, "b")  # client 1 is now the most recent
    t.remember(3, 1, "c")  # evicts client 2, the least recently active
    assert t.client_count == 2
    assert t.lookup(2, 1) is MISS
    assert t.lookup(1, 5) == "b"


def test_dedup_eviction_reapplies_old_ids():
    s = MVCCStore(dedup_ids_per_client=2)
    for rid in range(3):
        s.apply(PutRequest(b"a", b"%d" % rid), 1, rid)
    assert s.revision == 4
    assert s.apply(PutRequest(b"a", b"x"), 1, 0).duplicate is False  # id 0 was evicted
    assert s.apply(PutRequest(b"a", b"x"), 1, 2).duplicate is True


@pytest.mark.parametrize("bound", [0, -1])
def test_dedup_bounds_must_be_positive(bound):
    with pytest.raises(ValueError):
        DedupTable(bound, 1)


def test_dedup_survives_snapshot_round_trip():
    """Replicas that restore a snapshot must keep rejecting retries of writes in it."""
    s = MVCCStore()
    s.apply(PutRequest(b"a", b"1"), 4, 1)
    err = s.apply(PutRequest(b"a", b"1", ignore_lease=True, lease=3), 4, 2).error
    assert err is not None
    s.apply(PutRequest(b"b", b"1"), 5, 1)
    r = MVCCStore.restore(s.serialize())
    assert r.dedup.export() == s.dedup.export()  # same outcomes, same eviction order
    assert r.apply(PutRequest(b"a", b"1"), 4, 1).duplicate
    dup_err = r.apply(PutRequest(b"a", b"1", ignore_lease=True, lease=3), 4, 2)
    assert dup_err.duplicate and dup_err.error == err
    assert r.revision == 3
