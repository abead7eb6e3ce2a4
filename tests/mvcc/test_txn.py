"""Txn semantics of the MVCC store, pinned to etcd 3.4 (etcdserver/apply.go Txn,
applyCompare/compareKV, checkRequests; api/v3rpc/key.go checkTxnRequest/checkIntervals).
Results marked "observed" were checked by hand against etcd 3.4.23's JSON gateway."""

import pytest

from kvserver.mvcc import (
    CompactedError,
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    EventType,
    FutureRevisionError,
    InvalidArgumentError,
    KeyNotFoundError,
    KeyValue,
    LeaseNotFoundError,
    MVCCStore,
    PutRequest,
    RangeRequest,
    RequestOp,
    TxnRequest,
)

EQ, NE, GT, LT = (
    CompareResult.EQUAL,
    CompareResult.NOT_EQUAL,
    CompareResult.GREATER,
    CompareResult.LESS,
)
VERSION, CREATE, MOD, VALUE, LEASE = (
    CompareTarget.VERSION,
    CompareTarget.CREATE,
    CompareTarget.MOD,
    CompareTarget.VALUE,
    CompareTarget.LEASE,
)


def cmp(key, target, result, range_end=b"", **kw):
    return Compare(result, target, key, range_end=range_end, **kw)


def succeeded(s, *compares):
    return s.txn(compares).succeeded


def test_compare_on_missing_key_uses_zero_values():
    """etcd applyCompare: a missing key compares as an all-zero KeyValue (version, create,
    mod and lease 0) (observed: VERSION == 0 and LEASE == 0 on a missing key succeed)."""
    s = MVCCStore()
    assert succeeded(s, cmp(b"x", VERSION, EQ, version=0))
    assert succeeded(s, cmp(b"x", CREATE, EQ, create_revision=0))
    assert succeeded(s, cmp(b"x", MOD, LT, mod_revision=1))
    assert succeeded(s, cmp(b"x", LEASE, EQ, lease=0))
    assert not succeeded(s, cmp(b"x", VERSION, GT, version=0))


def test_value_compare_on_missing_key_always_fails():
    """etcd applyCompare: "Always fail if comparing a value on a key/keys that doesn't
    exist", even NOT_EQUAL (observed)."""
    s = MVCCStore()
    assert not succeeded(s, cmp(b"x", VALUE, NE, value=b"v"))
    assert not succeeded(s, cmp(b"x", VALUE, EQ, value=b""))


def test_compare_targets_and_results():
    """etcd compareKV: each target compares the stored field with the compare's field;
    VALUE compares bytes lexicographically."""
    s = MVCCStore()
    s.put(b"k", b"m", lease=9)  # rev 2
    s.put(b"k", b"m")  # rev 3, version 2, lease 0
    assert succeeded(s, cmp(b"k", VERSION, EQ, version=2))
    assert succeeded(s, cmp(b"k", CREATE, EQ, create_revision=2))
    assert succeeded(s, cmp(b"k", MOD, GT, mod_revision=2))
    assert succeeded(s, cmp(b"k", VALUE, GT, value=b"a"))
    assert succeeded(s, cmp(b"k", VALUE, LT, value=b"ma"))
    assert succeeded(s, cmp(b"k", VALUE, NE, value=b"n"))
    assert succeeded(s, cmp(b"k", LEASE, EQ, lease=0))
    assert not succeeded(s, cmp(b"k", VERSION, LT, version=2))
    # a compare whose target field is unset compares with zero (etcd: nil target_union)
    assert succeeded(s, Compare(GT, VERSION, b"k", value=b"ignored"))


def test_compare_over_range_must_hold_for_every_key():
    """etcd applyCompare with range_end: true iff it holds for each key in the range
    (observed: VALUE == v over a prefix where all keys are v succeeds)."""
    s = MVCCStore()
    s.put(b"p1", b"v")
    s.put(b"p2", b"v")
    assert succeeded(s, cmp(b"p", VALUE, EQ, range_end=b"q", value=b"v"))
    s.put(b"p3", b"w")
    assert not succeeded(s, cmp(b"p", VALUE, EQ, range_end=b"q", value=b"v"))
    assert succeeded(s, cmp(b"p", VERSION, GT, range_end=b"q", version=0))
    # an empty range behaves like one missing key
    assert succeeded(s, cmp(b"x", CREATE, EQ, range_end=b"y", create_revision=0))


