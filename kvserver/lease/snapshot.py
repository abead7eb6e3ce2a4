"""The lease snapshot: the lessor's replicated tables as bytes, and the frame that carries them
in front of the MVCC snapshot stream.

Byte layout
-----------
``encode_snapshot(leases, dedup)`` is one msgpack map ``{"magic": "raftkv-lease-snapshot",
"version": 2, "leases": [[id, ttl_s, remaining_ttl_s], ...], "dedup": [[client_id,
[[request_id, outcome], ...]], ...]}``; leases sorted by id (the caller sorts), the dedup
table in least-recently-used-first order (``DedupTable.export``), outcomes as in
``kvserver.lease.outcomes``. Equal tables give equal bytes. ``decode_snapshot`` also reads
version 1 (written before de-duplication: the same map without ``"dedup"``) and answers
``None`` for its dedup table. It raises ``SnapshotFormatError`` on anything else.

``frame_snapshot(blob)`` prefixes ``b"RKVLEAS1"`` and the blob's length (uint32 big-endian);
``split_snapshot(data)`` returns ``(blob or None, rest)``, where ``None`` means a snapshot from
before leases existed (all of ``data`` is the MVCC stream).
"""

from __future__ import annotations

from typing import Any

import msgpack

from kvserver.kvpb.errors import SnapshotFormatError
from kvserver.kvpb.lease import MAX_LEASE_TTL_S
from kvserver.lease.outcomes import dedup_from_plain, dedup_to_plain

__all__ = [
    "SNAPSHOT_FRAME_MAGIC",
    "decode_snapshot",
    "encode_snapshot",
    "frame_snapshot",
    "split_snapshot",
]

SNAPSHOT_MAGIC = "raftkv-lease-snapshot"
SNAPSHOT_VERSION = 2
_READABLE_SNAPSHOT_VERSIONS = (1, 2)  # 1: before de-duplication (no "dedup" table)
SNAPSHOT_FRAME_MAGIC = b"RKVLEAS1"
_FRAME_HEADER_BYTES = len(SNAPSHOT_FRAME_MAGIC) + 4

# A DedupTable.export(): [(client_id, [(request_id, outcome), ...]), ...]
DedupExport = list[tuple[int, list[tuple[int, Any]]]]


def encode_snapshot(leases: list[tuple[int, int, int]], dedup: DedupExport) -> bytes:
    """``leases`` as ``(id, ttl_s, remaining_ttl_s)`` sorted by id, ``dedup`` an export."""
    return msgpack.packb(
        {
            "magic": SNAPSHOT_MAGIC,
            "version": SNAPSHOT_VERSION,
            "leases": [list(row) for row in leases],
            "dedup": dedup_to_plain(dedup),
        },
        use_bin_type=True,
    )


def decode_snapshot(data: bytes) -> tuple[list[tuple[int, int, int]], DedupExport | None]:
    """``(leases, dedup export)`` of an ``encode_snapshot`` blob (dedup ``None`` for version 1).
    Every lease has a non-zero unique id, ``1 <= ttl_s <= MAX_LEASE_TTL_S`` and a remaining
    TTL ``>= 0``."""
    try:
        obj = msgpack.unpackb(data, raw=False)
    except Exception as err:  # msgpack raises several types for garbage
        raise SnapshotFormatError(f"lease snapshot is not msgpack: {err}") from err
    if (
        type(obj) is not dict
        or obj.get("magic") != SNAPSHOT_MAGIC
        or obj.get("version") not in _READABLE_SNAPSHOT_VERSIONS
        or type(obj.get("leases")) is not list
    ):
        raise SnapshotFormatError("not a raftkv lease snapshot (or unknown version)")
    leases: list[tuple[int, int, int]] = []
    seen: set[int] = set()
    for row in obj["leases"]:
        if (
            type(row) is not list
            or len(row) != 3
            or any(type(v) is not int for v in row)
            or row[0] == 0
            or row[0] in seen
            or not 1 <= row[1] <= MAX_LEASE_TTL_S
            or row[2] < 0
        ):
            raise SnapshotFormatError(f"malformed lease record {row!r}")
        seen.add(row[0])
        leases.append((row[0], row[1], row[2]))
    dedup = dedup_from_plain(obj.get("dedup")) if obj["version"] >= 2 else None
    return leases, dedup


def frame_snapshot(blob: bytes) -> bytes:
    """``SNAPSHOT_FRAME_MAGIC | len(blob) (uint32 big-endian) | blob``."""
    if len(blob) >= 1 << 32:
        raise ValueError("lease snapshot too large to frame")
    return SNAPSHOT_FRAME_MAGIC + len(blob).to_bytes(4, "big") + blob


def split_snapshot(data: bytes | memoryview) -> tuple[bytes | None, memoryview]:
    """``(lease blob, rest)`` of a framed snapshot, or ``(None, data)`` when ``data`` has no
    lease frame (an MVCC stream starts with a msgpack map, never with the frame magic).
    ``rest`` is a view, not a copy. Raises ``SnapshotFormatError`` on a truncated frame."""
    view = memoryview(data)
    if view[: len(SNAPSHOT_FRAME_MAGIC)] != SNAPSHOT_FRAME_MAGIC:
        return None, view
    if len(view) < _FRAME_HEADER_BYTES:
        raise SnapshotFormatError("truncated lease snapshot frame")
    n = int.from_bytes(view[len(SNAPSHOT_FRAME_MAGIC) : _FRAME_HEADER_BYTES], "big")
    end = _FRAME_HEADER_BYTES + n
    if len(view) < end:
        raise SnapshotFormatError("truncated lease snapshot frame")
    return bytes(view[_FRAME_HEADER_BYTES:end]), view[end:]
