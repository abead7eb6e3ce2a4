"""Log-entry codec and snapshot stream of the MVCC store: exact round trips, chunking,
a consistent view while writes continue, and clear errors for damaged input."""

import dataclasses
import gc
import io
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.mvcc import (
    CodecError,
    CompactedError,
    CompactionRequest,
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    InvalidArgumentError,
    KeyValue,
    MVCCStore,
    PutRequest,
    RangeRequest,
    RequestOp,
    SnapshotFormatError,
    SnapshotLoader,
    SortOrder,
    SortTarget,
    TxnRequest,
    decode,
    decode_entry,
    encode,
    encode_entry,
)
from kvserver.mvcc.snapshot import SnapshotParts

NESTED_TXN = TxnRequest(
    compare=(
        Compare(CompareResult.GREATER, CompareTarget.MOD, b"k", mod_revision=3),
        Compare(CompareResult.EQUAL, CompareTarget.VALUE, b"a", value=b"x", range_end=b"b"),
    ),
    success=(
        RequestOp.of(PutRequest(b"k", b"v", lease=5, prev_kv=True)),
        RequestOp.of(TxnRequest(failure=(RequestOp.of(DeleteRangeRequest(b"a", b"\0")),))),
    ),
    failure=(
        RequestOp.of(
            RangeRequest(b"a", b"z", 3, 0, SortOrder.DESCEND, SortTarget.VALUE, min_mod_revision=2)
        ),
    ),
)


@pytest.mark.parametrize(
    "request_",
    [
        PutRequest(b"k", b"\x00\xff" * 100, lease=-(1 << 63)),
        RangeRequest(b"a", b"\0", limit=7, sort_order=SortOrder.ASCEND, count_only=True),
        DeleteRangeRequest(b"a", b"b", prev_kv=True),
        CompactionRequest(12, physical=True),
        NESTED_TXN,
    ],
)
def test_entry_round_trip(request_):
    data = encode_entry(request_, client_id=(1 << 63) - 1, request_id=42)
    cid, rid, back = decode_entry(data)
    assert (cid, rid, back) == ((1 << 63) - 1, 42, request_)
    assert type(back) is type(request_)


def test_enums_decode_as_enums():
    _, _, back = decode_entry(encode_entry(NESTED_TXN))
    assert type(back.compare[0].result) is CompareResult
    assert type(back.failure[0].request_range.sort_target) is SortTarget


def test_responses_and_errors_round_trip():
    s = MVCCStore()
    s.put(b"a", b"1")
    resp = s.txn((), [PutRequest(b"a", b"2", prev_kv=True), RangeRequest(b"a", b"\0")])
    assert decode(encode(resp)) == resp
    err = CompactedError(compact_revision=9)
    back = decode(encode(err))
    assert back == err and back.compact_revision == 9


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        msgpack.packb([2, 0, 0, [11, b"k", b"v", 0, False, False, False]]),
        msgpack.packb([1, 0, 0, [11, b"k"]]),
        msgpack.packb([1, 0, 0, [77, b"k"]]),
        msgpack.packb([1, "x", 0, [11, b"k", b"v", 0, False, False, False]]),
        msgpack.packb({"a": 1}),
    ],
)
def test_damaged_entries_raise_codec_error(data):
    with pytest.raises(CodecError):
        decode_entry(data)


def test_apply_entry_validates_decoded_requests():
    """An entry is never trusted: a wrongly typed field is an InvalidArgument result."""
    s = MVCCStore()
    bad = msgpack.packb([1, 0, 0, [11, "text-not-bytes", b"v", 0, False, False, False]])
    res = s.apply_entry(bad)
    assert isinstance(res.error, InvalidArgumentError) and s.revision == 1
    garbled = s.apply_entry(b"\xc1not msgpack")
    assert isinstance(garbled.error, InvalidArgumentError) and s.revision == 1
    ok = s.apply_entry(encode_entry(PutRequest(b"k", b"v"), 3, 4))
    assert ok.error is None and s.apply_entry(encode_entry(PutRequest(b"k"), 3, 4)).duplicate


