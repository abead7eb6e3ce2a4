"""Put / range / delete-range semantics of the MVCC store, pinned to etcd 3.4 behaviour.

Each test names the etcd behaviour it reproduces (etcdserver/apply.go, mvcc/kvstore_txn.go,
mvcc/key_index.go, api/v3rpc/key.go). Several were also checked by hand against etcd 3.4.23's
JSON gateway while writing them (noted as "observed").
"""

import pytest

from kvserver.mvcc import (
    CompactedError,
    FutureRevisionError,
    InvalidArgumentError,
    KeyNotFoundError,
    KeyValue,
    MVCCStore,
    SortOrder,
    SortTarget,
    prefix_range_end,
)


def keys(resp):
    return [kv.key for kv in resp.kvs]


def test_revision_starts_at_one_and_first_write_is_two():
    """etcd: a new store is at revision 1 (currentRev = 1); the first write gets 2."""
    s = MVCCStore()
    assert s.revision == 1
    assert s.range(b"a").revision == 1
    r = s.put(b"a", b"1")
    assert r.revision == 2
    assert s.get(b"a") == KeyValue(b"a", b"1", 2, 2, 1, 0)


def test_version_counts_puts_and_create_revision_stays():
    """etcd: version is 1 at creation and +1 per put; create_revision is the creating put's
    revision; mod_revision the last put's."""
    s = MVCCStore()
    s.put(b"k", b"1")
    s.put(b"other", b"x")
    s.put(b"k", b"2")
    assert s.get(b"k") == KeyValue(b"k", b"2", 2, 4, 2, 0)


def test_version_resets_after_delete():
    """etcd keyIndex generations: a delete ends the generation; the next put starts a new one
    with version 1 and a new create_revision."""
    s = MVCCStore()
    s.put(b"k", b"1")
    s.put(b"k", b"2")
    d = s.delete_range(b"k")
    assert (d.deleted, d.revision) == (1, 4)
    assert s.get(b"k") is None
    s.put(b"k", b"3")
    assert s.get(b"k") == KeyValue(b"k", b"3", 5, 5, 1, 0)


def test_delete_of_missing_key_does_not_bump_revision():
    """etcd storeTxnWrite.End: a txn without changes leaves currentRev; DeleteRange then
    reports the unchanged revision and deleted = 0 (observed on etcd 3.4)."""
    s = MVCCStore()
    s.put(b"a", b"1")
    d = s.delete_range(b"zzz")
    assert (d.deleted, d.revision, s.revision) == (0, 2, 2)


def test_put_same_value_still_creates_revision():
    """etcd: every put is a change (new mod_revision, version+1), even with the same value."""
    s = MVCCStore()
    s.put(b"a", b"1")
    s.put(b"a", b"1")
    assert s.get(b"a") == KeyValue(b"a", b"1", 2, 3, 2, 0)


def test_prev_kv_on_put_and_delete():
    """etcd Put/DeleteRange with prev_kv return the key's value before the write; none for a
    new key."""
    s = MVCCStore()
    assert s.put(b"a", b"1", prev_kv=True).prev_kv is None
    assert s.put(b"a", b"2", prev_kv=True).prev_kv == KeyValue(b"a", b"1", 2, 2, 1, 0)
    assert s.put(b"a", b"3").prev_kv is None  # not asked
    s.put(b"b", b"x")
    d = s.delete_range(b"a", b"c", prev_kv=True)
    assert d.deleted == 2
    assert [kv.value for kv in d.prev_kvs] == [b"3", b"x"]
    assert s.delete_range(b"a", b"c", prev_kv=True).prev_kvs == ()


def test_ignore_value_and_ignore_lease():
    """etcd Put: ignore_value keeps the stored value, ignore_lease the stored lease; on a
    missing key both fail with `etcdserver: key not found` and change nothing."""
    s = MVCCStore()
    with pytest.raises(KeyNotFoundError, match="etcdserver: key not found"):
        s.put(b"a", ignore_value=True)
    assert s.revision == 1
    s.put(b"a", b"v", lease=7)
    r = s.put(b"a", ignore_value=True, lease=7)
    assert s.get(b"a") == KeyValue(b"a", b"v", 2, 3, 2, 7)
    assert r.revision == 3
    s.put(b"a", b"w", ignore_lease=True)
    assert s.get(b"a") == KeyValue(b"a", b"w", 2, 4, 3, 7)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"key": b""}, "etcdserver: key is not provided"),
        ({"key": b"a", "value": b"x", "ignore_value": True}, "etcdserver: value is provided"),
        ({"key": b"a", "lease": 5, "ignore_lease": True}, "etcdserver: lease is provided"),
    ],
)
def test_put_validation_errors(kwargs, message):
    """etcd v3rpc checkPutRequest: these are InvalidArgument errors with etcd's texts."""
    s = MVCCStore()
    with pytest.raises(InvalidArgumentError) as info:
        s.put(**kwargs)
    assert str(info.value) == message
    assert info.value.http_status == 400
    assert s.revision == 1