def test_all_compares_must_hold():
    """etcd applyCompares: the txn succeeds only if every compare holds."""
    s = MVCCStore()
    s.put(b"a", b"1")
    assert succeeded(s, cmp(b"a", VALUE, EQ, value=b"1"), cmp(b"b", VERSION, EQ, version=0))
    assert not succeeded(s, cmp(b"a", VALUE, EQ, value=b"1"), cmp(b"b", VERSION, GT, version=0))
    assert succeeded(s)  # no compares: success (observed: empty txn succeeds)


def test_txn_ops_share_one_revision_and_see_earlier_ops():
    """etcd Txn (observed response): all writes get the txn's revision; a range before the
    first write reports the old revision, a range after a write sees it and reports the new
    revision; a delete of nothing after a write reports the new revision; a nested txn's
    header revision is 0."""
    s = MVCCStore()
    s.put(b"p1", b"v")  # 2
    s.put(b"p2", b"v")  # 3
    r = s.txn(
        (),
        [
            RangeRequest(b"p1"),
            PutRequest(b"p1", b"w"),
            RangeRequest(b"p1"),
            DeleteRangeRequest(b"zz"),
            TxnRequest(success=(RequestOp.of(RangeRequest(b"p2")),)),
        ],
    )
    assert r.succeeded and r.revision == 4 and s.revision == 4
    first, put, second, delete, nested = r.responses
    assert first.response_range.revision == 3
    assert first.response_range.kvs[0].value == b"v"
    assert put.response_put.revision == 4
    assert second.response_range.revision == 4
    assert second.response_range.kvs == (KeyValue(b"p1", b"w", 2, 4, 2, 0),)
    assert (delete.response_delete_range.revision, delete.response_delete_range.deleted) == (4, 0)
    assert nested.response_txn.revision == 0
    assert nested.response_txn.succeeded
    assert nested.response_txn.responses[0].response_range.revision == 4


def test_failure_branch_and_read_only_txn_keep_revision():
    """etcd Txn: compares false -> failure ops run; a txn without changes (read-only, or
    deleting nothing) does not advance the revision."""
    s = MVCCStore()
    s.put(b"a", b"1")
    r = s.txn([cmp(b"a", VALUE, EQ, value=b"2")], [PutRequest(b"a", b"x")], [RangeRequest(b"a")])
    assert not r.succeeded
    assert r.responses[0].response_range.kvs[0].value == b"1"
    assert r.revision == 2 and s.revision == 2
    r = s.txn((), [DeleteRangeRequest(b"nothing")])
    assert r.revision == 2 and s.revision == 2


def test_multi_key_txn_writes_events_in_op_order():
    """etcd: the changes of a txn are one revision with sub-revisions in op order; watch
    events come in that order."""
    s = MVCCStore()
    s.put(b"z", b"0")
    res = s.apply(
        TxnRequest(
            success=(
                RequestOp.of(PutRequest(b"b", b"1")),
                RequestOp.of(DeleteRangeRequest(b"z")),
                RequestOp.of(PutRequest(b"a", b"2")),
            )
        )
    )
    assert [(e.type, e.kv.key, e.kv.mod_revision) for e in res.events] == [
        (EventType.PUT, b"b", 3),
        (EventType.DELETE, b"z", 3),
        (EventType.PUT, b"a", 3),
    ]
    assert s.events_since(3, b"\0", b"\0", prev_kv=True) == list(res.events)


@pytest.mark.parametrize(
    "success",
    [
        [PutRequest(b"a", b"1"), PutRequest(b"a", b"2")],
        [PutRequest(b"a", b"1"), DeleteRangeRequest(b"a")],
        [DeleteRangeRequest(b"a", b"c"), PutRequest(b"b")],
        [PutRequest(b"b"), TxnRequest(success=(RequestOp.of(PutRequest(b"b")),))],
        [DeleteRangeRequest(b"b"), TxnRequest(failure=(RequestOp.of(PutRequest(b"b")),))],
        [DeleteRangeRequest(b"a", b"\0"), PutRequest(b"b")],
    ],
)
def test_duplicate_key_in_txn_rejected(success):
    """etcd checkIntervals: a key put twice, or put and deleted, in one branch is rejected
    with `etcdserver: duplicate key given in txn request` and nothing changes. (The last case
    differs from etcd 3.4, which takes a "\\0" delete end literally here and accepts it.)"""
    s = MVCCStore()
    s.put(b"b", b"0")
    with pytest.raises(InvalidArgumentError, match="etcdserver: duplicate key given in txn"):
        s.txn((), success)
    assert s.revision == 2


