"""etcd's Maintenance service over gRPC (``etcdserverpb.Maintenance``).

Each call: check the caller, one service call, convert. With auth enabled every method but
Status needs root (``etcdserver: permission denied`` otherwise), as the JSON gateway's
maintenance paths do; Status answers anyone who came through a client URL, token or not
(etcd's does not look at the token either).

- ``Status``: ``service.status()`` (``NodeStatus``) as etcd's StatusResponse: version (the
  etcd API version we speak), dbSize and dbSizeInUse (the same number: an in-memory store has
  no free pages), leader, raftIndex (committed), raftTerm, raftAppliedIndex, isLearner,
  dbSizeQuota, and errors: ``etcdserver: no leader`` while none is known, then each raised
  alarm as etcd prints it (``memberID:<id> alarm:NOSPACE ``).
- ``Alarm``: GET / ACTIVATE / DEACTIVATE through ``service.alarm`` (as the gateway's
  ``/v3/maintenance/alarm``): GET after a ReadIndex barrier, the others through the log.
- ``Defragment``: succeeds and changes nothing, which is the truth here: etcd's defrag
  rewrites its bolt file so that dbSize falls to dbSizeInUse, and in an in-memory store the two
  are always equal. What an operator sees: the call returns at once, DB SIZE in ``etcdctl
  endpoint status`` stays what it was, and so does the process's RSS. Memory is given back by
  compaction (the store's db size falls as compacted versions are cut), but Python keeps
  freed memory for reuse rather than returning it to the OS; restarting the member, after it
  took a snapshot past the compaction, is what lowers RSS (docs/operations.md, "Memory").
- ``HashKV``: ``service.hash_kv(revision)`` (``kvserver.mvcc.hashkv``: what is hashed; equal
  on members that applied the same log; not comparable with etcd's own hash values); the
  response carries ``compact_revision`` and ``hash_revision`` (the revision hashed).
- ``Hash``: etcd hashes its whole backend; here it is the HashKV hash at the current
  revision (the keyspace is the state members may disagree on; leases, auth and alarms are
  not in it).
- ``Snapshot`` (a stream): this member's state as etcd's snapshot file: its bolt database
  (``kvserver.etcdsnap``: keys with their whole retained history and the compact revision,
  leases, auth, alarms) followed by the SHA-256 of the database, as etcd sends it. The state
  is captured at once (``kvserver.api.http.maintenance.capture_etcd``: the image spilled to
  a file a chunk of the store per loop turn, then converted by a child process), and the
  file is sent from its mapping in messages of about ``BLOB_BYTES``; ``remaining_bytes`` is
  exact. ``etcdctl snapshot save FILE`` writes it, ``etcdctl snapshot status`` reads it and
  ``etcdctl snapshot restore`` makes an etcd data dir of it; ``raftkv snapshot restore FILE``
  starts a new raftkv cluster's member from it. (raftkv's own file, with its request
  de-duplication tables, is ``POST /v3/maintenance/snapshot`` with ``{"format": "raftkv"}``,
  what ``raftkv snapshot save`` asks for.) A failure after the stream started ends it with
  Internal, and the file a client has then lacks its hash.
- ``MoveLeader``: ``service.move_leader(targetID)``, leader only (``etcdserver: not leader``,
  FailedPrecondition; ``etcdserver: bad leader transferee`` for a non-voter); returns once
  the target leads.
- ``Downgrade``: Unimplemented (etcd 3.4 has none; raftkv has a single storage version).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc

from kvserver.api.shared import maintenance_ops as ops
from kvserver.api.shared.snapshot_capture import SnapshotGate, bolt_pieces, capture_etcd
from kvserver.etcdpb import rpc_pb2
from kvserver.kvpb.alarm import AlarmAction, AlarmRequest, AlarmResponse, AlarmType
from kvserver.kvpb.errors import EtcdError
from kvserver.kvpb.headers import ETCD_VERSION
from kvserver.kvpb.kv import ResponseHeader
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.server.service import NodeStatus

from . import convert
from .calls import Calls, service_handler
from .rpc import Method, RpcContext

log = logging.getLogger(__name__)

BLOB_BYTES = 256 * 1024  # snapshot bytes per message (etcd sends 32 KiB; fewer calls here)
HASH_BYTES = 32  # the SHA-256 after the database
MSG_NO_LEADER = "etcdserver: no leader"


def _enum(kind: Any, what: str, value: int) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise convert.bad_enum(what, value) from None


def status_to_pb(s: NodeStatus) -> rpc_pb2.StatusResponse:
    """etcd's StatusResponse from a ``NodeStatus``."""
    errors = ([MSG_NO_LEADER] if not s.leader else []) + list(s.errors)
    return rpc_pb2.StatusResponse(
        header=convert.header_to_pb(
            ResponseHeader(s.cluster_id, s.member_id, s.revision, s.raft_term)
        ),
        version=ETCD_VERSION,
        dbSize=s.db_size_bytes,
        leader=s.leader,
        raftIndex=s.raft_index,
        raftTerm=s.raft_term,
        raftAppliedIndex=s.raft_applied_index,
        errors=errors,
        dbSizeInUse=s.db_size_bytes,  # no free pages in an in-memory store
        isLearner=s.is_learner,
        dbSizeQuota=s.quota_backend_bytes,
    )


