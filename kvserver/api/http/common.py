"""Pieces both HTTP dialects share: error bodies, request-id headers, bounded body reads.

Errors
------
Every client-visible failure is "something with a gRPC code, a message and an HTTP status":
``kvserver.kvpb.errors.EtcdError`` (``grpc_code``, ``message``, ``http_status``) or
``kvserver.kvpb.service_errors.ServiceError`` (``code``, ``message``, ``http_status``). ``error_parts``
reads either. The two renderings:

- etcd gateway dialect: ``{"error": msg, "message": msg, "code": <grpc code number>}``
  (key order as etcd 3.4's gateway writes it) with the HTTP status grpc-gateway maps the code
  to;
- REST dialect: ``{"error": msg, "code": "<gRPC code name in CamelCase>"}``, e.g.
  ``{"error": "etcdserver: key is not provided", "code": "InvalidArgument"}``.

Request ids
-----------
``X-Raftkv-Client-Id`` and ``X-Raftkv-Request-Id`` (decimal uint64) come together or not at
all: a client id alone would make every later write of that client look like a retry of the
first one. Anything else is 400 InvalidArgument.

Body size
---------
A body longer than its limit is refused before it is read (by ``Content-Length``) or while
it is read (aiohttp's ``client_max_size`` for chunked bodies): HTTP 413 with etcd's text
``etcdserver: request is too large`` and code InvalidArgument.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from kvserver.api.shared.request_size import request_size_bytes
from kvserver.api.shared.snapshot_capture import SnapshotGate
from kvserver.kvpb.errors import EtcdError
from kvserver.kvpb.headers import CLIENT_ID_HEADER, REQUEST_ID_HEADER
from kvserver.kvpb.service_errors import GrpcCode, ServiceError, request_too_large
from kvserver.server.metrics import Metrics
from kvserver.server.service import KVService

JSON_CONTENT_TYPE = "application/json"
MSG_TOO_LARGE = "etcdserver: request is too large"
REVISION_HEADER = "X-Raftkv-Revision"
DEFAULT_MAX_REQUEST_BYTES = 1536 * 1024  # etcd's --max-request-bytes default (1.5 MiB)
BODY_SLACK_BYTES = 512 * 1024

_UINT64_MAX = (1 << 64) - 1
_DECIMAL = re.compile(r"[0-9]{1,20}", re.ASCII)

# JSON encoder for every response: compact separators like etcd's gateway; ASCII output, so
# ``.encode("ascii")`` is exact.
dumps = json.JSONEncoder(separators=(",", ":")).encode


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


# gRPC's canonical code names: 3 -> "InvalidArgument", 14 -> "Unavailable".
GRPC_CODE_NAMES: Mapping[int, str] = {
    int(c): "OK" if c is GrpcCode.OK else _camel(c.name) for c in GrpcCode
}


class HTTPStatusError(ServiceError):
    """A ServiceError answered with an explicit HTTP status instead of its code's mapping
    (413 for a body refused before decoding, 404/405 for unknown endpoints and methods)."""

    def __init__(self, code: GrpcCode, message: str, http_status: int) -> None:
        super().__init__(code, message)
        self._http_status = http_status

    @property
    def http_status(self) -> int:
        return self._http_status


def body_too_large() -> HTTPStatusError:
    return HTTPStatusError(GrpcCode.INVALID_ARGUMENT, MSG_TOO_LARGE, 413)


@dataclass(frozen=True, slots=True)
class ApiLimits:
    """Size bounds of client requests.

    ``max_request_bytes`` bounds a decoded request (keys + values + a small per-message
    overhead, close to the size of etcd's protobuf request), like etcd's
    ``--max-request-bytes``: over it, etcd's ``etcdserver: request is too large`` (400).
    ``max_body_bytes`` bounds the raw HTTP body before decoding (413): base64 inflates bytes
    by 4/3 and JSON adds field names, so it allows that plus a fixed slack, as etcd's gRPC
    server allows ``max_request_bytes`` + 512 KiB on the wire.
    """

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_body_bytes: int = DEFAULT_MAX_REQUEST_BYTES * 4 // 3 + BODY_SLACK_BYTES

    @classmethod
    def for_max_request(cls, max_request_bytes: int) -> ApiLimits:
        if max_request_bytes <= 0:
            raise ValueError("max_request_bytes must be positive")
        return cls(max_request_bytes, max_request_bytes * 4 // 3 + BODY_SLACK_BYTES)


# Application state: no globals, everything under AppKeys (several members share a process
# in tests).
SERVICE_KEY = web.AppKey("raftkv_service", KVService)
METRICS_KEY = web.AppKey("raftkv_metrics", Metrics)
LIMITS_KEY = web.AppKey("raftkv_limits", ApiLimits)
# how many snapshot streams run at once (kvserver.api.shared.snapshot_capture)
SNAPSHOT_GATE_KEY = web.AppKey("raftkv_snapshot_gate", SnapshotGate)
# (ready, configured) client front ends, for /health; absent without front ends
FRONTENDS_KEY: web.AppKey[Callable[[], tuple[int, int]]] = web.AppKey("raftkv_frontends")


def check_request_size(req: object, limits: ApiLimits) -> None:
    if request_size_bytes(req) > limits.max_request_bytes:
        raise request_too_large()


def error_parts(exc: BaseException) -> tuple[int, str, int] | None:
    """``(grpc_code, message, http_status)`` of a client-visible error, else None."""
    if isinstance(exc, EtcdError):  # ServiceError included
        return int(exc.grpc_code), exc.message, exc.http_status
    return None


def etcd_error_body(code: int, message: str) -> bytes:
    return dumps({"error": message, "message": message, "code": code}).encode("ascii")


def rest_error_body(code: int, message: str) -> bytes:
    name = GRPC_CODE_NAMES.get(code, str(code))
    return dumps({"error": message, "code": name}).encode("ascii")


def json_response(
    body: bytes, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(body=body, status=status, headers=headers, content_type=JSON_CONTENT_TYPE)


def _uint64_header(name: str, value: str) -> int:
    if _DECIMAL.fullmatch(value) is None or int(value) > _UINT64_MAX:
        raise ServiceError(
            GrpcCode.INVALID_ARGUMENT,
            f"raftkv: header {name} must be a decimal uint64, got {value[:40]!r}",
        )
    return int(value)


def request_ids(headers: Mapping[str, str]) -> tuple[int, int]:
    """``(client_id, request_id)`` from the request headers; (0, 0) when absent."""
    client = headers.get(CLIENT_ID_HEADER)
    request = headers.get(REQUEST_ID_HEADER)
    if client is None and request is None:
        return 0, 0
    if client is None or request is None:
        raise ServiceError(
            GrpcCode.INVALID_ARGUMENT,
            f"raftkv: headers {CLIENT_ID_HEADER} and {REQUEST_ID_HEADER} must be sent together",
        )
    return _uint64_header(CLIENT_ID_HEADER, client), _uint64_header(REQUEST_ID_HEADER, request)


async def read_body(request: web.Request, limit_bytes: int) -> bytes:
    """The whole request body, refusing (413) one longer than ``limit_bytes``."""
    declared = request.content_length
    if declared is not None and declared > limit_bytes:
        raise body_too_large()
    body = await request.read()  # bounded by the app's client_max_size for chunked bodies
    if len(body) > limit_bytes:
        raise body_too_large()
    return body
