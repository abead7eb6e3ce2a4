"""The client's JSON codec, error mapping and txn builder, without a server.

Shapes are those of etcd 3.4's JSON gateway (grpc-gateway): base64 bytes, int64 as strings,
enums by name, default values omitted; StatusResponse and Member use etcd's camelCase proto
field names (``dbSize``, ``raftIndex``, ``ID``, ``clientURLs``).
"""

import base64
import binascii
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvserver.client import (
    ClientError,
    Cmp,
    CompactedError,
    ConnectionFailedError,
    FailedPreconditionError,
    FutureRevisionError,
    InvalidArgumentError,
    LeaderChangedError,
    LeaseExistsError,
    LeaseNotFoundError,
    NoLeaderError,
    NotFoundError,
    Op,
    RequestTimeoutError,
    ResponseFormatError,
    Txn,
    UnavailableError,
    UnimplementedError,
    codec,
    normalize_endpoints,
)
from kvserver.client.errors import Attempt, from_http
from kvserver.kvpb.kv import (
    Compare,
    CompareResult,
    CompareTarget,
    KeyValue,
    PutRequest,
    RangeRequest,
    SortOrder,
)

HEADER = {
    "cluster_id": "14841639068965178418",
    "member_id": "10276657743932975437",
    "revision": "7",
    "raft_term": "3",
}


def test_put_body_omits_defaults_and_encodes_bytes_and_int64():
    assert codec.encode_put(PutRequest(key=b"k")) == {"key": "aw=="}
    assert codec.encode_put(PutRequest(key=b"k", value=b"\xff", lease=2**62, prev_kv=True)) == {
        "key": "aw==",
        "value": "/w==",
        "lease": str(2**62),
        "prev_kv": True,
    }


def test_range_body_uses_enum_names_and_strings():
    body = codec.encode_range(
        RangeRequest(
            key=b"a",
            range_end=b"b",
            limit=5,
            revision=9,
            sort_order=SortOrder.DESCEND,
            keys_only=True,
        )
    )
    assert body == {
        "key": "YQ==",
        "range_end": "Yg==",
        "limit": "5",
        "revision": "9",
        "sort_order": "DESCEND",
        "keys_only": True,
    }


def test_txn_compare_always_carries_its_target_field():
    req = (
        Txn()
        .when(Cmp.version("k") == 0, Cmp.value("k") != "x", Cmp.mod_revision("k", prefix=True) < 5)
        .then(Op.put("k", "v"))
        .otherwise(Op.get("k"), Op.delete("j", prefix=True))
        .to_request()
    )
    body = codec.encode_txn(req)
    assert body["compare"] == [
        {"result": "EQUAL", "target": "VERSION", "key": "aw==", "version": "0"},
        {"result": "NOT_EQUAL", "target": "VALUE", "key": "aw==", "value": "eA=="},
        {
            "result": "LESS",
            "target": "MOD",
            "key": "aw==",
            "range_end": "bA==",
            "mod_revision": "5",
        },
    ]
    assert body["success"] == [{"request_put": {"key": "aw==", "value": "dg=="}}]
    assert body["failure"] == [
        {"request_range": {"key": "aw=="}},
        {"request_delete_range": {"key": "ag==", "range_end": "aw=="}},
    ]


def test_decode_range_with_defaults_omitted():
    r = codec.decode_range({"header": HEADER})
    assert r.kvs == () and r.count == 0 and not r.more and r.revision == 7
    assert r.header.member_id == 10276657743932975437
    r = codec.decode_range(
        {
            "header": HEADER,
            "count": "3",
            "more": True,
            "kvs": [{"key": "aw==", "create_revision": "2", "mod_revision": "3", "version": "2"}],
        }
    )
    assert r.kvs == (KeyValue(b"k", b"", 2, 3, 2, 0),) and r.more and r.count == 3


def test_decode_txn_nested_responses():
    t = codec.decode_txn(
        {
            "header": HEADER,
            "succeeded": True,
            "responses": [
                {"response_put": {"header": {"revision": "7"}}},
                {
                    "response_range": {
                        "header": {"revision": "7"},
                        "count": "1",
                        "kvs": [{"key": "aw==", "value": "dg==", "version": "1"}],
                    }
                },
                {"response_delete_range": {"header": {"revision": "7"}}},
                {"response_txn": {"header": {"revision": "7"}, "succeeded": True}},
            ],
        }
    )
    assert t.succeeded
    assert [type(r).__name__ for r in t.responses] == [
        "PutResult",
        "RangeResult",
        "DeleteResult",
        "TxnResult",
    ]
    assert t.responses[1].kvs[0].value == b"v"
    assert not codec.decode_txn({"header": HEADER}).succeeded


