"""Typed errors of the client library: each says what happened, where, and whether a retry
could help.

Contract:

- Every failure a client call can end with is a ``ClientError`` subclass; nothing else
  escapes (no ``aiohttp`` or ``asyncio`` exceptions).
- ``retryable`` is a class attribute: ``True`` only for failures where the request may not have
  been applied and trying again (with the same client/request id for writes) is safe and may
  succeed — the ``UnavailableError`` family. Everything else (bad input, compacted revision,
  unknown lease, ...) fails on the first answer and is never retried.
- ``message`` is the one-line description (the server's text, e.g. etcd's ``etcdserver: no
  leader``, when it sent one); ``str(err)`` adds the operation and, after retries, the attempts
  made (``endpoint: reason`` for each, newest last).
- ``code`` is the gRPC status code of the server's error (``None`` for transport failures),
  ``http_status`` the HTTP status it came with (``None`` when there was no answer).

Mapping of an etcd-gateway error body ``{"error": msg, "code": grpc_code, "message": msg}``:

===================  ========================================  ==========================
gRPC code            text                                       class
===================  ========================================  ==========================
3 InvalidArgument    any                                        InvalidArgumentError
9 FailedPrecondition ``etcdserver: lease already exists``         LeaseExistsError
9 FailedPrecondition other                                      FailedPreconditionError
11 OutOfRange        ``... required revision has been          CompactedError
                     compacted``
11 OutOfRange        ``... required revision is a future        FutureRevisionError
                     revision``
5 NotFound           ``... requested lease not found``          LeaseNotFoundError
5 NotFound           other                                      NotFoundError
14 Unavailable       ``etcdserver: no leader``                  NoLeaderError
14 Unavailable       ``etcdserver: leader changed``             LeaderChangedError
14 Unavailable       ``etcdserver: request timed out``          RequestTimeoutError
14 Unavailable       other                                      UnavailableError
4 DeadlineExceeded   any                                        RequestTimeoutError
12 Unimplemented     any                                        UnimplementedError
8 ResourceExhausted  ``etcdserver: mvcc: database space          NoSpaceError
                     exceeded``
===================  ========================================  ==========================

A body that is not such JSON is mapped by HTTP status alone (404 → NotFoundError, 400 →
InvalidArgumentError, 405/501 → UnimplementedError, 502/503/504 → UnavailableError / RequestTimeoutError, others →
``ClientError``). ``RequestTimeoutError`` is also a builtin ``TimeoutError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvserver.kvpb.service_errors import GrpcCode

MAX_ENDPOINTS_SHOWN = 8  # in an error message
MAX_ERROR_TEXT_CHARS = 300  # bound on the server text we keep from a non-JSON error body


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of a request: where it went and how it failed."""

    endpoint: str
    reason: str
    error: str = ""  # the name of the ClientError class of the failure


class ClientError(Exception):
    """Base of every client failure."""

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: GrpcCode | None = None,
        http_status: int | None = None,
        endpoint: str | None = None,
        operation: str = "",
        attempts: tuple[Attempt, ...] = (),
    ) -> None:
        self.message = message
        self.code = code
        self.http_status = http_status
        self.endpoint = endpoint
        self.operation = operation
        self.attempts = attempts
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.operation}: {self.message}" if self.operation else self.message
        if len(self.attempts) > 1:
            # Per endpoint: how many attempts went there and how the last one failed.
            last: dict[str, str] = {}
            count: dict[str, int] = {}
            for a in self.attempts:
                last.pop(a.endpoint, None)  # re-insert so the order is by latest attempt
                last[a.endpoint] = a.reason
                count[a.endpoint] = count.get(a.endpoint, 0) + 1
            parts = [
                f"{ep} (x{count[ep]}): {reason}" if count[ep] > 1 else f"{ep}: {reason}"
                for ep, reason in list(last.items())[-MAX_ENDPOINTS_SHOWN:]
            ]
            text += f" [{len(self.attempts)} attempts: {'; '.join(parts)}]"
        return text

    def with_context(self, operation: str, attempts: tuple[Attempt, ...]) -> ClientError:
        """A copy of this error naming the operation and the attempts that led to it."""
        return self._copy(operation=operation, attempts=attempts)

    def _copy(self, **changes) -> ClientError:
        fields: dict[str, Any] = dict(
            code=self.code,
            http_status=self.http_status,
            endpoint=self.endpoint,
            operation=self.operation,
            attempts=self.attempts,
        )
        fields.update(changes)
        return type(self)(self.message, **fields)

    def __reduce__(self):
        return (
            _rebuild,
            (
                type(self),
                self.message,
                self.code,
                self.http_status,
                self.endpoint,
                self.operation,
                self.attempts,
            ),
        )


def _rebuild(cls, message, code, http_status, endpoint, operation, attempts):
    return cls(
        message,
        code=code,
        http_status=http_status,
        endpoint=endpoint,
        operation=operation,
        attempts=attempts,
    )


class InvalidArgumentError(ClientError):
    """The request is malformed (empty key, bad base64, value too large, ...)."""


class FailedPreconditionError(ClientError):
    """The server refused the request in its current state (etcd's FailedPrecondition)."""


class OutOfRangeError(ClientError):
    """A revision outside what the store keeps."""


class CompactedError(OutOfRangeError):
    """The requested revision has been compacted away."""