def test_empty_key_rejected_for_range_and_delete():
    """etcd checkRangeRequest / checkDeleteRequest: `etcdserver: key is not provided`."""
    s = MVCCStore()
    with pytest.raises(InvalidArgumentError, match="key is not provided"):
        s.range(b"")
    with pytest.raises(InvalidArgumentError, match="key is not provided"):
        s.delete_range(b"", b"\0")


def test_invalid_sort_option():
    """etcd (>= 3.6 check): unknown sort order/target -> `etcdserver: invalid sort option`."""
    s = MVCCStore()
    with pytest.raises(InvalidArgumentError, match="invalid sort option"):
        s.range(b"a", sort_order=7)


def _fill(s, items):
    for k, v in items:
        s.put(k, v)


def test_range_end_conventions_and_prefix():
    """etcd: range_end empty = single key; "\\0" = all keys >= key; otherwise [key, end);
    prefix = [p, p with last byte + 1) (clientv3.GetPrefixRangeEnd)."""
    s = MVCCStore()
    _fill(s, [(k, b"v") for k in [b"a", b"ab", b"abc", b"b", b"c"]])
    assert keys(s.range(b"ab")) == [b"ab"]
    assert keys(s.range(b"ab", b"\0")) == [b"ab", b"abc", b"b", b"c"]
    assert keys(s.range(b"ab", b"b")) == [b"ab", b"abc"]
    assert keys(s.range(b"a", prefix_range_end(b"a"))) == [b"a", b"ab", b"abc"]
    assert keys(s.range(b"\0", b"\0")) == [b"a", b"ab", b"abc", b"b", b"c"]
    assert keys(s.range(b"c", b"a")) == []  # end before key: empty


def test_prefix_range_end_helper():
    """clientv3.GetPrefixRangeEnd: increment the last byte < 0xff, drop what follows; no such
    byte -> "\\0" (from-key)."""
    assert prefix_range_end(b"abc") == b"abd"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\0"
    assert prefix_range_end(b"") == b"\0"


def test_limit_more_and_count():
    """etcd Range: count is the number of keys in the range (before limit); more says the
    limit cut results; count_only returns no kvs and more = false (observed)."""
    s = MVCCStore()
    _fill(s, [(k, b"v") for k in [b"a", b"b", b"c", b"d"]])
    r = s.range(b"a", b"\0", limit=2)
    assert (keys(r), r.more, r.count) == ([b"a", b"b"], True, 4)
    r = s.range(b"a", b"\0", limit=4)
    assert (len(r.kvs), r.more, r.count) == (4, False, 4)
    r = s.range(b"a", b"\0", limit=-3)  # a negative limit means no limit
    assert (len(r.kvs), r.more) == (4, False)
    r = s.range(b"a", b"\0", count_only=True, limit=1)
    assert (r.kvs, r.more, r.count) == ((), False, 4)


def test_sort_default_and_targets():
    """etcd Range: order NONE with target KEY keeps key order; any other target with order
    NONE sorts ASCEND; DESCEND reverses (equal elements keep key order)."""
    s = MVCCStore()
    _fill(s, [(b"a", b"3"), (b"b", b"1"), (b"c", b"2"), (b"d", b"1")])
    _fill(s, [(b"b", b"x"), (b"b", b"y"), (b"d", b"z")])
    assert keys(s.range(b"a", b"\0", sort_target=SortTarget.VERSION)) == [b"a", b"c", b"d", b"b"]
    assert keys(
        s.range(b"a", b"\0", sort_order=SortOrder.DESCEND, sort_target=SortTarget.VALUE)
    ) == [b"d", b"b", b"a", b"c"]
    assert keys(s.range(b"a", b"\0", sort_order=SortOrder.DESCEND)) == [b"d", b"c", b"b", b"a"]
    assert keys(s.range(b"a", b"\0", sort_target=SortTarget.MOD)) == [b"a", b"c", b"b", b"d"]
    assert keys(
        s.range(b"a", b"\0", sort_order=SortOrder.ASCEND, sort_target=SortTarget.CREATE)
    ) == [b"a", b"b", b"c", b"d"]


