"""raft.types: value formats (they are the trace output) and the ConfChange wire encoding."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raft import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    ReadState,
    Ready,
    Snapshot,
    SnapshotMetadata,
    SoftState,
    StateType,
)
from raft.errors import ConfChangeError
from raft.types import limit_size


def test_message_type_numbering_matches_etcd_raftpb():
    assert MessageType.MsgHup == 0
    assert MessageType.MsgApp == 3
    assert MessageType.MsgSnap == 7
    assert MessageType.MsgTransferLeader == 13
    assert MessageType.MsgReadIndexResp == 16
    assert MessageType.MsgPreVoteResp == 18
    assert str(MessageType.MsgApp) == "MsgApp"


def test_entry_str():
    assert str(Entry(3, 17, data=b"put x")) == '3/17 EntryNormal "put x"'
    assert str(Entry(1, 2)) == '1/2 EntryNormal ""'
    cc = ConfChange(ConfChangeType.ADD_LEARNER_NODE, 4).encode()
    assert str(Entry(1, 3, EntryType.CONF_CHANGE, cc)) == "1/3 EntryConfChange l4"
    assert str(Entry(1, 4, data=b"\x00\x01")) == "1/4 EntryNormal 0x0001"
    long = str(Entry(1, 5, data=b"a" * 100))
    assert long.endswith('..."') and len(long) < 70


def test_message_str():
    m = Message(
        type=MessageType.MsgApp,
        to=2,
        frm=1,
        term=3,
        log_term=3,
        index=17,
        commit=16,
        entries=(Entry(3, 18, data=b"x"),),
    )
    assert str(m) == '1->2 MsgApp Term:3 Log:3/17 Commit:16 Entries:[3/18 EntryNormal "x"]'
    r = Message(
        type=MessageType.MsgAppResp,
        to=1,
        frm=2,
        term=3,
        index=9,
        reject=True,
        reject_hint=5,
        log_term=2,
    )
    assert str(r) == "2->1 MsgAppResp Term:3 Log:2/9 Rejected (Hint: 5)"
    snap = Snapshot(metadata=SnapshotMetadata(ConfState(voters=(1, 2)), index=5, term=2))
    s = Message(type=MessageType.MsgSnap, to=2, frm=1, term=3, snapshot=snap)
    assert str(s).endswith("Snapshot: Index:5 Term:2 ConfState:Voters:[1 2] Learners:[]")


def test_state_strs():
    assert str(HardState(2, 1, 5)) == "Term:2 Vote:1 Commit:5"
    assert str(SoftState(1, StateType.LEADER)) == "Lead:1 State:StateLeader"
    assert str(ReadState(4, b"ctx")) == 'Index:4 RequestCtx:"ctx"'
    assert str(Ready()) == "<empty Ready>"
    rd = Ready(hard_state=HardState(1, 1, 0), entries=(Entry(1, 1),), must_sync=True)
    assert (
        str(rd)
        == 'Ready MustSync=true:\nHardState Term:1 Vote:1 Commit:0\nEntries:\n1/1 EntryNormal ""'
    )


def test_values_are_frozen_and_slotted():
    e = Entry(1, 1)
    with pytest.raises(AttributeError):
        e.term = 2  # type: ignore[misc]
    assert not hasattr(e, "__dict__")
    assert not hasattr(Message(MessageType.MsgApp, 1, 2), "__dict__")


def test_snapshot_is_empty():
    assert Snapshot().is_empty()
    assert not Snapshot(metadata=SnapshotMetadata(index=3, term=1)).is_empty()


def test_conf_change_encoding_matches_etcd_bytes():
    # raftpb.ConfChange{ID: 0, Type: ConfChangeAddNode, NodeID: 2}.Marshal() in etcd
    assert ConfChange(ConfChangeType.ADD_NODE, 2).encode() == bytes.fromhex("080010001802")
    # {ID: 7, Type: RemoveNode, NodeID: 300, Context: "ab"}
    cc = ConfChange(ConfChangeType.REMOVE_NODE, 300, context=b"ab", id=7)
    assert cc.encode() == bytes.fromhex("0807100118ac0222026162")
    assert ConfChange.decode(cc.encode()) == cc


@given(
    st.sampled_from(list(ConfChangeType)),
    st.integers(0, (1 << 64) - 1),
    st.binary(max_size=20),
    st.integers(0, (1 << 64) - 1),
)
def test_conf_change_roundtrip(t, node_id, ctx, cc_id):
    cc = ConfChange(t, node_id, context=ctx, id=cc_id)
    assert ConfChange.decode(cc.encode()) == cc


def test_conf_change_decode_skips_unknown_fields_and_rejects_garbage():
    base = ConfChange(ConfChangeType.ADD_LEARNER_NODE, 5).encode()
    unknown = (
        bytes.fromhex("2807")
        + bytes.fromhex("3a0178")
        + bytes.fromhex("4101020304050607 08".replace(" ", ""))
    )
    assert ConfChange.decode(base + unknown) == ConfChange(ConfChangeType.ADD_LEARNER_NODE, 5)
    for bad in (b"\x08", b"\x22\x05ab", b"\x10\x09", b"\x0b", bytes([0x80] * 11)):
        with pytest.raises(ConfChangeError):
            ConfChange.decode(bad)


def test_limit_size_keeps_at_least_one_entry():
    ents = [Entry(1, i, data=b"x" * 10) for i in range(1, 6)]
    one = ents[0].size_bytes()
    assert limit_size(ents, None) == ents
    assert limit_size(ents, 0) == ents[:1]
    assert limit_size(ents, one) == ents[:1]
    assert limit_size(ents, 2 * one) == ents[:2]
    assert limit_size(ents, 2 * one + 1) == ents[:2]
    assert limit_size(ents, 5 * one) == ents