def _busy_store() -> MVCCStore:
    s = MVCCStore()
    for i in range(300):
        s.put(b"key%03d" % (i % 50), b"v%d" % i * 20, lease=i % 3)
        if i % 7 == 0:
            s.delete_range(b"key%03d" % (i % 11), b"key%03d" % (i % 11 + 3))
    s.compact(200)
    s.txn((), [PutRequest(b"t1", b"x"), DeleteRangeRequest(b"key010")])
    s.apply(PutRequest(b"d", b"1"), 7, 1)
    return s


def _state(s: MVCCStore):
    return (
        s.revision,
        s.compact_revision,
        s.key_count,
        s.history_size,
        [s.range(b"\0", b"\0", revision=r) for r in range(max(1, s.compact_revision), s.revision)],
        s.events_since(max(0, s.compact_revision), b"\0", b"\0", prev_kv=True),
        {lease: s.keys_with_lease(lease) for lease in s.lease_ids()},
        s.dedup.export(),
    )


def test_snapshot_round_trip_is_exact():
    s = _busy_store()
    chunks = list(s.serialize(chunk_size_bytes=1024))
    assert len(chunks) > 3
    assert all(len(c) < 1024 * 2 for c in chunks)
    r = MVCCStore.restore(chunks)
    assert _state(r) == _state(s)
    assert b"".join(r.serialize(chunk_size_bytes=1024)) == b"".join(chunks)
    # and the restored store keeps working identically
    for store in (s, r):
        store.put(b"key001", b"new")
        store.compact(store.revision - 1)
    assert _state(r) == _state(s)


def test_snapshot_of_new_store():
    r = MVCCStore.restore(MVCCStore().serialize())
    assert (r.revision, r.compact_revision, r.key_count) == (1, -1, 0)


def test_snapshot_is_a_point_in_time_view_while_writes_continue():
    """serialize() captures the state when called; puts, deletes and compactions applied
    while the chunks are being consumed do not leak into the snapshot."""
    s = _busy_store()
    expected = b"".join(s.serialize(chunk_size_bytes=1024))
    before = _state(s)
    it = s.serialize(chunk_size_bytes=1024)
    got = [next(it)]
    for i, chunk in enumerate(it):
        got.append(chunk)
        s.put(b"key%03d" % (i % 60), b"later")
        s.delete_range(b"key%03d" % (i % 13))
        if i % 5 == 0:
            s.compact(s.revision - 1)
    assert b"".join(got) == expected
    assert _state(MVCCStore.restore(got)) == before


def test_loader_accepts_arbitrary_chunk_boundaries():
    s = _busy_store()
    data = b"".join(s.serialize())
    loader = SnapshotLoader()
    for i in range(0, len(data), 777):
        loader.feed(data[i : i + 777])
    assert _state(MVCCStore.from_parts(loader.finish())) == _state(s)


