"""``columnar.decode_range_arrow`` gives exactly what the ordinary decode gives, as columns.

Range answers are made by the server's own encoder (``gateway_json.encode_range``: the usual
compact shape, with fields omitted when zero or empty, leases, empty values) from random
KeyValues, and also re-serialized with whitespace (the slow path). Each is decoded both ways:
``codec.decode_range`` (a ``KeyValue`` per key) and ``decode_range_arrow`` (columns); the rows
must be equal, and so must the header, ``more`` and ``count``.
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from kvserver.api.http import gateway_json  # noqa: E402
from kvserver.client import codec, columnar  # noqa: E402
from kvserver.kvpb.kv import KeyValue, RangeResponse, ResponseHeader  # noqa: E402

revision = st.integers(0, (1 << 63) - 1)
kv = st.builds(
    KeyValue,
    st.binary(min_size=1, max_size=40),
    st.binary(max_size=70),
    revision,
    revision,
    st.integers(0, 1 << 40),
    st.one_of(st.just(0), st.integers(1, (1 << 63) - 1)),
)
utf8_kv = st.builds(
    KeyValue,
    st.text(min_size=1, max_size=20).map(lambda t: t.encode("utf-8")),
    st.text(max_size=30).map(lambda t: t.encode("utf-8")),
    st.integers(1, 1 << 40),
    st.integers(1, 1 << 40),
    st.integers(1, 1000),
    st.just(0),
)
answer = st.builds(
    RangeResponse,
    st.builds(ResponseHeader, st.integers(1, 1 << 60), st.integers(1, 1 << 60), revision),
    st.lists(st.one_of(kv, utf8_kv), max_size=30).map(tuple),
    st.booleans(),
    st.integers(0, 1 << 40),
)


def rows_of(result) -> list[tuple]:
    return [
        (k.key, k.value, k.create_revision, k.mod_revision, k.version, k.lease) for k in result.kvs
    ]


def arrow_rows(batch) -> list[tuple]:
    cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
    return list(zip(*cols, strict=True))


def check_same(body: bytes) -> None:
    want = codec.decode_range(json.loads(body))
    got = columnar.decode_range_arrow(body, key_format="binary")
    assert got.header == want.header
    assert (got.more, got.count) == (want.more, want.count)
    assert arrow_rows(got.batch) == rows_of(want)
    assert got.batch.schema.names == list(columnar.COLUMNS)


@settings(max_examples=150, deadline=None)
@given(answer)
def test_arrow_decode_equals_the_ordinary_decode(resp: RangeResponse) -> None:
    body = gateway_json.encode_range(resp)
    check_same(body)
    check_same(json.dumps(json.loads(body), indent=1).encode())  # not the compact shape


@settings(max_examples=100, deadline=None)
@given(st.lists(utf8_kv, min_size=1, max_size=20))
def test_string_keys_and_values_are_the_utf8_text(kvs: list[KeyValue]) -> None:
    body = gateway_json.encode_range(RangeResponse(ResponseHeader(1, 2, 3, 4), tuple(kvs)))
    got = columnar.decode_range_arrow(body, value_format="string")
    assert got.batch.column(0).to_pylist() == [k.key.decode() for k in kvs]
    assert got.batch.column(1).to_pylist() == [k.value.decode() for k in kvs]
    assert got.last_key() == kvs[-1].key


def test_fixed_size_values_take_the_strided_copy_and_still_decode_exactly() -> None:
    kvs = tuple(
        KeyValue(b"k/%06d" % i, bytes([i % 256]) * 256, 2 + i, 2 + i, 1) for i in range(1000)
    )
    body = gateway_json.encode_range(RangeResponse(ResponseHeader(1, 2, 3, 4), kvs, True, 5000))
    check_same(body)


def test_a_key_that_is_not_utf8_is_named() -> None:
    body = gateway_json.encode_range(
        RangeResponse(
            ResponseHeader(1, 2, 3, 4),
            (KeyValue(b"ok", b"1", 2, 2, 1), KeyValue(b"\xffbad", b"1", 2, 2, 1)),
        )
    )
    with pytest.raises(ValueError, match=r"key b'\\xffbad' is not UTF-8"):
        columnar.decode_range_arrow(body)


def test_a_value_that_is_not_utf8_is_named_by_its_key() -> None:
    body = gateway_json.encode_range(
        RangeResponse(ResponseHeader(1, 2, 3, 4), (KeyValue(b"k", b"\xfe", 2, 2, 1),))
    )
    with pytest.raises(ValueError, match="the value of key b'k' is not UTF-8"):
        columnar.decode_range_arrow(body, value_format="string")


def test_base64_column_decode_handles_every_padding() -> None:
    import pyarrow as pa

    items = [b"", b"a", b"ab", b"abc", b"abcd", b"", b"\x00\xff" * 7]
    arr = pa.array([base64.b64encode(x).decode() for x in items], pa.string())
    assert columnar.b64decode_array(arr).to_pylist() == items
    assert columnar.b64decode_array(arr.slice(2, 3)).to_pylist() == items[2:5]


def test_an_empty_answer_is_an_empty_batch_with_the_schema() -> None:
    body = gateway_json.encode_range(RangeResponse(ResponseHeader(1, 2, 3, 4), ()))
    got = columnar.decode_range_arrow(body)
    assert got.batch.num_rows == 0
    assert got.batch.schema == columnar.schema()
    assert got.revision == 3 and got.last_key() is None


canonical_kv = st.builds(
    KeyValue,
    st.binary(min_size=1, max_size=40),
    st.binary(min_size=1, max_size=300),
    st.integers(1, (1 << 63) - 1),
    st.integers(1, (1 << 63) - 1),
    st.integers(1, (1 << 63) - 1),
    st.just(0),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(canonical_kv, min_size=1, max_size=40))
def test_the_usual_shape_is_decoded_by_quote_positions_exactly(kvs: list[KeyValue]) -> None:
    """Every field set and no lease: the shape the quote-position decoder takes (it must take
    it, and agree with the ordinary decode for keys and values of any length)."""
    body = gateway_json.encode_range(RangeResponse(ResponseHeader(1, 2, 3, 4), tuple(kvs)))
    _, kvs_text = columnar._split(body)
    columnar._canonical_columns(kvs_text)  # does not refuse the usual shape
    check_same(body)


def test_an_object_of_another_shape_among_usual_ones_is_not_lost() -> None:
    usual = KeyValue(b"k1", b"v", 2, 2, 1)
    odd = tuple(KeyValue(b"k%d" % i, b"", 0, 0, 0) for i in range(2, 7))  # 4 quotes each
    body = gateway_json.encode_range(RangeResponse(ResponseHeader(1, 2, 3, 4), (usual, *odd)))
    check_same(body)  # 40 quotes: two groups of 20, but six objects
    assert columnar.decode_range_arrow(body).batch.num_rows == 6
