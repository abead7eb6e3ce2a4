"""The lessor's errors, with etcd's texts and gRPC codes (``kvserver.kvpb.errors.EtcdError``).

``LeaseExistsError`` (FailedPrecondition, ``etcdserver: lease already exists``),
``LeaseTTLTooLargeError`` (OutOfRange, ``etcdserver: too large lease TTL``),
``NotPrimaryError`` (FailedPrecondition, ``etcdserver: not leader``), raftkv's own
``TooManyLeasesError`` (ResourceExhausted), and ``LeaseExpiredError``, a
``kvserver.kvpb.errors.LeaseNotFoundError`` that tells the driver the revoke is pending.
"""

from __future__ import annotations

from kvserver.kvpb.errors import EtcdError, GrpcCode, LeaseNotFoundError

__all__ = [
    "LeaseExistsError",
    "LeaseExpiredError",
    "LeaseTTLTooLargeError",
    "NotPrimaryError",
    "TooManyLeasesError",
]

MSG_LEASE_EXISTS = "etcdserver: lease already exists"
MSG_LEASE_TTL_TOO_LARGE = "etcdserver: too large lease TTL"
MSG_NOT_LEADER = "etcdserver: not leader"
MSG_TOO_MANY_LEASES = "raftkv: too many leases"


class LeaseExistsError(EtcdError):
    """A grant names an ID that is already granted."""

    grpc_code = GrpcCode.FAILED_PRECONDITION
    default_message = MSG_LEASE_EXISTS


class LeaseTTLTooLargeError(EtcdError):
    """A grant asks for more than ``kvserver.kvpb.lease.MAX_LEASE_TTL_S``."""

    grpc_code = GrpcCode.OUT_OF_RANGE
    default_message = MSG_LEASE_TTL_TOO_LARGE


class LeaseExpiredError(LeaseNotFoundError):
    """A keep-alive for a lease whose deadline passed on this leader: its revoke is pending.
    A ``LeaseNotFoundError`` to callers that do not care; the driver may instead wait for the
    revoke (then: not found) or for a demotion (then: forward), like etcd's Renew."""


class NotPrimaryError(EtcdError):
    """This member is not the primary lessor (not the leader): forward to the leader."""

    grpc_code = GrpcCode.FAILED_PRECONDITION  # etcd's ErrGRPCNotLeader
    default_message = MSG_NOT_LEADER


class TooManyLeasesError(EtcdError):
    """The lease table is at its bound (``max_leases`` or ``HARD_MAX_LEASES``)."""

    grpc_code = GrpcCode.RESOURCE_EXHAUSTED
    default_message = MSG_TOO_MANY_LEASES
