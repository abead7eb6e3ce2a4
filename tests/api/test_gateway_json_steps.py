"""A range answer is encoded as text, in one go or in steps (for a worker thread), byte for
byte as the generic JSON encoder writes its objects."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.api.http import gateway_json
from kvserver.api.http.common import dumps
from kvserver.kvpb.kv import KeyValue, RangeResponse, ResponseHeader

kvs = st.lists(
    st.builds(
        KeyValue,
        st.binary(min_size=1, max_size=6),
        st.binary(max_size=6),
        st.integers(0, 9),
        st.integers(0, 9),
        st.integers(0, 3),
        st.integers(0, 2**63 - 1),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(kvs=kvs, more=st.booleans(), count=st.integers(0, 99), step=st.integers(1, 7))
def test_encoding_in_steps_gives_the_same_bytes(kvs, more, count, step):
    r = RangeResponse(ResponseHeader(7, 9, 12, 3), tuple(kvs), more, count)
    # the reference: the generic encoder over the answer's JSON objects
    expected = dumps(gateway_json.range_response(r)).encode("ascii")
    assert gateway_json.encode_range(r) == expected
    assert gateway_json.encode_range_in_steps(r, step) == expected


usual_kvs = st.lists(
    st.builds(
        KeyValue,
        st.binary(min_size=1, max_size=6),
        st.binary(min_size=1, max_size=300),
        st.integers(1, 2**63 - 1),
        st.integers(1, 2**63 - 1),
        st.integers(1, 2**63 - 1),
        st.just(0),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(usual=usual_kvs, others=kvs, step=st.integers(1, 50))
def test_usual_key_values_filled_by_column_give_the_same_bytes(usual, others, step):
    """Slices of the usual KeyValue (no lease, everything else set) take the column-wise
    path, slices with any other take the per-KeyValue one: the same bytes either way."""
    for items in (usual, usual + others, others + usual):
        r = RangeResponse(ResponseHeader(7, 9, 12, 3), tuple(items), True, len(items))
        expected = dumps(gateway_json.range_response(r)).encode("ascii")
        assert gateway_json.encode_range_in_steps(r, step) == expected
