"""Request, response and data types of the MVCC store, mirroring etcd's protobufs.

Field names are those of etcd's ``etcdserverpb`` / ``mvccpb`` messages in snake_case, so the
HTTP layer maps etcd's gateway JSON onto these 1:1 (bytes fields are raw ``bytes`` here, base64
on the wire; 64-bit integers are Python ints here, strings on the wire). Defaults are the
protobuf defaults, so an absent JSON field is simply a missing keyword argument.

Sequences in requests and responses are tuples. A ``oneof`` (``RequestOp.request``,
``ResponseOp.response``) is a set of optional fields of which exactly one is not ``None``.

Key ranges follow etcd: ``range_end == b""`` means the single key ``key``; ``range_end ==
b"\\0"`` means every key ``>= key``; otherwise the half-open interval ``[key, range_end)``.
``prefix_range_end(p)`` gives the ``range_end`` that selects every key starting with ``p``.

A ``KeyValue`` with ``create_revision == 0`` is a tombstone: it is what a DELETE event carries
(``key`` and ``mod_revision`` = the deleting revision, everything else zero), as in etcd.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from kvserver.kvpb.errors import EtcdError

# ---------------------------------------------------------------------------------------------
# Enums (values are etcd's protobuf enum numbers)


class SortOrder(IntEnum):
    NONE = 0
    ASCEND = 1
    DESCEND = 2


class SortTarget(IntEnum):
    KEY = 0
    VERSION = 1
    CREATE = 2
    MOD = 3
    VALUE = 4


class CompareResult(IntEnum):
    EQUAL = 0
    GREATER = 1
    LESS = 2
    NOT_EQUAL = 3


class CompareTarget(IntEnum):
    VERSION = 0
    CREATE = 1
    MOD = 2
    VALUE = 3
    LEASE = 4


class EventType(IntEnum):
    PUT = 0
    DELETE = 1


# ---------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One version of a key (mvccpb.KeyValue). Immutable and shared: never copy it."""

    key: bytes
    value: bytes = b""
    create_revision: int = 0  # invariant: 0 only for a tombstone
    mod_revision: int = 0  # invariant: create_revision <= mod_revision
    version: int = 0  # 1 for the put that created the key, +1 per later put; reset by delete
    lease: int = 0  # 0 = no lease


@dataclass(frozen=True, slots=True)
class Event:
    """A change (mvccpb.Event). ``prev_kv`` is the key's value at ``kv.mod_revision - 1``."""

    type: EventType
    kv: KeyValue
    prev_kv: KeyValue | None = None


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    """etcdserverpb.ResponseHeader. The store fills ``revision``; the node fills the rest."""

    cluster_id: int = 0
    member_id: int = 0
    revision: int = 0
    raft_term: int = 0


# ---------------------------------------------------------------------------------------------
# Requests


@dataclass(frozen=True, slots=True)
class RangeRequest:
    key: bytes
    range_end: bytes = b""
    limit: int = 0  # <= 0: no limit
    revision: int = 0  # <= 0: the current revision
    sort_order: SortOrder = SortOrder.NONE
    sort_target: SortTarget = SortTarget.KEY
    serializable: bool = False  # a hint for the node; the store ignores it
    keys_only: bool = False
    count_only: bool = False
    min_mod_revision: int = 0
    max_mod_revision: int = 0
    min_create_revision: int = 0
    max_create_revision: int = 0


@dataclass(frozen=True, slots=True)
class PutRequest:
    key: bytes
    value: bytes = b""
    lease: int = 0
    prev_kv: bool = False
    ignore_value: bool = False
    ignore_lease: bool = False


@dataclass(frozen=True, slots=True)
class DeleteRangeRequest:
    key: bytes
    range_end: bytes = b""
    prev_kv: bool = False


@dataclass(frozen=True, slots=True)
class Compare:
    """One txn condition. Only the target field named by ``target`` is used (etcd's oneof
    ``target_union``); the others keep their zero defaults, which is also what etcd compares
    against when the union holds a different member."""

    result: CompareResult
    target: CompareTarget
    key: bytes
    version: int = 0
    create_revision: int = 0
    mod_revision: int = 0
    value: bytes = b""
    lease: int = 0
    range_end: bytes = b""


