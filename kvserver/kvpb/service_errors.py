"""Cluster-level errors a client can see, with etcd's texts, gRPC codes and HTTP statuses.

Every client-visible failure is a ``kvserver.kvpb.errors.EtcdError``: the store's own errors
(compacted, key not provided, ...) and, from here, ``ServiceError`` for what the cluster says
(no leader, request timed out, too many requests, ...). Both API dialects render any of them
from one place — the etcd gateway as ``{"error": msg, "code": grpc_code, "message": msg}`` with
the HTTP status grpc-gateway uses for that code, the REST dialect as
``{"error": msg, "code": name}``.
"""

from typing import Any

from kvserver.kvpb.errors import HTTP_STATUS_BY_GRPC_CODE, EtcdError, GrpcCode

__all__ = ["HTTP_STATUS_BY_GRPC_CODE", "GrpcCode", "ServiceError"]


class ServiceError(EtcdError):
    """A request failed at the cluster level; ``grpc_code`` says how, ``message`` says what
    (etcd's text when etcd has one). ``retryable`` marks failures a client may retry with the
    same request id. Store-level failures are the other ``EtcdError`` subclasses."""

    def __init__(self, code: GrpcCode, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.grpc_code = code
        self.retryable = retryable

    @property
    def code(self) -> GrpcCode:
        return self.grpc_code

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_rebuild, (type(self), self.grpc_code, self.message, self.retryable))

    def __repr__(self) -> str:
        return f"ServiceError({self.grpc_code.name}, {self.message!r})"


def _rebuild(
    cls: type[ServiceError], code: GrpcCode, message: str, retryable: bool
) -> ServiceError:
    err = ServiceError.__new__(cls)
    ServiceError.__init__(err, code, message, retryable=retryable)
    return err


def request_too_large() -> ServiceError:
    return ServiceError(GrpcCode.INVALID_ARGUMENT, "etcdserver: request is too large")


def no_leader() -> ServiceError:
    return ServiceError(GrpcCode.UNAVAILABLE, "etcdserver: no leader", retryable=True)


def leader_changed() -> ServiceError:
    return ServiceError(GrpcCode.UNAVAILABLE, "etcdserver: leader changed", retryable=True)


def timed_out() -> ServiceError:
    return ServiceError(GrpcCode.UNAVAILABLE, "etcdserver: request timed out", retryable=True)


def stopping() -> ServiceError:
    return ServiceError(GrpcCode.UNAVAILABLE, "etcdserver: server stopped", retryable=True)


MSG_NOT_FOR_LEARNER = "etcdserver: rpc not supported for learner"


def not_for_learner() -> ServiceError:
    """What etcd's learner answers to everything but Status and a serializable Range: try
    another member."""
    return ServiceError(GrpcCode.UNAVAILABLE, MSG_NOT_FOR_LEARNER, retryable=True)


def replaying(detail: str) -> ServiceError:
    """A member that restarted has not applied its recovered log yet (local reads wait)."""
    return ServiceError(GrpcCode.UNAVAILABLE, f"etcdserver: {detail}", retryable=True)
