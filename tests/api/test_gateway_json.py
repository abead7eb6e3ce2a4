"""``kvserver.api.http.gateway_json`` as pure functions: etcd's JSON conventions both ways."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.api.http import gateway_json
from kvserver.api.shared.request_size import request_size_bytes
from kvserver.kvpb.kv import (
    Compare,
    CompareResult,
    CompareTarget,
    KeyValue,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    RequestOp,
    ResponseHeader,
    ResponseOp,
    SortOrder,
    SortTarget,
    TxnRequest,
    TxnResponse,
)
from kvserver.kvpb.service_errors import ServiceError

INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_every_range_field_decodes_by_proto_and_camel_name() -> None:
    fields = {
        "key": b64(b"a"),
        "range_end": b64(b"b"),
        "limit": "3",
        "revision": 4,
        "sort_order": "ASCEND",
        "sort_target": "VALUE",
        "serializable": True,
        "keys_only": True,
        "count_only": False,
        "min_mod_revision": "5",
        "max_mod_revision": "6",
        "min_create_revision": "7",
        "max_create_revision": "8",
    }
    expected = RangeRequest(
        b"a", b"b", 3, 4, SortOrder.ASCEND, SortTarget.VALUE, True, True, False, 5, 6, 7, 8
    )
    assert gateway_json.decode_range(json.dumps(fields).encode()) == expected
    camel = {gateway_json._lower_camel(k): v for k, v in fields.items()}
    assert gateway_json.decode_range(json.dumps(camel).encode()) == expected


def test_enums_decode_to_members_from_names_and_numbers() -> None:
    req = gateway_json.decode_txn(
        json.dumps(
            {
                "compare": [
                    {"key": b64(b"k"), "target": "MOD", "result": "NOT_EQUAL"},
                    {"key": b64(b"k"), "target": 1, "result": 2},
                ]
            }
        ).encode()
    )
    assert [(c.target, c.result) for c in req.compare] == [
        (CompareTarget.MOD, CompareResult.NOT_EQUAL),
        (CompareTarget.CREATE, CompareResult.LESS),
    ]
    assert type(req.compare[0].target) is CompareTarget


def test_last_duplicate_field_wins_and_null_means_default() -> None:
    # etcd 3.4: {"key":"Zm9v","key":"eA=="} reads key "x"
    assert gateway_json.decode_range(b'{"key":"Zm9v","key":"eA=="}').key == b"x"
    # etcd 3.4: count_only true then countOnly false -> false
    assert (
        gateway_json.decode_range(b'{"key":"eA==","count_only":true,"countOnly":false}').count_only
        is False
    )
    assert gateway_json.decode_range(
        b'{"key":"eA==","limit":null,"sort_order":null}'
    ) == RangeRequest(b"x")


def test_base64_variants() -> None:
    assert gateway_json.decode_put(b'{"key":"Zm9v\\n"}').key == b"foo"  # etcd accepts CR/LF too
    assert gateway_json.decode_put(b'{"key":"-_8"}').key == b"\xfb\xff"  # URL-safe, unpadded
    assert gateway_json.decode_put(b'{"key":"+/8="}').key == b"\xfb\xff"
    assert gateway_json.decode_put(b'{"key":""}').key == b""


@pytest.mark.parametrize(
    "text,value",
    [
        ('"-9223372036854775808"', -(1 << 63)),
        ('"9223372036854775807"', (1 << 63) - 1),
        ("-1", -1),
        ('"0"', 0),
        ("42", 42),
    ],
)
def test_int64_forms(text: str, value: int) -> None:
    assert (
        gateway_json.decode_range(f'{{"key":"eA==","revision":{text}}}'.encode()).revision == value
    )


@pytest.mark.parametrize(
    "text",
    [
        '" 3"',
        '"+3"',
        '"0x3"',
        '"3.0"',
        "3.0",
        '"1e2"',
        '""',
        '"٣"',
        "true",
        "[]",
        '"99999999999999999999"',
    ],
)
def test_int64_rejects(text: str) -> None:
    with pytest.raises(ServiceError) as err:
        gateway_json.decode_range(f'{{"key":"eA==","revision":{text}}}'.encode())
    assert err.value.http_status == 400 and 'field "revision"' in err.value.message


@settings(max_examples=200, deadline=None)
@given(
    key=st.binary(min_size=1, max_size=40),
    value=st.binary(max_size=100),
    lease=INT64,
    prev_kv=st.booleans(),
    lease_as_text=st.booleans(),
)
def test_put_request_round_trips_through_etcd_json(
    key: bytes, value: bytes, lease: int, prev_kv: bool, lease_as_text: bool
) -> None:
    body = {
        "key": b64(key),
        "value": b64(value),
        "prev_kv": prev_kv,
        "lease": str(lease) if lease_as_text else lease,
    }
    assert gateway_json.decode_put(json.dumps(body).encode()) == PutRequest(
        key, value, lease, prev_kv
    )


@settings(max_examples=200, deadline=None)
@given(
    kv=st.builds(
        KeyValue, st.binary(max_size=20), st.binary(max_size=20), INT64, INT64, INT64, INT64
    )
)
def test_key_value_encoding_omits_defaults_and_stringifies_ints(kv: KeyValue) -> None:
    out = json.loads(gateway_json.encode({"kv": gateway_json.key_value(kv)}))["kv"]
    decoded = KeyValue(
        base64.b64decode(out.get("key", "")),
        base64.b64decode(out.get("value", "")),
        int(out.get("create_revision", "0")),
        int(out.get("mod_revision", "0")),
        int(out.get("version", "0")),
        int(out.get("lease", "0")),
    )
    assert decoded == kv
    assert all(isinstance(v, str) and v not in ("", "0") for v in out.values())
    assert list(out) == [
        f
        for f in ("key", "create_revision", "mod_revision", "version", "value", "lease")
        if f in out
    ]


def test_header_keeps_only_non_zero_fields() -> None:
    assert gateway_json.header(ResponseHeader(1, 2, 3, 4)) == {
        "cluster_id": "1",
        "member_id": "2",
        "revision": "3",
        "raft_term": "4",
    }
    assert gateway_json.header(ResponseHeader(0, 0, 7, 0)) == {"revision": "7"}
    # uint64 ids above int64 stay exact strings
    assert gateway_json.header(ResponseHeader(2**64 - 1))["cluster_id"] == "18446744073709551615"


def test_response_defaults_are_omitted() -> None:
    h = ResponseHeader(revision=5)
    assert gateway_json.range_response(RangeResponse(h)) == {"header": {"revision": "5"}}
    assert gateway_json.put_response(PutResponse(h)) == {"header": {"revision": "5"}}
    assert gateway_json.txn_response(TxnResponse(h, False, ())) == {"header": {"revision": "5"}}
    nested = TxnResponse(h, True, (ResponseOp(response_txn=TxnResponse(ResponseHeader())),))
    assert gateway_json.txn_response(nested) == {
        "header": {"revision": "5"},
        "succeeded": True,
        "responses": [{"response_txn": {"header": {}}}],
    }


def test_request_size_counts_keys_and_values_of_nested_txns() -> None:
    put = PutRequest(b"k" * 10, b"v" * 100)
    txn = TxnRequest(
        compare=(Compare(CompareResult.EQUAL, CompareTarget.VALUE, b"k", value=b"x" * 50),),
        success=(
            RequestOp(request_put=put),
            RequestOp(request_txn=TxnRequest(success=(RequestOp(request_put=put),))),
        ),
    )
    assert request_size_bytes(put) == 126
    assert request_size_bytes(txn) > 2 * 110 + 51


@settings(max_examples=300, deadline=None)
@given(
    st.builds(
        ResponseHeader,
        st.integers(0, 2**64 - 1),
        st.integers(0, 2**64 - 1),
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**63 - 1),
    )
)
def test_fast_header_text_equals_the_dict_encoding(h: ResponseHeader) -> None:
    assert json.loads(gateway_json.header_json(h)) == gateway_json.header(h)


def test_top_level_encoders_put_the_header_first() -> None:
    h = ResponseHeader(1, 2, 3, 4)
    kv = KeyValue(b"k", b"v", 2, 3, 1)
    body = gateway_json.encode_range(RangeResponse(h, (kv,), True, 5))
    assert body.startswith(
        b'{"header":{"cluster_id":"1","member_id":"2","revision":"3","raft_term":"4"},"kvs":['
    )
    assert json.loads(body) == gateway_json.range_response(RangeResponse(h, (kv,), True, 5))
    assert json.loads(gateway_json.encode_put(PutResponse(h))) == {"header": gateway_json.header(h)}


_B64ISH = st.one_of(
    st.binary(max_size=6).map(lambda b: base64.b64encode(b).decode()),
    st.binary(max_size=6).map(lambda b: base64.urlsafe_b64encode(b).decode().rstrip("=")),
    st.text(max_size=4),
    st.integers(),
    st.none(),
    st.booleans(),
)
_PUT_FIELDS = st.dictionaries(
    st.sampled_from(["key", "value", "lease", "prev_kv", "other"]), _B64ISH, max_size=3
)
_OP = st.one_of(
    st.fixed_dictionaries({"request_put": _PUT_FIELDS}),
    st.dictionaries(
        st.sampled_from(["request_put", "request_range", "x"]),
        st.one_of(_PUT_FIELDS, _B64ISH),
        max_size=2,
    ),
    _B64ISH,
)


@settings(max_examples=500, deadline=None)
@given(_OP)
def test_the_put_op_shortcut_decodes_as_the_general_path(op):
    """A txn op holding a put of a key and a value takes a shortcut; for any op the answer,
    or the error and its text, is the general decoder's."""
    spec = gateway_json._MESSAGES["RequestOp"]
    try:
        want = gateway_json._decode_fields(op, spec, "success[0].", 0)
    except ServiceError as err:
        with pytest.raises(ServiceError) as got:
            gateway_json._decode(op, spec, "success[0].", 0)
        assert str(got.value) == str(err)
        return
    got = gateway_json._decode(op, spec, "success[0].", 0)
    assert got == want and type(got) is type(want)