@dataclass(frozen=True, slots=True)
class RequestOp:
    """etcdserverpb.RequestOp: exactly one field is set."""

    request_range: RangeRequest | None = None
    request_put: PutRequest | None = None
    request_delete_range: DeleteRangeRequest | None = None
    request_txn: TxnRequest | None = None

    @staticmethod
    def of(request: RangeRequest | PutRequest | DeleteRangeRequest | TxnRequest) -> RequestOp:
        """Wrap a request in the matching oneof field."""
        kind = type(request)
        if kind is PutRequest:
            return RequestOp(request_put=request)  # type: ignore[arg-type]
        if kind is RangeRequest:
            return RequestOp(request_range=request)  # type: ignore[arg-type]
        if kind is DeleteRangeRequest:
            return RequestOp(request_delete_range=request)  # type: ignore[arg-type]
        if kind is TxnRequest:
            return RequestOp(request_txn=request)  # type: ignore[arg-type]
        raise TypeError(f"not a txn operation: {kind.__name__}")


@dataclass(frozen=True, slots=True)
class TxnRequest:
    compare: tuple[Compare, ...] = ()
    success: tuple[RequestOp, ...] = ()
    failure: tuple[RequestOp, ...] = ()


@dataclass(frozen=True, slots=True)
class CompactionRequest:
    revision: int
    physical: bool = False  # accepted for compatibility; compaction here is always immediate


# ---------------------------------------------------------------------------------------------
# Responses


@dataclass(frozen=True, slots=True)
class RangeResponse:
    header: ResponseHeader
    kvs: tuple[KeyValue, ...] = ()
    more: bool = False
    count: int = 0

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class PutResponse:
    header: ResponseHeader
    prev_kv: KeyValue | None = None

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class DeleteRangeResponse:
    header: ResponseHeader
    deleted: int = 0
    prev_kvs: tuple[KeyValue, ...] = ()

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class ResponseOp:
    """etcdserverpb.ResponseOp: exactly one field is set."""

    response_range: RangeResponse | None = None
    response_put: PutResponse | None = None
    response_delete_range: DeleteRangeResponse | None = None
    response_txn: TxnResponse | None = None


@dataclass(frozen=True, slots=True)
class TxnResponse:
    header: ResponseHeader
    succeeded: bool = False
    responses: tuple[ResponseOp, ...] = ()

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class CompactionResponse:
    header: ResponseHeader

    @property
    def revision(self) -> int:
        return self.header.revision


Request = RangeRequest | PutRequest | DeleteRangeRequest | TxnRequest | CompactionRequest
Response = RangeResponse | PutResponse | DeleteRangeResponse | TxnResponse | CompactionResponse
WRITE_REQUEST_TYPES = (PutRequest, DeleteRangeRequest, TxnRequest, CompactionRequest)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What ``MVCCStore.apply`` returns for one committed entry.

    Exactly one of ``response`` / ``error`` is set. ``events`` are the changes the entry made,
    in revision order (empty for reads, failures and duplicates). ``duplicate`` is true when the
    (client_id, request_id) pair was seen before: nothing was applied and ``response`` /
    ``error`` is the remembered outcome of the first application. ``revision`` is the store's
    revision after the entry.
    """

    response: Response | None
    error: EtcdError | None
    events: tuple[Event, ...]
    duplicate: bool
    revision: int


# ---------------------------------------------------------------------------------------------
# Key-range helpers


def prefix_range_end(prefix: bytes) -> bytes:
    """The ``range_end`` selecting every key that starts with ``prefix`` (etcd's
    ``clientv3.GetPrefixRangeEnd``): the prefix with its last byte below 0xff incremented and
    the rest dropped; ``b"\\0"`` (all keys ``>= prefix``) when no such byte exists (an empty
    or all-0xff prefix)."""
    for i in range(len(prefix) - 1, -1, -1):
        b = prefix[i]
        if b < 0xFF:
            return prefix[:i] + bytes((b + 1,))
    return b"\0"


def key_in_range(k: bytes, key: bytes, range_end: bytes) -> bool:
    """Whether ``k`` is selected by (``key``, ``range_end``) with etcd's range conventions."""
    if not range_end:
        return k == key
    if range_end == b"\0":
        return k >= key
    return key <= k < range_end
