"""Errors a client can see, with etcd's texts and gRPC codes, and their HTTP statuses.

Both API dialects report failures from one place: a handler raises ``ServiceError`` (or one
of the ready-made instances' copies below), and the dialect renders it — the etcd gateway as
``{"error": msg, "code": grpc_code, "message": msg}`` with the HTTP status grpc-gateway uses
for that code, the REST dialect as ``{"error": msg, "code": name}``.
"""

from enum import IntEnum


class GrpcCode(IntEnum):
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


# grpc-gateway's HTTPStatusFromCode.
HTTP_STATUS = {
    GrpcCode.OK: 200, GrpcCode.CANCELLED: 408, GrpcCode.UNKNOWN: 500,
    GrpcCode.INVALID_ARGUMENT: 400, GrpcCode.DEADLINE_EXCEEDED: 504, GrpcCode.NOT_FOUND: 404,
    GrpcCode.ALREADY_EXISTS: 409, GrpcCode.PERMISSION_DENIED: 403,
    GrpcCode.RESOURCE_EXHAUSTED: 429, GrpcCode.FAILED_PRECONDITION: 400,
    GrpcCode.ABORTED: 409, GrpcCode.OUT_OF_RANGE: 400, GrpcCode.UNIMPLEMENTED: 501,
    GrpcCode.INTERNAL: 500, GrpcCode.UNAVAILABLE: 503, GrpcCode.DATA_LOSS: 500,
    GrpcCode.UNAUTHENTICATED: 401,
}


class ServiceError(Exception):
    """A request failed; ``code`` says how, ``message`` says what (etcd's text when etcd has
    one). ``retryable`` marks failures a client may retry with the same request id."""

    def __init__(self, code: GrpcCode, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def __repr__(self) -> str:
        return f"ServiceError({self.code.name}, {self.message!r})"


def invalid(message: str) -> ServiceError:
    return ServiceError(GrpcCode.INVALID_ARGUMENT, message)


def empty_key() -> ServiceError:
    return invalid("etcdserver: key is not provided")


def request_too_large() -> ServiceError:
    return invalid("etcdserver: request is too large")


def compacted() -> ServiceError:
    return ServiceError(GrpcCode.OUT_OF_RANGE,
                        "etcdserver: mvcc: required revision has been compacted")


def future_revision() -> ServiceError:
    return ServiceError(GrpcCode.OUT_OF_RANGE,
                        "etcdserver: mvcc: required revision is a future revision")


def lease_not_found() -> ServiceError:
    return ServiceError(GrpcCode.NOT_FOUND, "etcdserver: requested lease not found")


def no_leader() -> ServiceError:
    return ServiceError(GrpcCode.UNAVAILABLE, "etcdserver: no leader", retryable=True)


def leader_changed() -> ServiceError:
    return ServiceError(GrpcCode.UNAVAILABLE, "etcdserver: leader changed", retryable=True)


def timed_out() -> ServiceError:
    return ServiceError(GrpcCode.UNAVAILABLE, "etcdserver: request timed out", retryable=True)


def stopping() -> ServiceError:
    return ServiceError(GrpcCode.UNAVAILABLE, "etcdserver: server stopped", retryable=True)
