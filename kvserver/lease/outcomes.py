"""Remembered outcomes of de-duplicated grants and revokes, as plain msgpack values.

The lessor remembers the outcome of the first applied grant or revoke of each ``(client_id,
request_id)`` pair (``kvserver.mvcc.dedup.DedupTable``) and answers a retry with it. The table
travels in the lease snapshot, so every outcome has a plain form:

- ``[1, revision, lease_id, ttl_s]``      a ``LeaseGrantResponse``
- ``[2, revision]``                       a ``LeaseRevokeResponse``
- ``[0, error_tag, message]``             an error, ``error_tag`` one of ``lease_not_found``,
  ``lease_exists``, ``ttl_too_large``, ``too_many_leases``, ``invalid_argument``

Headers other than the revision are filled in by the caller, so they are not kept. Never
rename a tag. ``dedup_to_plain`` / ``dedup_from_plain`` convert a whole ``DedupTable.export()``
(``[[client_id, [[request_id, outcome], ...]], ...]``); the reader raises
``SnapshotFormatError`` on anything malformed.
"""

from __future__ import annotations

from typing import Any

from kvserver.kvpb.errors import (
    EtcdError,
    InvalidArgumentError,
    LeaseNotFoundError,
    SnapshotFormatError,
)
from kvserver.kvpb.kv import ResponseHeader
from kvserver.kvpb.lease import (
    LeaseGrantRequest,
    LeaseGrantResponse,
    LeaseRevokeRequest,
    LeaseRevokeResponse,
)
from kvserver.lease.codec import is_int64
from kvserver.lease.errors import LeaseExistsError, LeaseTTLTooLargeError, TooManyLeasesError

__all__ = ["RESPONSE_TYPE", "dedup_from_plain", "dedup_to_plain"]

# The response a de-duplicated request remembers (a pair reused by the other kind is refused).
RESPONSE_TYPE: dict[type, type] = {
    LeaseGrantRequest: LeaseGrantResponse,
    LeaseRevokeRequest: LeaseRevokeResponse,
}
_OUTCOME_ERROR = 0
_OUTCOME_GRANT = 1
_OUTCOME_REVOKE = 2
# The errors a grant or revoke can end in, by snapshot tag. Never rename a tag.
_ERROR_BY_TAG: dict[str, type[EtcdError]] = {
    "lease_not_found": LeaseNotFoundError,
    "lease_exists": LeaseExistsError,
    "ttl_too_large": LeaseTTLTooLargeError,
    "too_many_leases": TooManyLeasesError,
    "invalid_argument": InvalidArgumentError,
}
_TAG_BY_ERROR = {cls: tag for tag, cls in _ERROR_BY_TAG.items()}


def _outcome_to_plain(outcome: Any) -> list:
    kind = type(outcome)
    if kind is LeaseGrantResponse:
        return [_OUTCOME_GRANT, outcome.header.revision, outcome.lease_id, outcome.ttl_s]
    if kind is LeaseRevokeResponse:
        return [_OUTCOME_REVOKE, outcome.header.revision]
    # An error: its own tag, else its nearest tagged base class (apply raises only tagged
    # types today; a subclass keeps its base's gRPC code and its message).
    for cls in kind.__mro__:
        tag = _TAG_BY_ERROR.get(cls)
        if tag is not None:
            return [_OUTCOME_ERROR, tag, outcome.message]
    raise TypeError(f"not a lease outcome: {kind.__name__}")  # a bug: apply remembers no such


def _outcome_from_plain(v: Any) -> Any:
    if type(v) is list and v:
        op = v[0]
        if op == _OUTCOME_GRANT and len(v) == 4 and all(map(is_int64, v[1:])):
            return LeaseGrantResponse(ResponseHeader(revision=v[1]), v[2], v[3])
        if op == _OUTCOME_REVOKE and len(v) == 2 and is_int64(v[1]):
            return LeaseRevokeResponse(ResponseHeader(revision=v[1]))
        if op == _OUTCOME_ERROR and len(v) == 3 and type(v[2]) is str:
            cls = _ERROR_BY_TAG.get(v[1]) if type(v[1]) is str else None
            if cls is not None:
                return cls(v[2])
    raise SnapshotFormatError(f"malformed lease dedup outcome {v!r}")


def _is_uint64(v: Any) -> bool:
    return type(v) is int and 0 <= v < 1 << 64  # client and request ids (HTTP headers)


def dedup_to_plain(exported: list[tuple[int, list[tuple[int, Any]]]]) -> list:
    """A ``DedupTable.export()`` as plain values (order kept)."""
    return [
        [cid, [[rid, _outcome_to_plain(outcome)] for rid, outcome in items]]
        for cid, items in exported
    ]


def dedup_from_plain(v: Any) -> list[tuple[int, list[tuple[int, Any]]]]:
    """The ``DedupTable.export()`` that ``dedup_to_plain`` gave ``v``; raises
    ``SnapshotFormatError``."""
    if type(v) is not list:
        raise SnapshotFormatError("lease snapshot without a dedup table")
    out: list[tuple[int, list[tuple[int, Any]]]] = []
    seen_clients: set[int] = set()
    for client in v:
        if (
            type(client) is not list
            or len(client) != 2
            or not _is_uint64(client[0])
            or client[0] == 0
            or client[0] in seen_clients
            or type(client[1]) is not list
        ):
            raise SnapshotFormatError(f"malformed lease dedup client {client!r}")
        seen_clients.add(client[0])
        items: list[tuple[int, Any]] = []
        seen_ids: set[int] = set()
        for item in client[1]:
            if (
                type(item) is not list
                or len(item) != 2
                or not _is_uint64(item[0])
                or item[0] in seen_ids
            ):
                raise SnapshotFormatError(f"malformed lease dedup entry {item!r}")
            seen_ids.add(item[0])
            items.append((item[0], _outcome_from_plain(item[1])))
        out.append((client[0], items))
    return out
