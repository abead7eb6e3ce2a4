"""Typed errors of the MVCC store, carrying etcd's texts and gRPC codes.

Contract: every error a client can cause is an ``EtcdError`` subclass whose ``str()`` is the
exact text etcd's gRPC layer (and therefore its JSON gateway) returns, e.g.
``etcdserver: mvcc: required revision has been compacted``. ``grpc_code`` is the gRPC status
code etcd attaches and ``http_status`` the status the JSON gateway maps it to. An operation
that raises one of these changed nothing in the store.

``SnapshotFormatError`` is not a client error: it means a snapshot stream is damaged.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, ClassVar


class GrpcCode(IntEnum):
    """gRPC status codes (the canonical set; etcd's errors use a few of them)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# grpc-gateway v1's runtime.HTTPStatusFromCode (what etcd 3.4 and 3.5 serve). FailedPrecondition
# is 412 there (v2 changed it to 400); etcd 3.4 answers "lease already exists" with 412 and
# gateway clients rely on it (etcd3gw raises PreconditionFailedError), so existing gateway
# clients keep working only with 412.
HTTP_STATUS_BY_GRPC_CODE: dict[GrpcCode, int] = {
    GrpcCode.OK: 200,
    GrpcCode.CANCELLED: 408,
    GrpcCode.UNKNOWN: 500,
    GrpcCode.INVALID_ARGUMENT: 400,
    GrpcCode.DEADLINE_EXCEEDED: 504,
    GrpcCode.NOT_FOUND: 404,
    GrpcCode.ALREADY_EXISTS: 409,
    GrpcCode.PERMISSION_DENIED: 403,
    GrpcCode.RESOURCE_EXHAUSTED: 429,
    GrpcCode.FAILED_PRECONDITION: 412,
    GrpcCode.ABORTED: 409,
    GrpcCode.OUT_OF_RANGE: 400,
    GrpcCode.UNIMPLEMENTED: 501,
    GrpcCode.INTERNAL: 500,
    GrpcCode.UNAVAILABLE: 503,
    GrpcCode.DATA_LOSS: 500,
    GrpcCode.UNAUTHENTICATED: 401,
}

# etcd's texts (api/v3rpc/rpctypes/error.go, mvcc/kvstore.go, lease/lessor.go).
MSG_EMPTY_KEY = "etcdserver: key is not provided"
MSG_KEY_NOT_FOUND = "etcdserver: key not found"
MSG_VALUE_PROVIDED = "etcdserver: value is provided"
MSG_LEASE_PROVIDED = "etcdserver: lease is provided"
MSG_TOO_MANY_OPS = "etcdserver: too many operations in txn request"
MSG_DUPLICATE_KEY = "etcdserver: duplicate key given in txn request"
MSG_INVALID_SORT_OPTION = "etcdserver: invalid sort option"
MSG_COMPACTED = "etcdserver: mvcc: required revision has been compacted"
MSG_FUTURE_REV = "etcdserver: mvcc: required revision is a future revision"
MSG_LEASE_NOT_FOUND = "etcdserver: requested lease not found"


class EtcdError(Exception):
    """Base of the client-visible errors; ``str(err)`` is etcd's wire text."""

    grpc_code: GrpcCode = GrpcCode.INVALID_ARGUMENT  # per class; ServiceError sets it per error
    default_message: ClassVar[str] = ""

    def __init__(self, message: str | None = None) -> None:
        self.message = message if message is not None else self.default_message
        super().__init__(self.message)

    @property
    def http_status(self) -> int:
        return HTTP_STATUS_BY_GRPC_CODE[self.grpc_code]

    def __eq__(self, other: object) -> bool:
        # Equality by type and text, so remembered (dedup) outcomes compare after a snapshot.
        return type(other) is type(self) and other.message == self.message

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.message))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.message,))


class InvalidArgumentError(EtcdError):
    """A malformed request (etcd's v3rpc checks): empty key, duplicate keys in a txn, ..."""

    grpc_code = GrpcCode.INVALID_ARGUMENT


class KeyNotFoundError(InvalidArgumentError):
    """``ignore_value``/``ignore_lease`` on a key that does not exist, or an empty txn op."""

    default_message = MSG_KEY_NOT_FOUND


class CompactedError(EtcdError):
    """The requested revision is below the compact revision (or compacting it again)."""

    grpc_code = GrpcCode.OUT_OF_RANGE
    default_message = MSG_COMPACTED

    def __init__(self, message: str | None = None, compact_revision: int = 0) -> None:
        super().__init__(message)
        # The store's compact revision when the error was raised (watch responses carry it).
        self.compact_revision = compact_revision

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.message, self.compact_revision))


class FutureRevisionError(EtcdError):
    """The requested revision is above the current revision."""

    grpc_code = GrpcCode.OUT_OF_RANGE
    default_message = MSG_FUTURE_REV


class LeaseNotFoundError(EtcdError):
    """A put names a lease the lease manager does not know."""

    grpc_code = GrpcCode.NOT_FOUND
    default_message = MSG_LEASE_NOT_FOUND


class SnapshotFormatError(Exception):
    """A snapshot stream is truncated, damaged or of an unknown format."""


class CodecError(Exception):
    """A log entry or encoded object could not be decoded."""
