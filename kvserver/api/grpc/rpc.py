"""One gRPC call as a servicer sees it: the method table, the call's context, its status.

- ``Method``: a servicer's handler with its kind (``unary_unary``, ``unary_stream`` or
  ``stream_stream``) and its request type; the server's table maps full method names
  (``/etcdserverpb.KV/Range``) to them (``calls.service_handler``).
- ``RpcContext``: what a handler may ask of its call, the subset of grpc.aio's servicer
  context that the servicers use: ``invocation_metadata()``, ``time_remaining()``,
  ``await abort(code, details)`` (raises ``RpcAbort``), ``await write(message)`` for a
  streaming answer, and ``end(code, details)`` to end a call from outside its handler. ``identity`` is who is at the far end of
  the connection (the client's address and, with ``--client-cert-auth``, its verified
  certificate's common name).
- ``Method.start``: a unary call served without a task, for a front end's calls that only
  wait for their member's answer (a task and its wake-up cost more than the rest of it).
- ``run_handler(method, context, request, write)``: runs a call's handler to its end, the
  same way for a client's own HTTP/2 connection and for a call a front-end process passed on
  (``kvserver.api.grpc.frontend_link``); ``error_status(exc)`` is the status a call ends with
  when its handler raised.
- ``trailers(code, details)``: the header block that ends a call with a status. The text is
  percent-encoded as gRPC's wire format wants.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NoReturn, Protocol

import grpc
from google.protobuf.message import DecodeError

from .h2 import encode_headers

log = logging.getLogger(__name__)

UNARY_UNARY = "unary_unary"
UNARY_STREAM = "unary_stream"
STREAM_STREAM = "stream_stream"


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """Who is at the far end of a gRPC connection."""

    address: str  # "host:port" of the client
    cert_common_name: str | None  # the verified client certificate's CN, if any


class PendingCall(Protocol):
    """A call's handler while it runs: an ``asyncio.Task``, or a ``Method.start`` call."""

    def cancel(self) -> object: ...

    def done(self) -> bool: ...


# How a ``Method.start`` call ends: ``(answer, None)``, ``(None, (code, details))``, or
# ``(None, None)`` once it was canceled (as a canceled task ends).
Answered = Callable[[bytes | None, tuple[int, str] | None], None]


@dataclass(frozen=True, slots=True)
class Method:
    handler: Callable[..., Any]
    request_type: Any  # a generated message class: FromString parses a request
    kind: str = UNARY_UNARY
    # A unary call answered by a callback instead of a handler's task (a front end's calls
    # passed on to its member): ``start(request, context, answered)`` returns the running
    # call and calls ``answered`` exactly once; once canceled, on a later loop turn, with
    # ``(None, None)``, as a canceled task ends.
    start: Callable[[bytes, RpcContext, Answered], PendingCall] | None = None


def serialize(message: Any) -> bytes:
    """A response's bytes: bytes are already serialized (big answers are built in pieces)."""
    return message if type(message) is bytes else message.SerializeToString()


class AnswerStream(Protocol):
    """Where a streaming call's answers go (the call's HTTP/2 stream)."""

    async def write_message(self, data: bytes) -> None: ...

    def end(self, code: int, details: str) -> None: ...


class RpcAbort(Exception):
    """Ends a call with a status (``RpcContext.abort``); like grpc.aio's ``AbortError``, an
    ``Exception``, so code that catches every error of a service call must let it through."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


class RpcContext:
    __slots__ = ("identity", "_metadata", "_deadline", "_stream")

    def __init__(
        self,
        identity: ClientIdentity,
        metadata: tuple[tuple[str, str], ...],
        deadline: float | None,
        stream: AnswerStream,
    ):
        self.identity = identity
        self._metadata = metadata
        self._deadline = deadline  # time.monotonic() at which the client gives up
        self._stream = stream

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise RpcAbort(code, details)

    async def write(self, message: Any) -> None:
        await self._stream.write_message(serialize(message))

    def end(self, code: grpc.StatusCode, details: str) -> None:
        """Ends the call from outside its handler: the handler is canceled and the client
        gets this status (e.g. a ``hasleader`` stream whose member lost its leader)."""
        self._stream.end(status_code(code), details)

    @property
    def answer_stream(self) -> AnswerStream:
        """Where the answers go (a front end's watch fan-out writes to its stream directly)."""
        return self._stream


def first_metadata(metadata: tuple[tuple[str, str], ...], name: str) -> str | None:
    for key, value in metadata:
        if key == name:
            return value
    return None


Handler = Callable[[Any, RpcContext], Awaitable[Any]]


async def run_handler(
    method: Method,
    context: RpcContext,
    request: Any,
    write: Callable[[bytes], Awaitable[None]],
) -> bytes | None:
    """Runs a call's handler to its end: a unary call's serialized answer, or None once a
    streaming call has written its answers through ``write``. ``request`` is the serialized
    request, or a bidirectional call's iterator of requests. Raises what the handler raises."""
    if method.kind == UNARY_UNARY:
        return serialize(await method.handler(method.request_type.FromString(request), context))
    if method.kind == STREAM_STREAM:
        result = method.handler(request, context)
    else:
        result = method.handler(method.request_type.FromString(request), context)
    if inspect.isasyncgen(result):
        async for message in result:
            await write(serialize(message))
    else:
        await result
    return None


def error_status(method: Method, exc: Exception) -> tuple[int, str]:
    """The status a call ends with when its handler raised ``exc``."""
    if isinstance(exc, RpcAbort):
        return status_code(exc.code), exc.details
    if isinstance(exc, DecodeError):
        return status_code(grpc.StatusCode.INTERNAL), f"grpc: {exc}"
    log.error("gRPC: %s failed", method.handler, exc_info=exc)
    return status_code(grpc.StatusCode.UNKNOWN), f"Unexpected {type(exc).__name__}: {exc}"


# --- statuses on the wire ---------------------------------------------------------------------

_UNRESERVED = frozenset(range(0x20, 0x7F)) - {ord("%")}


def percent_encode(text: str) -> str:
    data = text.encode("utf-8", "replace")
    if all(b in _UNRESERVED for b in data):
        return data.decode("ascii")
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in data)


RESPONSE_HEADERS = encode_headers([(":status", "200"), ("content-type", "application/grpc")])


@lru_cache(maxsize=512)
def trailers(code: int, details: str = "") -> bytes:
    """The trailers' header block of a status (cached: most calls end with a few)."""
    headers = [("grpc-status", str(code))]
    if details:
        headers.append(("grpc-message", percent_encode(details)))
    return encode_headers(headers)


def trailers_only(code: int, details: str = "") -> bytes:
    """One header block that answers a call with a status and nothing else."""
    return RESPONSE_HEADERS + trailers(code, details)


def status_code(code: grpc.StatusCode) -> int:
    return int(code.value[0])


# grpc-timeout units (gRPC's wire format: at most 8 digits and one unit)
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(value: str) -> float | None:
    """Seconds of a ``grpc-timeout`` header, or None if it is not one."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit
