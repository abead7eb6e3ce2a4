"""Bounds checks on peer messages (kvserver.rafthttp.validate).

Two sides of one contract: every message the raft core sends in a simulated cluster under
faults, membership changes and snapshots passes the checks (so they never refuse a correct
member), and each kind of impossible message a forged frame used, or could use, is refused.
"""

import dataclasses

import pytest

from kvserver.rafthttp.codec import decode_batch, encode_batch
from kvserver.rafthttp.validate import (
    MAX_ENTRIES_PER_MESSAGE,
    MAX_TERM,
    PeerValidationError,
    check_message,
)
from raft import ConfState, Entry, Message, MessageType, Snapshot, SnapshotMetadata
from tests.sim import cluster as sim_cluster
from tests.sim.runner import run_seed

LOCAL, PEER, OTHER = 1, 2, 3


def check(m: Message, sender: int = PEER) -> None:
    check_message(m, local_id=LOCAL, sender=sender, is_member=lambda i: i in (LOCAL, PEER, OTHER))


def test_every_message_of_simulated_clusters_passes(monkeypatch):
    """Seeds of both sizes, with crashes, partitions, snapshots and membership changes: the
    checks must accept every message a correct raft member sends (after a codec round trip)."""
    seen: dict[MessageType, int] = {}
    refused: list[str] = []
    deliver = sim_cluster.Cluster._deliver

    def checked(self, m, sender_inc, report):
        (wire,) = decode_batch(encode_batch([m]))
        try:
            # Forwarded requests keep their origin's id; any member may relay them.
            check_message(wire, local_id=m.to, sender=m.frm, is_member=lambda i: i > 0)
        except PeerValidationError as exc:
            refused.append(str(exc))
        seen[m.type] = seen.get(m.type, 0) + 1
        return deliver(self, m, sender_inc, report)

    monkeypatch.setattr(sim_cluster.Cluster, "_deliver", checked)
    results = [run_seed(seed) for seed in range(40)]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert not refused, refused[:5]
    # the run must have exercised the interesting types, or passing means little
    for t in (
        MessageType.MsgApp,
        MessageType.MsgAppResp,
        MessageType.MsgHeartbeat,
        MessageType.MsgPreVote,
        MessageType.MsgVote,
        MessageType.MsgSnap,
        MessageType.MsgProp,
        MessageType.MsgReadIndex,
        MessageType.MsgReadIndexResp,
    ):
        assert seen.get(t, 0) > 0, (t, seen)


def app(**kw) -> Message:
    base = dict(
        type=MessageType.MsgApp,
        to=LOCAL,
        frm=PEER,
        term=5,
        log_term=4,
        index=10,
        commit=10,
        entries=(Entry(5, 11, data=b"x"), Entry(5, 12, data=b"y")),
    )
    return Message(**{**base, **kw})


def test_a_legitimate_append_and_heartbeat_pass():
    check(app())
    check(Message(type=MessageType.MsgHeartbeat, to=LOCAL, frm=PEER, term=5, commit=9))
    check(Message(type=MessageType.MsgProp, to=LOCAL, frm=OTHER, entries=(Entry(0, 0, data=b"p"),)))


SNAP = Snapshot(b"", SnapshotMetadata(ConfState(voters=(1, 2, 3)), index=20, term=4))

BAD = [
    (Message(type=MessageType.MsgHeartbeat, to=LOCAL, frm=PEER, term=(1 << 64) - 1), "above"),
    (Message(type=MessageType.MsgHeartbeat, to=LOCAL, frm=PEER, term=MAX_TERM + 1), "above"),
    (
        Message(type=MessageType.MsgHeartbeat, to=LOCAL, frm=PEER, term=3, commit=(1 << 64) - 1),
        "above",
    ),
    (Message(type=MessageType.MsgHeartbeat, to=LOCAL, frm=OTHER, term=3), "sender"),
    (Message(type=MessageType.MsgHeartbeat, to=OTHER, frm=PEER, term=3), "addressed"),
    (Message(type=MessageType.MsgHeartbeat, to=LOCAL, frm=PEER, term=0), "term 0"),
    (Message(type=MessageType.MsgHup, to=LOCAL, frm=PEER, term=3), "local-only"),
    (Message(type=MessageType.MsgCheckQuorum, to=LOCAL, frm=PEER, term=3), "local-only"),
    (
        Message(type=MessageType.MsgHeartbeat, to=LOCAL, frm=PEER, term=3, entries=(Entry(3, 1),)),
        "no entries",
    ),
    (
        Message(type=MessageType.MsgProp, to=LOCAL, frm=9, entries=(Entry(0, 0, data=b"p"),)),
        "not in the cluster",
    ),
    (
        Message(type=MessageType.MsgProp, to=LOCAL, frm=PEER, term=7, entries=(Entry(0, 0),)),
        "no term",
    ),
    (Message(type=MessageType.MsgProp, to=LOCAL, frm=PEER), "without entries"),
    (Message(type=MessageType.MsgProp, to=LOCAL, frm=PEER, entries=(Entry(3, 8),)), "assigns"),
    (Message(type=MessageType.MsgReadIndex, to=LOCAL, frm=PEER, entries=()), "exactly one"),
    (app(entries=(Entry(5, 12),)), "consecutive"),
    (app(entries=(Entry(5, 11), Entry(5, 13))), "consecutive"),
    (app(entries=(Entry(6, 11),)), "want 4..5"),
    (app(entries=(Entry(3, 11),)), "want 4..5"),
    (app(entries=(Entry(5, 11), Entry(4, 12))), "want 5..5"),
    (app(log_term=6), "previous entry"),
    (app(index=MAX_TERM, entries=(Entry(5, MAX_TERM + 1),)), "above"),
    (app(entries=tuple(Entry(5, 11 + i) for i in range(MAX_ENTRIES_PER_MESSAGE + 1))), "more than"),
    (
        Message(type=MessageType.MsgVote, to=LOCAL, frm=PEER, term=3, log_term=4, index=9),
        "campaign",
    ),
    (Message(type=MessageType.MsgSnap, to=LOCAL, frm=PEER, term=5), "snapshot"),
    (Message(type=MessageType.MsgApp, to=LOCAL, frm=PEER, term=5, snapshot=SNAP), "snapshot"),
    (Message(type=MessageType.MsgSnap, to=LOCAL, frm=PEER, term=3, snapshot=SNAP), "snapshot term"),
    (
        Message(
            type=MessageType.MsgSnap,
            to=LOCAL,
            frm=PEER,
            term=5,
            snapshot=dataclasses.replace(
                SNAP, metadata=dataclasses.replace(SNAP.metadata, conf_state=ConfState((0, 2)))
            ),
        ),
        "id 0",
    ),
]


@pytest.mark.parametrize(("m", "why"), BAD, ids=[f"{i}-{w}" for i, (_, w) in enumerate(BAD)])
def test_impossible_messages_are_refused(m, why):
    with pytest.raises(PeerValidationError, match=why):
        check(m)


@pytest.mark.parametrize(
    "value",
    [
        [0] * (MAX_ENTRIES_PER_MESSAGE + 1),  # more messages in a batch than any sender makes
        [{b"k": b"v"}],  # the format has no maps
        [["text"]],  # nor strings
    ],
)
def test_decoding_is_bounded_before_objects_are_built(value):
    import msgpack

    from kvserver.rafthttp.codec import PeerMessageError

    with pytest.raises(PeerMessageError, match="exceeds max_"):  # msgpack's own limits
        decode_batch(msgpack.packb(value, use_bin_type=True))