def test_truncated_or_damaged_snapshots_are_rejected():
    s = _busy_store()
    data = b"".join(s.serialize())
    with pytest.raises(SnapshotFormatError, match="truncated"):
        MVCCStore.restore([data[: len(data) // 2]])
    with pytest.raises(SnapshotFormatError):
        MVCCStore.restore([data[:-3]])
    with pytest.raises(SnapshotFormatError):
        MVCCStore.restore([data + b"\x01"])
    with pytest.raises(SnapshotFormatError, match="not a raftkv"):
        MVCCStore.restore([msgpack.packb({"magic": "other"})])
    header = msgpack.packb(
        {"magic": "raftkv-mvcc-snapshot", "version": 1, "revision": 5, "compact_revision": 0}
    )
    wrong_count = msgpack.packb(["end", {"base": 1, "log": 0, "dedup_clients": 0}])
    with pytest.raises(SnapshotFormatError, match="counts"):
        MVCCStore.restore([header, wrong_count])
    bad_record = msgpack.packb(["log", [[b"k", "str", 1, 1, 1, 0]]])
    with pytest.raises(SnapshotFormatError, match="malformed record"):
        MVCCStore.restore([header, bad_record])
    out_of_order = msgpack.packb(["log", [[b"k", b"v", 3, 3, 1, 0], [b"j", b"v", 2, 2, 1, 0]]])
    with pytest.raises(SnapshotFormatError, match="order"):
        MVCCStore.restore(
            [
                header,
                out_of_order,
                msgpack.packb(["end", {"base": 0, "log": 2, "dedup_clients": 0}]),
            ]
        )


@pytest.mark.parametrize(
    ("base", "log", "message"),
    [
        ([], [[b"a", b"v", 4, 4, 1, 0], [b"b", b"v", 3, 3, 1, 0]], "log versions out of"),
        ([], [[b"a", b"v", 4, 4, 1, 0], [b"b", b"v", 9, 9, 1, 0]], "log versions out of"),
        ([], [[b"a", b"v", 2, 2, 1, 0], [b"b", b"v", 4, 4, 1, 0]], "log versions out of"),
        ([[b"a", b"v", 3, 3, 1, 0]], [], "base version at or above"),
        ([[b"a", b"", 0, 2, 0, 0]], [], "base version at or above"),
    ],
    ids=[
        "log-decreasing",
        "log-past-revision",
        "log-below-compact",
        "base-at-compact",
        "base-dead",
    ],
)
def test_each_revision_rule_of_a_snapshot_is_checked(base, log, message):
    """Revision 5, compact revision 3: base versions live and below 3, log versions from 3 to
    5 in order (the first and last of the log are the ones the bounds are read from)."""
    header = msgpack.packb(
        {"magic": "raftkv-mvcc-snapshot", "version": 1, "revision": 5, "compact_revision": 3}
    )
    ok_log = [[b"c", b"v", 3, 3, 1, 0], [b"d", b"v", 5, 5, 1, 0]]
    if log and log[0][3] >= 3:
        log = [ok_log[0], *log]  # the bound that is not under test holds
    end = {"base": len(base), "log": len(log), "dedup_clients": 0}
    parts = [header, msgpack.packb(["base", base]), msgpack.packb(["log", log])]
    with pytest.raises(SnapshotFormatError, match=message):
        MVCCStore.restore([*parts, msgpack.packb(["end", end])])
    good = [
        header,
        msgpack.packb(["base", [[b"z", b"v", 2, 2, 1, 0]]]),
        msgpack.packb(["log", ok_log]),
    ]
    good_end = {"base": 1, "log": 2, "dedup_clients": 0}
    assert MVCCStore.restore([*good, msgpack.packb(["end", good_end])]).revision == 5


def _base_only(*batches: list) -> list[bytes]:
    header = msgpack.packb(
        {"magic": "raftkv-mvcc-snapshot", "version": 1, "revision": 5, "compact_revision": 4}
    )
    n = sum(len(b) for b in batches)
    end = msgpack.packb(["end", {"base": n, "log": 0, "dedup_clients": 0}])
    return [header, *(msgpack.packb(["base", b]) for b in batches), end]


def test_a_base_section_out_of_key_order_is_read_and_a_repeated_key_refused():
    """This module writes the base section in key order, and the loader then builds no
    lookup table of it; a section in another order still restores the same store, and a key
    that comes twice is refused wherever the two are."""
    a, b, c = ([k, b"v", 2, 3, 1, 0] for k in (b"a", b"b", b"c"))
    in_order = MVCCStore.restore(_base_only([a, b], [c]))
    for shuffled in ([[c, a], [b]], [[b], [a, c]], [[a], [c, b]]):
        assert _state(MVCCStore.restore(_base_only(*shuffled))) == _state(in_order)
    for repeated in ([[a, b], [b]], [[a, a]], [[b, a], [c, a]]):
        with pytest.raises(SnapshotFormatError, match="key repeated"):
            MVCCStore.restore(_base_only(*repeated))


def test_a_key_twice_at_one_revision_is_rejected():
    header = msgpack.packb(
        {"magic": "raftkv-mvcc-snapshot", "version": 1, "revision": 5, "compact_revision": 0}
    )
    twice = msgpack.packb(["log", [[b"k", b"v", 2, 2, 1, 0], [b"k", b"w", 2, 2, 2, 0]]])
    end = msgpack.packb(["end", {"base": 0, "log": 2, "dedup_clients": 0}])
    with pytest.raises(SnapshotFormatError, match="history out of order"):
        MVCCStore.restore([header, twice, end])


def test_a_record_given_twice_is_rejected():
    kv = KeyValue(b"k", b"v", 2, 2, 1, 0)
    with pytest.raises(SnapshotFormatError, match="history out of order"):
        MVCCStore.from_parts(SnapshotParts(5, 0, [], [kv, kv], []))


@pytest.mark.parametrize("enabled", [True, False])
def test_restore_leaves_the_collector_as_it_found_it(enabled):
    """The cyclic GC is paused while a restore builds its objects, and on again after it
    if (and only if) it was on before."""
    data = list(_busy_store().serialize())
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        MVCCStore.restore(data)
        assert gc.isenabled() is enabled
        with pytest.raises(SnapshotFormatError):
            MVCCStore.restore([data[0][:-3]])
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        b"raw bytes",
        PutRequest("text key", b"v"),  # type: ignore[arg-type]
        PutRequest(b"k", None),  # type: ignore[arg-type]
        RangeRequest(b"k", limit=None),  # type: ignore[arg-type]
        RangeRequest(b"k", revision=1 << 64),
        TxnRequest(compare=(1,)),  # type: ignore[arg-type]
        TxnRequest(success=(PutRequest(b"k"),)),  # type: ignore[arg-type]
        TxnRequest(compare=(Compare(9, CompareTarget.MOD, b"k"),)),  # type: ignore[arg-type]
        TxnRequest(success=(RequestOp(PutRequest(b"k"), PutRequest(b"j")),)),  # type: ignore[arg-type]
        CompactionRequest("1"),  # type: ignore[arg-type]
    ],
)
def test_apply_never_raises_on_malformed_requests(garbage):
    """Bad input: a node never crashes on client input; a malformed request is an
    InvalidArgument outcome (remembered for dedup like any other write) and changes
    nothing."""
    s = MVCCStore()
    s.put(b"k", b"v")
    res = s.apply(garbage, client_id=1, request_id=1)
    assert isinstance(res.error, InvalidArgumentError)
    assert res.error.http_status == 400
    assert s.revision == 2 and s.get(b"k").value == b"v"
    is_read = type(garbage) is RangeRequest  # reads are never remembered
    assert s.apply(garbage, client_id=1, request_id=1).duplicate is not is_read


def test_decoded_key_values_are_what_the_constructor_makes():
    """The loader fills KeyValues' slots directly (faster than the frozen dataclass's
    __init__): the result must be indistinguishable from KeyValue(...)."""
    from kvserver.mvcc import snapshot

    assert snapshot._BY_SLOTS  # KeyValue as the loader expects it: else it uses __init__
    records = [[b"k%d" % i, b"v" * i, i + 1, i + 2, i + 3, i % 2] for i in range(5)]
    built = snapshot._kvs(records)
    expected = [KeyValue(*r) for r in records]
    assert built == expected
    assert [hash(kv) for kv in built] == [hash(kv) for kv in expected]
    assert all(type(kv) is KeyValue for kv in built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built[0].key = b"other"  # type: ignore[misc]


_PLAIN_PUT = st.lists(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 20), st.binary(max_size=3)),
    min_size=0,
    max_size=8,
).map(lambda fields: [11, *fields])
_PLAIN_FIELD = st.one_of(
    st.none(),
    _PLAIN_PUT,
    st.builds(
        lambda p: [11, *p],
        st.tuples(
            st.binary(), st.binary(), st.integers(), st.booleans(), st.booleans(), st.booleans()
        ),
    ),
    st.builds(lambda k: [12, k, b"", False], st.binary(max_size=3)),
    st.integers(0, 30),
    st.binary(max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_PLAIN_FIELD, min_size=3, max_size=5))