_TXN_OPS = st.sampled_from(
    [
        {"response_put": {"header": {"revision": "7"}}},
        {"response_put": {"header": {"revision": "8"}}},
        {"response_put": {"header": {"revision": "7"}, "prev_kv": {"key": "aw==", "value": ""}}},
        {"response_range": {"header": {"revision": "7"}, "count": "1"}},
        {"response_delete_range": {"header": {"revision": "7"}, "deleted": "2"}},
        {"response_put": {"header": {"revision": "x"}}},  # bad: an error either way
        {"response_nothing": {}},
    ]
)


@given(st.lists(_TXN_OPS, max_size=12))
def test_decode_txn_of_repeated_ops_decodes_each_as_alone(ops):
    """Equal consecutive ops decode once (a txn's puts answer alike); the result must be what
    decoding every op on its own gives, errors included."""
    expected: list = []
    error = None
    for op in ops:
        try:
            expected.append(codec.decode_txn({"header": HEADER, "responses": [op]}).responses[0])
        except ResponseFormatError as exc:
            error = str(exc)
            break
    try:
        got = codec.decode_txn({"header": HEADER, "responses": [dict(op) for op in ops]})
    except ResponseFormatError as exc:
        assert str(exc) == error
    else:
        assert error is None and list(got.responses) == expected


def test_decode_status_accepts_etcd_camel_case_and_snake_case():
    etcd = codec.decode_status(
        {
            "header": HEADER,
            "version": "3.4.23",
            "dbSize": "20480",
            "leader": "10276657743932975437",
            "raftIndex": "8",
            "raftTerm": "3",
            "raftAppliedIndex": "8",
            "dbSizeInUse": "16384",
        },
        "http://a:1",
    )
    snake = codec.decode_status(
        {
            "header": HEADER,
            "version": "3.4.23",
            "db_size": 20480,
            "leader": 10276657743932975437,
            "raft_index": 8,
            "raft_term": 3,
            "raft_applied_index": 8,
            "db_size_in_use": 16384,
        },
        "http://a:1",
    )
    assert etcd == snake
    assert etcd.is_leader and etcd.raft_index == 8 and etcd.db_size_bytes == 20480


def test_decode_members_from_etcd_and_from_v1_status():
    etcd = codec.decode_members(
        {
            "members": [
                {
                    "ID": "3319814642761637952",
                    "name": "p1",
                    "peerURLs": ["http://p:2380"],
                    "clientURLs": ["http://c:2379"],
                }
            ]
        }
    )
    ours = codec.decode_members(
        {
            "id": "1",
            "members": [
                {
                    "id": "2e1259d415f2a040",
                    "name": "p1",
                    "peer_urls": ["http://p:2380"],
                    "client_urls": ["http://c:2379"],
                }
            ],
        }
    )
    assert etcd == ours
    assert etcd[0].client_urls == ("http://c:2379",)
    # raftkv's /v1/status prints ids in hex: an all-digit hex id must not be read as decimal.
    hexed = codec.decode_members({"members": [{"id": "1234", "name": "p1"}]})
    assert hexed[0].id == 0x1234
    with pytest.raises(ResponseFormatError):
        codec.decode_members({"members": [{"id": "xyz"}]})


@pytest.mark.parametrize(
    "doc",
    [
        {"header": HEADER, "kvs": [{"key": "!!"}]},
        {"header": HEADER, "kvs": {"key": "aw=="}},
        {"header": HEADER, "count": "many"},
        {"header": HEADER, "more": "yes"},
        {"header": "nope"},
        ["not", "an", "object"],
    ],
)
def test_malformed_answers_are_response_format_errors(doc):
    with pytest.raises(ResponseFormatError):
        codec.decode_range(doc)


@pytest.mark.parametrize(
    "status,code,message,cls",
    [
        (400, 3, "etcdserver: key is not provided", InvalidArgumentError),
        (400, 9, "etcdserver: ...", FailedPreconditionError),
        (400, 11, "etcdserver: mvcc: required revision has been compacted", CompactedError),
        (400, 11, "etcdserver: mvcc: required revision is a future revision", FutureRevisionError),
        (404, 5, "etcdserver: requested lease not found", LeaseNotFoundError),  # a NotFoundError
        (404, 5, "etcdserver: member not found", NotFoundError),
        (412, 9, "etcdserver: lease already exists", LeaseExistsError),  # a FailedPrecondition
        (503, 14, "etcdserver: no leader", NoLeaderError),
        (503, 14, "etcdserver: leader changed", LeaderChangedError),
        (503, 14, "etcdserver: request timed out", RequestTimeoutError),
        (503, 14, "etcdserver: server stopped", UnavailableError),
        (504, 4, "context deadline exceeded", RequestTimeoutError),
        (501, 12, "raftkv: not implemented yet: POST /v3/watch", UnimplementedError),
        (500, 13, "raftkv: internal error", ClientError),
    ],
)
def test_gateway_errors_map_to_typed_errors(status, code, message, cls):
    import json

    err = from_http(
        status,
        json.dumps({"error": message, "code": code, "message": message}).encode(),
        "http://a:1",
    )
    assert type(err) is cls
    assert err.message == message and err.code == code and err.http_status == status
    assert err.endpoint == "http://a:1"
    assert err.retryable == (status in (503, 504))


