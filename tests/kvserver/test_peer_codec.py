"""Peer message codec: exact round trips, and no input from a peer raises anything but
PeerMessageError (a node never crashes on input from a peer)."""

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.rafthttp.codec import (
    PeerMessageError,
    decode_batch,
    decode_message,
    encode_batch,
    encode_message,
)
from raft import ConfState, Entry, EntryType, Message, MessageType, Snapshot, SnapshotMetadata

u64 = st.integers(0, (1 << 64) - 1)
ids = st.lists(u64, max_size=4).map(lambda xs: tuple(sorted(xs)))
entries = st.builds(Entry, u64, u64, st.sampled_from(list(EntryType)), st.binary(max_size=64))
snapshots = st.builds(
    Snapshot,
    st.binary(max_size=64),
    st.builds(SnapshotMetadata, st.builds(ConfState, ids, ids, ids, ids, st.booleans()), u64, u64),
)
messages = st.builds(
    Message,
    st.sampled_from(list(MessageType)),
    u64,
    u64,
    u64,
    u64,
    u64,
    st.lists(entries, max_size=4).map(tuple),
    u64,
    st.none() | snapshots,
    st.booleans(),
    u64,
    st.binary(max_size=16),
)


@given(messages)
def test_message_round_trip(m):
    assert decode_message(encode_message(m)) == m


@given(st.lists(messages, max_size=5))
def test_batch_round_trip(batch):
    assert decode_batch(encode_batch(batch)) == batch


@settings(max_examples=60)
@given(st.binary(max_size=200))
def test_garbage_bytes_raise_only_peer_message_error(junk):
    for decode in (decode_message, decode_batch):
        try:
            decode(junk)
        except PeerMessageError:
            pass


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(1 << 63), (1 << 64) - 1)
        | st.binary(max_size=8)
        | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=13),
        max_leaves=40,
    )
)
@settings(max_examples=60)
def test_wellformed_msgpack_of_the_wrong_shape_is_rejected_cleanly(value):
    data = msgpack.packb(value, use_bin_type=True)
    for decode in (decode_message, decode_batch):
        try:
            decode(data)
        except PeerMessageError:
            pass


@pytest.mark.parametrize(
    "fields, why",
    [
        ([99, 1, 2, 0, 0, 0, [], 0, None, False, 0, b""], "unknown type"),
        ([3, -1, 2, 0, 0, 0, [], 0, None, False, 0, b""], "negative id"),
        ([3, 1, 2, 0, 0, 0, [[1, 1, 0, "text"]], 0, None, False, 0, b""], "str entry data"),
        ([3, 1, 2, 0, 0, 0, [], 0, None, 1, 0, b""], "reject not a bool"),
    ],
)
def test_specific_bad_messages(fields, why):
    with pytest.raises(PeerMessageError):
        decode_message(msgpack.packb(fields, use_bin_type=True))
