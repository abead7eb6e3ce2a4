"""The space quota (etcd's ``--quota-backend-bytes``, ``server/etcdserver/quota.go``) and the
writes a raised alarm refuses at apply (etcd's ``applierV3Capped`` and ``applierV3Corrupt``).

What the bytes measure: ``MVCCStore.db_size_bytes``, the encoded size of every stored record
(key, value and a fixed per-record overhead), live keys, tombstones and uncompacted history
alike. It grows with every write and shrinks only when a compaction drops history. It is not
the process's memory (see docs/operations.md).

Quota check (before a request is proposed, on the member the client asked):
``over_quota(db_size, cost, quota)`` with ``request_cost(request)`` etcd's estimate: a put
costs ``KV_OVERHEAD_BYTES + len(key) + len(value)``, a txn the larger of its success and
failure branches' put costs (puts in nested txns count too; etcd 3.4 counts only the top
level), a lease grant ``LEASE_OVERHEAD_BYTES``; anything else costs 0 and always passes.
A request passes while ``db_size + cost < quota``.

Capped apply: ``refusal(alarms, request)`` is the error the state machine answers instead of
applying a logged request, on every member alike: with a ``CORRUPT`` alarm raised, every
write (put, delete, txn with a write, compaction, lease grant, lease revoke); else with a
``NOSPACE`` alarm raised, a put, a txn whose cost is not 0, a lease grant. Reads, deletes,
txns without puts, compactions, lease revokes and checkpoints still apply under NOSPACE: they
are how an operator frees space.
"""

from __future__ import annotations

from typing import Any

from kvserver.kvpb.alarm import AlarmType, CorruptError, NoSpaceError
from kvserver.kvpb.errors import EtcdError
from kvserver.kvpb.kv import (
    CompactionRequest,
    DeleteRangeRequest,
    PutRequest,
    RequestOp,
    TxnRequest,
)
from kvserver.kvpb.lease import LeaseGrantRequest, LeaseRevokeRequest
from kvserver.server.alarms import AlarmStore

DEFAULT_QUOTA_BACKEND_BYTES = 2 * 1024 * 1024 * 1024  # etcd's DefaultQuotaBytes (2 GiB)
KV_OVERHEAD_BYTES = 256  # etcd's kvOverhead: a key's metadata
LEASE_OVERHEAD_BYTES = 64  # etcd's leaseOverhead

__all__ = [
    "DEFAULT_QUOTA_BACKEND_BYTES",
    "effective_quota",
    "over_quota",
    "refusal",
    "request_cost",
]


def effective_quota(flag_bytes: int) -> int:
    """The quota a ``--quota-backend-bytes`` value means: 0 is etcd's default, 2 GiB."""
    return flag_bytes if flag_bytes > 0 else DEFAULT_QUOTA_BACKEND_BYTES


def _op_cost(op: RequestOp) -> int:
    if op.request_put is not None:
        return KV_OVERHEAD_BYTES + len(op.request_put.key) + len(op.request_put.value)
    if op.request_txn is not None:
        return request_cost(op.request_txn)
    return 0


def request_cost(request: Any) -> int:
    """etcd's estimate of the bytes a request adds (0: it adds nothing to refuse)."""
    kind = type(request)
    if kind is PutRequest:
        return KV_OVERHEAD_BYTES + len(request.key) + len(request.value)
    if kind is TxnRequest:
        return max(sum(map(_op_cost, request.success)), sum(map(_op_cost, request.failure)))
    if kind is LeaseGrantRequest:
        return LEASE_OVERHEAD_BYTES
    return 0


def over_quota(db_size_bytes: int, cost: int, quota_bytes: int) -> bool:
    """Whether a request of ``cost`` must be refused (a cost of 0 always passes)."""
    return cost > 0 and db_size_bytes + cost >= quota_bytes


def _writes(request: Any) -> bool:
    kind = type(request)
    if kind is TxnRequest:
        return any(
            op.request_put is not None
            or op.request_delete_range is not None
            or (op.request_txn is not None and _writes(op.request_txn))
            for op in (*request.success, *request.failure)
        )
    return kind in (
        PutRequest,
        DeleteRangeRequest,
        CompactionRequest,
        LeaseGrantRequest,
        LeaseRevokeRequest,
    )


def refusal(alarms: AlarmStore, request: Any) -> EtcdError | None:
    """The error a logged ``request`` is answered instead of being applied, or ``None``."""
    if not len(alarms):
        return None
    if alarms.is_active(AlarmType.CORRUPT) and _writes(request):
        return CorruptError()
    if alarms.is_active(AlarmType.NOSPACE) and request_cost(request) > 0:
        return NoSpaceError()
    return None