@pytest.mark.parametrize(
    "status,cls",
    [
        (404, NotFoundError),
        (400, InvalidArgumentError),
        (502, UnavailableError),
        (501, UnimplementedError),
        (405, UnimplementedError),
        (503, UnavailableError),
        (504, RequestTimeoutError),
        (500, ClientError),
    ],
)
def test_non_json_errors_map_by_http_status(status, cls):
    err = from_http(status, b"404 page not found\n", "http://a:1")
    assert type(err) is cls
    assert "page not found" in err.message


def test_errors_say_what_happened_and_survive_pickling():
    err = NoLeaderError(
        "etcdserver: no leader", code=14, http_status=503, endpoint="http://b:1"
    ).with_context(
        "put 'k'",
        (
            Attempt("http://a:1", "cannot connect: connection refused", "ConnectionFailedError"),
            Attempt("http://b:1", "etcdserver: no leader", "NoLeaderError"),
        ),
    )
    text = str(err)
    assert text.startswith("put 'k': etcdserver: no leader")
    assert "http://a:1: cannot connect" in text and "2 attempts" in text
    assert isinstance(err, UnavailableError) and err.retryable
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is NoLeaderError and str(back) == text
    conn = ConnectionFailedError("x", endpoints=("http://a:1",))
    assert pickle.loads(pickle.dumps(conn)).endpoints == ("http://a:1",)
    assert isinstance(RequestTimeoutError("t"), TimeoutError)


def test_normalize_endpoints():
    assert normalize_endpoints("127.0.0.1:2379, http://h:1/ ,,http://h:1") == (
        "http://127.0.0.1:2379",
        "http://h:1",
    )
    for bad in ("", "ftp://h:1", "http://h:1/path", "http://h:x", "http://:1"):
        with pytest.raises(ValueError):
            normalize_endpoints(bad)


def test_compare_builder():
    assert (Cmp.version("k") == 3) == Compare(
        CompareResult.EQUAL, CompareTarget.VERSION, b"k", version=3
    )
    assert Cmp.create_revision(b"k").gt(1).create_revision == 1
    assert Cmp.lease("k").ne(7) == Compare(
        CompareResult.NOT_EQUAL, CompareTarget.LEASE, b"k", lease=7
    )
    assert (Cmp.value("k") > b"a").value == b"a"
    with pytest.raises(TypeError):
        Cmp.version("k") == "3"  # noqa: B015
    with pytest.raises(TypeError):
        Txn().when("version(k) == 0")
    with pytest.raises(TypeError):
        Txn().then(PutRequest(key=b"k"))
    with pytest.raises(ValueError):
        Op.get("k", prefix=True, range_end="z")
    with pytest.raises(ValueError):
        Op.get("k", sort_order="sideways")


def test_empty_prefix_means_every_key_like_etcdctl():
    """`etcdctl get "" --prefix` sends key = range_end = "\\0" (all keys); an empty key alone
    would be refused by the server as "key is not provided"."""
    from kvserver.client.txn import key_range

    assert key_range("", None, True) == (b"\0", b"\0")
    assert key_range("a", None, True) == (b"a", b"b")


def _bytes_the_long_way(raw: str) -> bytes | str:
    """What ``codec.to_bytes`` answered before its strict fast path: the bytes, or the
    error's type name."""
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        return type(exc).__name__


@given(
    st.one_of(
        st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode()),
        st.text(alphabet="ABCab+/=\n -_é0", max_size=12),
    )
)
def test_bytes_decode_as_before_for_any_text(raw):
    """The strict C decoding takes exactly the text the long way takes, with the same bytes;
    the rest still fails as a ResponseFormatError."""
    want = _bytes_the_long_way(raw)
    if isinstance(want, bytes):
        assert codec.to_bytes(raw, "key") == want
    else:
        with pytest.raises(ResponseFormatError):
            codec.to_bytes(raw, "key")


@pytest.mark.parametrize("raw", ["12", "-7", "0", " 3", "1_000", "+5"])
def test_int64_strings_decode_as_int_does(raw):
    assert codec.to_int(raw, "revision") == int(raw, 10)


@pytest.mark.parametrize("raw", ["", "1.5", "0x10", "abc", "١٢"])
def test_malformed_int64_strings_are_response_format_errors(raw):
    try:
        int(raw, 10)
    except ValueError:
        with pytest.raises(ResponseFormatError, match="expected an integer"):
            codec.to_int(raw, "revision")
    else:  # int() takes it (Unicode digits): so does the codec, as before
        assert codec.to_int(raw, "revision") == int(raw, 10)