def alarm_from_pb(m: rpc_pb2.AlarmRequest) -> AlarmRequest:
    return AlarmRequest(
        _enum(AlarmAction, "alarm action", m.action),
        m.memberID,
        _enum(AlarmType, "alarm type", m.alarm),
    )


def alarm_to_pb(r: AlarmResponse) -> rpc_pb2.AlarmResponse:
    return rpc_pb2.AlarmResponse(
        header=convert.header_to_pb(r.header),
        alarms=[rpc_pb2.AlarmMember(memberID=a.member_id, alarm=a.alarm.name) for a in r.alarms],
    )


class MaintenanceServicer:
    def __init__(self, service: Any, calls: Calls, gate: SnapshotGate):
        self.service = service
        self.calls = calls
        self.gate = gate

    def _admin(self, context: RpcContext) -> None:
        """Root only, with auth enabled (etcd's ``isAuthenticated``: IsAdminPermitted)."""
        user = self.calls.user(context)
        auth = self.calls.auth
        if user is not None and auth is not None:
            auth.check_admin(user)

    def _header(self) -> rpc_pb2.ResponseHeader:
        return convert.header_to_pb(ops.header(self.service))

    async def _status(self, request: rpc_pb2.StatusRequest, context: RpcContext) -> Any:
        self.calls.caller(context)  # through a client URL; no user needed
        return status_to_pb(self.service.status())

    async def _alarm(self, request: rpc_pb2.AlarmRequest, context: RpcContext) -> Any:
        self._admin(context)
        return alarm_to_pb(await self.service.alarm(alarm_from_pb(request)))

    async def _defragment(self, request: rpc_pb2.DefragmentRequest, context: RpcContext) -> Any:
        self._admin(context)
        return rpc_pb2.DefragmentResponse(
            header=convert.header_to_pb(await ops.defragment(self.service))
        )

    async def _hash(self, request: rpc_pb2.HashRequest, context: RpcContext) -> Any:
        self._admin(context)
        r = await ops.hash_all(self.service)
        return rpc_pb2.HashResponse(header=convert.header_to_pb(r.header), hash=r.hash)

    async def _hash_kv(self, request: rpc_pb2.HashKVRequest, context: RpcContext) -> Any:
        self._admin(context)
        r = await self.service.hash_kv(request.revision)
        return rpc_pb2.HashKVResponse(
            header=convert.header_to_pb(r.header),
            hash=r.hash,
            compact_revision=r.compact_revision,
            hash_revision=r.hash_revision,
        )

    async def _move_leader(self, request: rpc_pb2.MoveLeaderRequest, context: RpcContext) -> Any:
        self._admin(context)
        header = await ops.move_leader(self.service, request.targetID)
        return rpc_pb2.MoveLeaderResponse(header=convert.header_to_pb(header))

    async def Downgrade(self, request: rpc_pb2.DowngradeRequest, context: RpcContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, ops.MSG_NO_DOWNGRADE)

    async def Snapshot(
        self, request: rpc_pb2.SnapshotRequest, context: RpcContext
    ) -> AsyncIterator[rpc_pb2.SnapshotResponse]:
        try:
            self._admin(context)
            async with self.gate.stream():
                file_header, db = await capture_etcd(self.service)
                messages = self._snapshot_messages(file_header, db)
                try:
                    async for message in messages:
                        yield message
                except Exception as exc:
                    log.exception("snapshot stream failed")
                    failure = ServiceError(GrpcCode.INTERNAL, f"raftkv: snapshot failed: {exc}")
                    await self.calls.abort(context, failure)
                finally:
                    await messages.aclose()
        except EtcdError as exc:
            await self.calls.abort(context, exc)

    async def _snapshot_messages(
        self, file_header: dict, db: memoryview
    ) -> AsyncGenerator[rpc_pb2.SnapshotResponse, None]:
        """The database in messages of ``BLOB_BYTES``, then its SHA-256 in the last one;
        every message says exactly how many bytes remain."""
        total = len(db) + HASH_BYTES
        header = convert.header_to_pb(
            ResponseHeader(
                self.service.cluster_id,
                self.service.member_id,
                file_header["revision"],
                file_header["raft_term"],
            )
        )
        sent = 0
        for piece in bolt_pieces(db, BLOB_BYTES):
            sent += len(piece)
            yield rpc_pb2.SnapshotResponse(header=header, remaining_bytes=total - sent, blob=piece)
            await asyncio.sleep(0)

    def methods(self) -> dict[str, Method]:
        u = self.calls.unary
        return service_handler(
            "etcdserverpb.Maintenance",
            {
                "Alarm": (u(self._alarm), rpc_pb2.AlarmRequest),
                "Status": (u(self._status), rpc_pb2.StatusRequest),
                "Defragment": (u(self._defragment), rpc_pb2.DefragmentRequest),
                "Hash": (u(self._hash), rpc_pb2.HashRequest),
                "HashKV": (u(self._hash_kv), rpc_pb2.HashKVRequest),
                "Snapshot": (self.Snapshot, rpc_pb2.SnapshotRequest, "unary_stream"),
                "MoveLeader": (u(self._move_leader), rpc_pb2.MoveLeaderRequest),
                "Downgrade": (self.Downgrade, rpc_pb2.DowngradeRequest),
            },
        )