def test_then_and_else_of_nested_txn_may_put_same_key():
    """etcd checkIntervals: puts in a nested txn's success and failure lists may overlap
    (only one branch runs); deletes overlapping each other are fine."""
    s = MVCCStore()
    nested = TxnRequest(
        (cmp(b"k", VERSION, EQ, version=0),),
        (RequestOp.of(PutRequest(b"k", b"then")),),
        (RequestOp.of(PutRequest(b"k", b"else")),),
    )
    r = s.txn((), [nested, DeleteRangeRequest(b"x", b"z"), DeleteRangeRequest(b"y")])
    assert r.responses[0].response_txn.succeeded
    assert s.get(b"k").value == b"then"


def test_nested_compares_see_state_before_the_txn():
    """etcd compareToPath: all compares (nested ones too) are evaluated before any op runs."""
    s = MVCCStore()
    nested = TxnRequest((cmp(b"k", VERSION, EQ, version=0),), (RequestOp.of(RangeRequest(b"k")),))
    r = s.txn((), [PutRequest(b"k", b"1"), nested])
    inner = r.responses[1].response_txn
    assert inner.succeeded  # k did not exist before the txn
    assert inner.responses[0].response_range.kvs[0].value == b"1"  # but the range sees it


def test_too_many_ops():
    """etcd checkTxnRequest: more than --max-txn-ops (128) compares/ops per list ->
    `etcdserver: too many operations in txn request`."""
    s = MVCCStore()
    ops = [PutRequest(b"k%d" % i) for i in range(129)]
    with pytest.raises(InvalidArgumentError, match="too many operations in txn request"):
        s.txn((), ops)
    s.txn((), ops[:128])
    assert s.revision == 2


def test_empty_request_op_is_key_not_found():
    """etcd checkRequestOp: an op with no request set -> ErrGRPCKeyNotFound."""
    s = MVCCStore()
    with pytest.raises(KeyNotFoundError, match="etcdserver: key not found"):
        s.txn((), [RequestOp()])


def test_compare_with_empty_key_rejected():
    """etcd checkTxnRequest: a compare without key -> `etcdserver: key is not provided`."""
    s = MVCCStore()
    with pytest.raises(InvalidArgumentError, match="key is not provided"):
        s.txn([cmp(b"", VERSION, EQ)])


def test_txn_checks_taken_branch_before_writing():
    """etcd Txn checkRequests: on the taken path, ignore_value on a missing key, an unknown
    lease, or a range at a compacted/future revision fails the whole txn and nothing is
    written; errors in the branch not taken do not matter."""
    s = MVCCStore(lease_exists=lambda lease: lease == 1)
    s.put(b"a", b"1")
    s.put(b"a", b"2")
    s.compact(3)
    bad = [
        (PutRequest(b"missing", ignore_value=True), KeyNotFoundError),
        (PutRequest(b"b", lease=2), LeaseNotFoundError),
        (RangeRequest(b"a", revision=2), CompactedError),
        (RangeRequest(b"a", revision=1000), FutureRevisionError),
    ]
    for op, error in bad:
        before = s.revision
        with pytest.raises(error):
            s.txn((), [PutRequest(b"c", b"x"), op])
        assert s.revision == before and s.get(b"c") is None
        s.txn([cmp(b"a", VERSION, EQ, version=99)], [op], [PutRequest(b"c", b"x")])
        s.delete_range(b"c")
    s.txn((), [PutRequest(b"b", lease=1)])
    assert s.get(b"b").lease == 1


def test_range_in_txn_negative_revision_is_compacted_like_etcd():
    """etcd checkRequestRange compares a non-zero revision with the compact revision (-1 on
    a new store), so a txn range at revision -5 is `compacted` (observed), while a plain
    range at -5 reads the current revision."""
    s = MVCCStore()
    s.put(b"a", b"1")
    with pytest.raises(CompactedError):
        s.txn((), [RangeRequest(b"a", revision=-5)])
    assert s.range(b"a", revision=-5).kvs
