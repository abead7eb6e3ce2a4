"""A snapshot sent to a peer arrives whole, with its data mapped from a spill file instead of
held in the heap; a snapshot over the receiver's limit is refused and leaves no file."""

import mmap
import os

from kvserver.localcluster.launcher import free_ports
from kvserver.rafthttp.transport import PeerTransport, TransportLimits
from raft import ConfState, Message, MessageType, Snapshot, SnapshotMetadata
from tests.support.peer_port import serve_peer_port
from tests.support.wait import async_wait_for

CLUSTER = 0xC1
A, B = 0xA, 0xB


def _transport(local_id, on_messages, on_status, spill_dir, limits=None) -> PeerTransport:
    return PeerTransport(
        local_id=local_id,
        cluster_id=CLUSTER,
        on_messages=on_messages,
        on_unreachable=lambda peer: None,
        on_snapshot_status=on_status,
        limits=limits,
        spill_dir=spill_dir,
    )


def _snapshot_message(data: bytes) -> Message:
    metadata = SnapshotMetadata(conf_state=ConfState(voters=(A, B)), index=42, term=3)
    return Message(type=MessageType.MsgSnap, to=B, frm=A, term=3, snapshot=Snapshot(data, metadata))


async def _send(tmp_path, data: bytes, limits=None):
    """Send one snapshot from A to B; (what B received, the statuses A got, B's spill dir)."""
    port_a, port_b = free_ports(2)
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    received: list[Message] = []
    statuses: list[tuple[int, bool]] = []
    a = _transport(A, lambda msgs: None, lambda peer, failed: statuses.append((peer, failed)), None)
    b = _transport(B, received.extend, lambda peer, failed: None, str(spill_dir), limits)
    runner = None
    try:
        await a.start()
        await b.start()
        runner = await serve_peer_port(b, port_b)
        b.add_peer(A, f"http://127.0.0.1:{port_a}")  # B takes snapshots only from members
        a.add_peer(B, f"http://127.0.0.1:{port_b}")
        a.send([_snapshot_message(data)])
        await async_wait_for(lambda: statuses, 30.0, "the snapshot's status at the sender")
    finally:
        await a.stop()
        await b.stop()
        if runner is not None:
            await runner.cleanup()
    return received, statuses, spill_dir


async def test_a_received_snapshot_is_mapped_from_a_spill_file(tmp_path):
    data = os.urandom(9 << 20)  # more than two of the receiver's batches
    received, statuses, spill_dir = await _send(tmp_path, data)
    assert statuses == [(B, False)]
    [m] = received
    assert m.type == MessageType.MsgSnap and m.snapshot is not None
    assert m.snapshot.metadata.index == 42
    got = m.snapshot.data
    assert isinstance(got, memoryview) and isinstance(got.obj, mmap.mmap)
    assert got == data
    assert os.listdir(spill_dir) == []  # anonymous file: nothing to remove


async def test_a_snapshot_over_the_limit_is_refused_and_leaves_nothing(tmp_path, caplog):
    limits = TransportLimits(snapshot_bytes=1 << 20)
    received, statuses, spill_dir = await _send(tmp_path, os.urandom(3 << 20), limits)
    assert statuses == [(B, True)]
    assert "snapshot to b refused: 413" in caplog.text
    assert received == []
    assert os.listdir(spill_dir) == []
