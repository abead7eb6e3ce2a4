"""The gateway's watch lines, as pure functions: the column-by-column path for the usual PUT
events writes exactly the bytes of the general, dict-by-dict path."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.api.http import gateway_json
from kvserver.api.http import watch as http_watch
from kvserver.api.http.common import dumps
from kvserver.kvpb.kv import Event, EventType, KeyValue, ResponseHeader
from kvserver.kvpb.watch import WatchResponse

_SMALL = st.integers(0, 3) | st.integers(0, 2**63 - 1)
_KV = st.builds(
    KeyValue, st.binary(max_size=6), st.binary(max_size=6), _SMALL, _SMALL, _SMALL, _SMALL
)
_USUAL_KV = st.builds(
    KeyValue,
    st.binary(min_size=1, max_size=6),
    st.binary(min_size=1, max_size=6),
    st.integers(1, 2**63 - 1),
    st.integers(1, 2**63 - 1),
    st.integers(1, 99),
)
_EVENT = st.builds(
    Event, st.sampled_from(list(EventType)), _KV | _USUAL_KV, st.none() | _KV
) | st.builds(Event, st.just(EventType.PUT), _USUAL_KV, st.none())
_RESPONSE = st.builds(
    WatchResponse,
    st.builds(ResponseHeader, st.just(0), st.just(0), st.integers(0, 99), st.just(0)),
    st.integers(0, 9),
    st.booleans(),
    st.booleans(),
    st.integers(0, 9),
    st.sampled_from(["", "gone"]),
    st.booleans(),
    st.lists(_EVENT, max_size=6).map(tuple),
)


def general_line(resp: WatchResponse, cluster_id: int, member_id: int, term: int) -> bytes:
    """The line built from dicts, field by field (what the gateway wrote for every event)."""
    header = gateway_json.header_json(
        ResponseHeader(cluster_id, member_id, resp.header.revision, term)
    )
    fields = http_watch.watch_response_fields(resp)
    text = '{"result":{"header":' + header + ("," + dumps(fields)[1:] if fields else "}")
    return (text + "}\n").encode("ascii")


@settings(max_examples=300)
@given(_RESPONSE)
def test_a_watch_line_is_the_general_path_byte_for_byte(resp):
    line = http_watch.encode_watch_line(resp, 11, 22, 3)
    assert line == general_line(resp, 11, 22, 3)
    assert json.loads(line)["result"].get("events", []) == [
        http_watch.event_json(ev) for ev in resp.events
    ]


@given(_RESPONSE, st.integers(1, 4))
def test_a_watch_line_in_pieces_joins_to_the_whole_line(resp, step):
    pieces = list(http_watch.encode_line_pieces(resp, 11, 22, 3, step=step))
    assert b"".join(pieces) == general_line(resp, 11, 22, 3)
