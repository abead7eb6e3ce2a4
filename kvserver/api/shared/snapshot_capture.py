"""A consistent copy of a member's state for a snapshot stream, in raftkv's format or etcd's,
and the bound on how many such streams run at once.

``capture(service)`` takes the raised alarms, the auth state, the lease table, the MVCC view,
the applied index and the revision in one synchronous step on the event loop (where the raft
task applies entries), so they describe one applied index; the store's stream is then
produced a bounded chunk at a time. ``capture_etcd`` spills that image to a file and has a
child process convert it to etcd's bolt database (``kvserver.etcdsnap``), so the member's
loop never runs the conversion. Both dialects' Snapshot calls use these.

``SnapshotGate``: each stream holds a serialization of the whole store, and an etcd-format
one a child process too, so a member runs at most ``limit`` at once
(``--max-snapshot-streams``); a call past it is refused at once with RESOURCE_EXHAUSTED
(``refused`` counts them, ``raftkv_snapshot_streams_refused_total``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Generator
from typing import Any

from kvserver.etcdsnap.convert import ConvertError, image_to_bolt
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.lease.snapshot import frame_snapshot
from snap.spill import spill_chunks

log = logging.getLogger(__name__)

DEFAULT_MAX_SNAPSHOT_STREAMS = 2


class SnapshotGate:
    def __init__(self, limit: int = DEFAULT_MAX_SNAPSHOT_STREAMS):
        self.limit = limit
        self.running = 0
        self.refused = 0

    @contextlib.asynccontextmanager
    async def stream(self) -> AsyncIterator[None]:
        if self.running >= self.limit:
            self.refused += 1
            raise ServiceError(
                GrpcCode.RESOURCE_EXHAUSTED,
                f"raftkv: {self.limit} snapshot streams are running; try again later",
                retryable=True,
            )
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1


LINE_BLOB_BYTES = 256 * 1024  # blob bytes per response line (etcd sends 32 KiB)


def capture(service: Any) -> tuple[dict[str, Any], Generator[bytes, None, None]]:
    """(file header, generator of image chunks) of the member's state, taken now. Close the
    generator if it is not read to the end: the store's stream in it holds physical
    compaction off while it is open."""
    store = getattr(service, "store", None)
    lessor = getattr(service, "lessor", None)
    node = getattr(service, "node", None)
    if store is None or lessor is None or node is None:
        raise ServiceError(GrpcCode.UNIMPLEMENTED, "raftkv: this member cannot snapshot")
    # One synchronous step: nothing is applied between these lines (the raft task runs on
    # this same loop), so every number describes the same applied index.
    lease_blob = lessor.snapshot()
    auth = getattr(service, "auth", None)
    # Users, roles, permissions and the enabled flag (never tokens): the same frame a raft
    # snapshot carries, first, so a restored member starts with them (b"": auth never used).
    auth_frame = auth.snapshot_frame() if auth is not None else b""
    # The raised alarms, first (b"": none): a member restored from this file keeps refusing
    # writes until an operator has freed space and disarmed them, as the cluster did.
    alarms = getattr(service, "alarms", None)
    alarm_frame = alarms.snapshot_frame() if alarms is not None else b""
    stream = store.serialize(LINE_BLOB_BYTES)
    header = {
        "revision": store.revision,
        "compact_revision": store.compact_revision,
        "raft_index": node.applied,
        "raft_term": node.term,
        "cluster_id": f"{service.cluster_id:x}",
        "member_id": f"{service.member_id:x}",
        "keys": store.key_count,
        "created_unix": round(time.time(), 3),
    }

    def chunks():
        if alarm_frame:
            yield alarm_frame
        if auth_frame:
            yield auth_frame
        yield frame_snapshot(lease_blob)
        yield from stream

    return header, chunks()


async def capture_etcd(service: Any) -> tuple[dict[str, Any], memoryview]:
    """(file header, etcd's bolt database of the member's state, mapped read-only), taken now
    as ``capture`` takes it. The database has no SHA-256 trailer: the sender appends it."""
    file_header, image = capture(service)
    try:
        spilled = await spill_chunks(image)
    finally:
        image.close()  # the store's stream: while it is open the store cuts no old versions
    try:
        db, _ = await image_to_bolt(spilled, consistent_index=file_header["raft_index"])
    except ConvertError as exc:
        log.error("etcd snapshot: %s", exc)
        raise ServiceError(GrpcCode.INTERNAL, f"raftkv: snapshot failed: {exc}") from None
    return file_header, db


def bolt_pieces(db: memoryview, size: int) -> Generator[bytes, None, None]:
    """``db`` in pieces of ``size`` bytes, then its SHA-256 (the file etcd sends)."""
    digest = hashlib.sha256()
    for i in range(0, len(db), size):
        piece = bytes(db[i : i + size])
        digest.update(piece)
        yield piece
    yield digest.digest()
