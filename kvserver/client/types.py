"""Typed results of client calls.

Every result that came from the key-value store carries the response ``header`` (cluster_id,
member_id, revision, raft_term) and exposes ``revision``: the store revision the answer
reflects (after the write, for writes). ``KeyValue`` and ``ResponseHeader`` are the store's own
types (``kvserver.kvpb.kv``, etcd's mvccpb/etcdserverpb in snake_case); keys and values are
``bytes``.

Headers of the responses nested in a txn carry only ``revision`` (as etcd sends them).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvserver.kvpb.kv import KeyValue, ResponseHeader

__all__ = [
    "CompactResult",
    "DeleteResult",
    "EndpointStatus",
    "KeyValue",
    "Lease",
    "LeaseList",
    "LeaseRevokeResult",
    "LeaseTimeToLive",
    "Member",
    "PutResult",
    "RangeResult",
    "ResponseHeader",
    "Status",
    "TxnResult",
]


@dataclass(frozen=True, slots=True)
class PutResult:
    header: ResponseHeader
    prev_kv: KeyValue | None = None  # only when asked for with prev_kv=True and the key existed

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class RangeResult:
    header: ResponseHeader
    kvs: tuple[KeyValue, ...] = ()
    more: bool = False  # true when ``limit`` cut the answer short
    count: int = 0  # number of keys in the range (not limited by ``limit``)

    @property
    def revision(self) -> int:
        return self.header.revision

    def first(self) -> KeyValue | None:
        return self.kvs[0] if self.kvs else None


@dataclass(frozen=True, slots=True)
class DeleteResult:
    header: ResponseHeader
    deleted: int = 0
    prev_kvs: tuple[KeyValue, ...] = ()  # only when asked for with prev_kv=True

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class TxnResult:
    header: ResponseHeader
    succeeded: bool = False  # the compares held: the ``then`` branch ran
    # One result per operation of the branch that ran, in order.
    responses: tuple[PutResult | RangeResult | DeleteResult | TxnResult, ...] = ()

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class CompactResult:
    header: ResponseHeader

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class Status:
    """One node's answer to ``/v3/maintenance/status``."""

    endpoint: str
    header: ResponseHeader
    version: str = ""
    db_size_bytes: int = 0
    db_size_in_use_bytes: int = 0
    leader: int = 0  # member id of the leader this node knows; 0 = none
    raft_index: int = 0
    raft_term: int = 0
    raft_applied_index: int = 0
    is_learner: bool = False
    errors: tuple[str, ...] = ()
    db_size_quota_bytes: int = 0  # etcd 3.6's dbSizeQuota (0: not reported)
    archive_lag_entries: int | None = None  # raftkv's own field: None = not archiving
    archive_lag_seconds: float | None = None

    @property
    def member_id(self) -> int:
        return self.header.member_id

    @property
    def revision(self) -> int:
        return self.header.revision

    @property
    def is_leader(self) -> bool:
        return self.leader != 0 and self.leader == self.header.member_id


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    """The status of one configured endpoint, or why it could not be had."""

    endpoint: str
    status: Status | None
    error: Exception | None  # a ClientError when status is None


@dataclass(frozen=True, slots=True)
class Member:
    id: int
    name: str
    peer_urls: tuple[str, ...] = ()
    client_urls: tuple[str, ...] = ()
    is_learner: bool = False


# Leases (``kvserver.client.leases``). IDs are int64 (etcd prints them in hex); TTLs are whole
# seconds. The header comes last so a lease reads ``Lease(id, ttl_s)``.


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lease: its ID and the TTL granted (the server may raise it to its minimum)."""

    id: int
    ttl_s: int
    header: ResponseHeader = ResponseHeader()

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class LeaseRevokeResult:
    header: ResponseHeader = ResponseHeader()

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class LeaseTimeToLive:
    """A lease's remaining TTL (whole seconds, truncated; -1 when the lease does not exist, as
    etcd answers), the TTL it was granted, and its keys (only when asked for)."""

    id: int
    ttl_s: int
    granted_ttl_s: int = 0
    keys: tuple[bytes, ...] = ()
    header: ResponseHeader = ResponseHeader()

    @property
    def expired(self) -> bool:
        """The lease does not exist (any more): never granted, revoked or expired."""
        return self.ttl_s < 0

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class LeaseList:
    """Every lease's ID (raftkv: soonest to expire first; etcd: in no particular order)."""

    ids: tuple[int, ...] = ()
    header: ResponseHeader = ResponseHeader()

    @property
    def revision(self) -> int:
        return self.header.revision
