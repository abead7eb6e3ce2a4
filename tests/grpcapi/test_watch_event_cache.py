"""A watch response is its header fields followed by its events' encoded fields, and each
event is encoded once however many watchers it goes to (``kvserver.api.grpc.watch``).

The reference is the generated protobuf classes: a response built our way parses to the
message they build from the same events, byte for byte once re-serialized."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.api.grpc import convert, watch
from kvserver.etcdpb import rpc_pb2
from kvserver.kvpb.kv import Event, EventType, KeyValue, ResponseHeader
from kvserver.kvpb.watch import WatchResponse

kvs = st.builds(
    KeyValue,
    key=st.binary(min_size=1, max_size=20),
    value=st.binary(max_size=300),
    create_revision=st.integers(1, 2**40),
    mod_revision=st.integers(1, 2**40),
    version=st.integers(1, 2**20),
    lease=st.integers(0, 2**62),
)
events = st.builds(Event, type=st.sampled_from(EventType), kv=kvs, prev_kv=st.none() | kvs)


@settings(max_examples=200, deadline=None)
@given(st.lists(events, max_size=20), st.integers(0, 2**40), st.integers(0, 2**62))
def test_a_response_parses_to_what_protobuf_builds(evs, revision, watch_id):
    resp = WatchResponse(ResponseHeader(revision=revision), watch_id, events=tuple(evs))
    ours = rpc_pb2.WatchResponse.FromString(watch.encode_response(resp, 7, 9, 3, step=3))
    reference = rpc_pb2.WatchResponse(
        header=rpc_pb2.ResponseHeader(cluster_id=7, member_id=9, revision=revision, raft_term=3),
        watch_id=watch_id,
        events=[convert.event_to_pb(ev) for ev in evs],
    )
    assert ours == reference


def test_an_event_is_encoded_once_and_never_mistaken_for_another():
    kv = KeyValue(b"k", b"v", 1, 1, 1)
    first = Event(EventType.PUT, kv)
    assert watch.event_field(first) is watch.event_field(first)  # the cached bytes
    other = Event(EventType.DELETE, kv)
    assert watch.event_field(other) != watch.event_field(first)
    big = Event(EventType.PUT, KeyValue(b"k", b"v" * watch.EVENT_CACHE_MAX_EVENT, 1, 1, 1))
    assert id(big) not in watch._EVENT_FIELDS  # not kept: too big
    watch.event_field(big)
    assert id(big) not in watch._EVENT_FIELDS
