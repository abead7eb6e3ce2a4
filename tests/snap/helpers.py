"""Shared builders for the snap tests."""

import raftpb

_DEFAULT = object()


def make_snapshot(
    index: int, term: int = 1, data=_DEFAULT, voters: tuple[int, ...] = (1, 2, 3)
) -> raftpb.Snapshot:
    """A snapshot at (index, term); ``data`` defaults to a text naming them (None is kept)."""
    if data is _DEFAULT:
        data = f"state as of {term}/{index}".encode()
    return raftpb.Snapshot(
        data=data,
        metadata=raftpb.SnapshotMetadata(
            conf_state=raftpb.ConfState(voters=voters), index=index, term=term
        ),
    )


def reference_file_bytes(snapshot: raftpb.Snapshot) -> bytes:
    """What etcd's SaveSnap writes: snappb{crc32c(b), b} with b = the marshalled snapshot."""
    inner = raftpb.encode_snapshot(snapshot)
    return raftpb.encode_snap_file(raftpb.crc32c(inner), inner)


def crc32c_bitwise(data: bytes) -> int:
    """CRC-32C by the textbook bit-at-a-time algorithm (reflected polynomial 0x82F63B78), an
    oracle independent of crcmod."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