def test_sort_with_limit_quirk_matches_etcd():
    """etcd 3.4 (observed): with sort_order NONE and a non-KEY target, the limit+1 first keys
    by key are fetched and then sorted; with an explicit order everything is fetched first."""
    s = MVCCStore()
    _fill(s, [(b"a", b"3"), (b"b", b"1"), (b"c", b"2"), (b"d", b"1")])
    _fill(s, [(b"b", b"x"), (b"b", b"y"), (b"d", b"z")])
    r = s.range(b"a", b"z", sort_target=SortTarget.VERSION, limit=2)
    assert (keys(r), r.more, r.count) == ([b"a", b"c"], True, 4)
    r = s.range(b"a", b"z", sort_target=SortTarget.VERSION, sort_order=SortOrder.DESCEND, limit=2)
    assert (keys(r), r.more, r.count) == ([b"b", b"d"], True, 4)


def test_revision_filters_apply_before_limit_and_do_not_change_count():
    """etcd Range: min/max mod/create filters prune after fetching everything, before limit;
    count stays the unfiltered number of keys (observed: count 4, one kv, more true)."""
    s = MVCCStore()
    _fill(s, [(b"a", b"3"), (b"b", b"1"), (b"c", b"2"), (b"d", b"1")])
    _fill(s, [(b"b", b"x"), (b"b", b"y"), (b"d", b"z")])
    r = s.range(b"a", b"z", min_mod_revision=3, limit=1, keys_only=True)
    assert r.kvs == (KeyValue(b"b", b"", 3, 7, 3, 0),)
    assert (r.more, r.count) == (True, 4)
    r = s.range(b"a", b"z", max_create_revision=3, min_create_revision=3)
    assert keys(r) == [b"b"]
    r = s.range(b"a", b"z", max_mod_revision=4)
    assert keys(r) == [b"a", b"c"]


def test_keys_only_drops_values():
    """etcd Range keys_only: values are empty, the other fields stay."""
    s = MVCCStore()
    s.put(b"a", b"value")
    assert s.range(b"a", keys_only=True).kvs == (KeyValue(b"a", b"", 2, 2, 1, 0),)


def test_range_at_past_revision_sees_history():
    """etcd: range at revision r returns each key's version at r (deleted keys absent), and
    the response header carries the current revision, not r."""
    s = MVCCStore()
    s.put(b"a", b"1")  # 2
    s.put(b"b", b"1")  # 3
    s.put(b"a", b"2")  # 4
    s.delete_range(b"b")  # 5
    s.put(b"b", b"2")  # 6
    assert [kv.value for kv in s.range(b"a", b"\0", revision=3).kvs] == [b"1", b"1"]
    assert keys(s.range(b"a", b"\0", revision=5)) == [b"a"]
    r = s.range(b"a", b"\0", revision=4)
    assert [(kv.key, kv.value, kv.version) for kv in r.kvs] == [(b"a", b"2", 2), (b"b", b"1", 1)]
    assert r.revision == 6
    assert s.range(b"b", revision=1).kvs == ()


def test_future_and_compacted_revision_errors():
    """etcd rangeKeys: revision > current -> `mvcc: required revision is a future revision`;
    revision < compact revision -> `mvcc: required revision has been compacted`; a revision
    <= 0 means the current one (observed: revision -5 reads the current state)."""
    s = MVCCStore()
    for i in range(5):
        s.put(b"a", str(i).encode())
    with pytest.raises(
        FutureRevisionError, match="etcdserver: mvcc: required revision is a future"
    ):
        s.range(b"a", revision=7)
    s.compact(4)
    with pytest.raises(CompactedError, match="etcdserver: mvcc: required revision has been co"):
        s.range(b"a", revision=3)
    assert s.range(b"a", revision=4).kvs[0].value == b"2"  # the compact revision itself reads
    assert s.range(b"a", revision=-5).kvs[0].value == b"4"
