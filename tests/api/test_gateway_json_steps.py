"""A big range answer is encoded in steps (for a worker thread) byte for byte as in one go."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.api.http import gateway_json
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
    assert gateway_json.encode_range_in_steps(r, step) == gateway_json.encode_range(r)