_KVS = st.builds(
    KeyValue,
    st.binary(max_size=8),
    st.binary(max_size=8),
    st.integers(0, 99),
    st.integers(0, 99),
    st.integers(0, 9),
    st.integers(0, 9),
)
_OPS = st.one_of(
    st.builds(
        lambda h, prev: ResponseOp(response_put=PutResponse(h, prev)),
        st.builds(ResponseHeader, st.just(0), st.just(0), st.integers(0, 99), st.just(0)),
        st.none() | _KVS,
    ),
    st.builds(
        lambda kvs: ResponseOp(response_range=RangeResponse(ResponseHeader(0, 0, 7, 0), kvs)),
        st.lists(_KVS, max_size=2).map(tuple),
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.booleans(), _OPS, st.integers(0, 130), st.lists(_OPS, max_size=3))
def test_a_txn_of_one_shared_response_encodes_as_the_general_path(succeeded, op, n, others):
    """The store answers a txn's bare puts with one shared ResponseOp, which encode_txn writes
    once; the body must be the general path's, byte for byte, shared or not."""
    h = ResponseHeader(1, 2, 300, 4)
    for responses in ((op,) * n, (op,) * n + tuple(others), tuple(others) + (op,) * n):
        r = TxnResponse(h, succeeded, responses)
        general = gateway_json._with_header(r.header, gateway_json._txn_fields(r))
        assert gateway_json.encode_txn(r) == general
        assert json.loads(general) == gateway_json.txn_response(r)