def test_the_put_op_shortcut_decodes_as_the_generic_decoder(fields):
    """``RequestOp``'s decoder takes a shortcut for an op holding only a put: for any shape
    it must give what the decoder derived from the dataclass gives, or the same error."""
    from kvserver.mvcc import codec

    plain = [codec.TAGS[RequestOp], *fields]
    generic = codec._class_decoder(RequestOp)
    try:
        expected = generic(plain)
    except Exception as err:  # noqa: BLE001 - the error type is what is compared
        with pytest.raises(type(err)):
            codec.from_plain(plain)
        return
    got = codec.from_plain(plain)
    assert got == expected
    assert type(got.request_put) is type(expected.request_put)


# --- format version 2: columnar batches ------------------------------------------------------

_V2_HEADER = msgpack.packb(
    {"magic": "raftkv-mvcc-snapshot", "version": 2, "revision": 5, "compact_revision": 0}
)


def _v1_stream(s: MVCCStore) -> list[bytes]:
    """The snapshot of ``s`` as format version 1 wrote it: each batch a list of records."""
    out = []
    for obj in msgpack.Unpacker(io.BytesIO(b"".join(s.serialize())), raw=False):
        if isinstance(obj, dict):
            obj = {**obj, "version": 1}
        elif obj[0] in ("base", "log"):
            keys, values, *ints = obj[1]
            columns = [keys, values, *(_ints(c, len(keys)) for c in ints)]
            obj = [obj[0], [list(r) for r in zip(*columns, strict=True)]]
        out.append(msgpack.packb(obj, use_bin_type=True))
    return out