class FutureRevisionError(OutOfRangeError):
    """The requested revision is above the store's current revision."""


class NotFoundError(ClientError):
    """The named thing does not exist (a lease, a member, an API path)."""


class LeaseNotFoundError(NotFoundError):
    """The lease does not exist (never granted, revoked, or expired): from a revoke, a put
    naming it, or a keep-alive answered with no TTL."""


class LeaseExistsError(FailedPreconditionError):
    """A grant named a lease ID that is already granted."""


class NoSpaceError(ClientError):
    """The cluster is over its space quota (a NOSPACE alarm): puts, txns with puts and lease
    grants fail until space is freed (delete, compact) and the alarm disarmed. Not retried."""


class UnimplementedError(ClientError):
    """The server does not implement this call (gRPC Unimplemented, HTTP 501 or 405)."""


class UnavailableError(ClientError):
    """The cluster could not serve the request now; retrying later may succeed."""

    retryable = True


class NoLeaderError(UnavailableError):
    """The node has no leader (an election is in progress or quorum is lost)."""


class LeaderChangedError(UnavailableError):
    """The leader changed while the request was in flight; its outcome is unknown."""


class RequestTimeoutError(UnavailableError, TimeoutError):
    """No answer in time (client-side timeout, or the server's ``request timed out``).
    A write that timed out may or may not have been applied."""


class ConnectionFailedError(UnavailableError):
    """No connection could be made (or it broke); ``endpoints`` lists those tried."""

    def __init__(self, message: str, *, endpoints: tuple[str, ...] = (), **kwargs) -> None:
        self.endpoints = endpoints
        super().__init__(message, **kwargs)

    def _copy(self, **changes) -> ClientError:
        fields: dict[str, Any] = dict(
            code=self.code,
            http_status=self.http_status,
            endpoint=self.endpoint,
            operation=self.operation,
            attempts=self.attempts,
            endpoints=self.endpoints,
        )
        fields.update(changes)
        return type(self)(self.message, **fields)

    def __reduce__(self):
        return (
            _rebuild_conn,
            (self.message, self.endpoints, self.endpoint, self.operation, self.attempts),
        )


def _rebuild_conn(message, endpoints, endpoint, operation, attempts):
    return ConnectionFailedError(
        message, endpoints=endpoints, endpoint=endpoint, operation=operation, attempts=attempts
    )


class ResponseFormatError(ClientError):
    """The server's answer is not the JSON we expect (wrong server, proxy page, bug)."""


_UNAVAILABLE_BY_TEXT = {
    "etcdserver: no leader": NoLeaderError,
    "etcdserver: leader changed": LeaderChangedError,
    "etcdserver: request timed out": RequestTimeoutError,
}

_BY_CODE: dict[int, type[ClientError]] = {
    GrpcCode.INVALID_ARGUMENT: InvalidArgumentError,
    GrpcCode.FAILED_PRECONDITION: FailedPreconditionError,
    GrpcCode.OUT_OF_RANGE: OutOfRangeError,
    GrpcCode.NOT_FOUND: NotFoundError,
    GrpcCode.UNIMPLEMENTED: UnimplementedError,
    GrpcCode.UNAVAILABLE: UnavailableError,
    GrpcCode.DEADLINE_EXCEEDED: RequestTimeoutError,
}

_BY_HTTP_STATUS: dict[int, type[ClientError]] = {
    400: InvalidArgumentError,
    404: NotFoundError,
    405: UnimplementedError,
    501: UnimplementedError,
    502: UnavailableError,
    503: UnavailableError,
    504: RequestTimeoutError,
}


def error_class(code: GrpcCode | None, http_status: int | None, message: str) -> type[ClientError]:
    """The class for a server error, by gRPC code and text (or HTTP status without a code)."""
    if code is None:
        return _BY_HTTP_STATUS.get(http_status or 0, ClientError)
    if code == GrpcCode.UNAVAILABLE:
        return _UNAVAILABLE_BY_TEXT.get(message, UnavailableError)
    if code == GrpcCode.NOT_FOUND and "lease not found" in message:
        return LeaseNotFoundError
    if code == GrpcCode.FAILED_PRECONDITION and "lease already exists" in message:
        return LeaseExistsError
    if code == GrpcCode.RESOURCE_EXHAUSTED and "database space exceeded" in message:
        return NoSpaceError
    if code == GrpcCode.OUT_OF_RANGE:
        if "compacted" in message:
            return CompactedError
        if "future revision" in message:
            return FutureRevisionError
    return _BY_CODE.get(code, ClientError)


def from_http(http_status: int, body: bytes, endpoint: str) -> ClientError:
    """The typed error for a non-200 answer ``body`` with ``http_status`` from ``endpoint``."""
    code: GrpcCode | None = None
    message = ""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        raw_message = doc.get("message") or doc.get("error")
        if isinstance(raw_message, str):
            message = raw_message
        raw_code = doc.get("code")
        if isinstance(raw_code, int) and not isinstance(raw_code, bool):
            try:
                code = GrpcCode(raw_code)
            except ValueError:
                code = None
    if not message:
        text = body[:MAX_ERROR_TEXT_CHARS].decode("utf-8", "replace").strip()
        message = f"HTTP {http_status}" + (f": {text}" if text else "")
    cls = error_class(code, http_status, message)
    return cls(message, code=code, http_status=http_status, endpoint=endpoint)