def _ints(raw: bytes, n: int) -> list[int]:
    width = len(raw) // n
    fmt = {2: "h", 4: "i", 8: "q"}[width]
    return list(struct.unpack(f"<{n}{fmt}", raw))


def test_format_1_snapshots_are_still_read():
    s = _busy_store()
    v1 = _v1_stream(s)
    assert msgpack.unpackb(v1[0])["version"] == 1
    r = MVCCStore.restore(v1)
    assert _state(r) == _state(s)
    assert b"".join(r.serialize()) == b"".join(s.serialize())  # written again as version 2


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(
        st.tuples(
            st.integers(1, (1 << 62) - 1),  # a revision, any width
            st.integers(-(1 << 63), (1 << 63) - 1),  # a lease ID, anywhere in int64
            st.integers(1, 1 << 40),  # a version
        ),
        min_size=1,
        max_size=30,
        unique_by=lambda r: r[0],
    )
)
def test_integer_columns_round_trip_at_every_width(records):
    records.sort()
    log = [
        KeyValue(b"k%03d" % i, b"v", rev, rev, version, lease)
        for i, (rev, lease, version) in enumerate(records)
    ]
    s = MVCCStore.from_parts(SnapshotParts(records[-1][0], 0, [], log, []))
    data = b"".join(s.serialize())
    r = MVCCStore.restore([data])
    assert r.range(b"\0", b"\0").kvs == s.range(b"\0", b"\0").kvs == tuple(log)
    assert b"".join(r.serialize()) == data


@pytest.mark.parametrize(
    "batch",
    [
        [[b"k"], [b"v"], b"\x01\x00", b"\x01\x00", b"\x01\x00"],  # five columns
        [[b"k"], [b"v", b"w"], b"\x01\x00", b"\x01\x00", b"\x01\x00", b"\x00\x00"],
        [[b"k"], [b"v"], b"\x01\x00\x00", b"\x01\x00", b"\x01\x00", b"\x00\x00"],  # 3 bytes
        [[b"k"], [b"v"], [1], b"\x01\x00", b"\x01\x00", b"\x00\x00"],  # not a binary
        [[b"k", b"j"], [b"v", b"w"], b"\x01\x00" * 3, b"\x01\x00" * 2, b"\x01\x00" * 2, b""],
        [[], [], b"\x01\x00", b"", b"", b""],  # no keys, but a value in a column
        "not a batch",
    ],
    ids=["columns", "lengths", "width", "type", "ragged", "empty", "not-a-list"],
)
def test_malformed_columns_are_rejected(batch):
    with pytest.raises(SnapshotFormatError, match="malformed"):
        MVCCStore.restore([_V2_HEADER, msgpack.packb(["log", batch])])


def test_a_key_that_is_not_bytes_is_rejected():
    batch = [["k"], [b"v"], b"\x01\x00", b"\x01\x00", b"\x01\x00", b"\x00\x00"]
    with pytest.raises(SnapshotFormatError, match="malformed record"):
        MVCCStore.restore([_V2_HEADER, msgpack.packb(["log", batch], use_bin_type=True)])


def test_a_header_version_that_is_not_an_integer_is_rejected():
    header = msgpack.packb(
        {"magic": "raftkv-mvcc-snapshot", "version": True, "revision": 5, "compact_revision": 0}
    )
    with pytest.raises(SnapshotFormatError, match="not a raftkv"):
        MVCCStore.restore([header])
