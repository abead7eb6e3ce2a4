"""The client-facing aiohttp application: both API dialects over one ``KVService``.

``build_client_app(service, metrics, max_request_bytes=...)`` returns a ``web.Application``
the node driver runs (``web.AppRunner`` + ``web.TCPSite``; pass ``access_log=None`` to the
runner on the hot path). State lives under the ``web.AppKey``s of ``kvserver.api.http.common``
(``SERVICE_KEY``, ``METRICS_KEY``, ``LIMITS_KEY``); the whole route table is ``route_table``
below.

Middlewares, outermost first:
1. ``Metrics.http_middleware`` — records the latency of every request with the final status;
2. ``error_middleware`` — turns every failure into a JSON error in the request's dialect:
   ``EtcdError``/``ServiceError`` with their code and status; aiohttp's own 404/405/413 as
   NotFound/Unimplemented/``etcdserver: request is too large``; anything unexpected as 500
   Internal ``raftkv: internal error`` (logged with its traceback, never shown to the client).
3. ``learner.learner_middleware`` — on a learner, refuses what etcd's learner refuses;
4. ``auth.auth_middleware`` — with auth enabled, resolves the ``Authorization`` token to a
   user and refuses what the path needs beyond it (``kvserver.api.http.auth``).

No client input can crash the server: handlers validate before calling the service, and the
service (the store behind it) changes nothing when a request fails.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from kvserver.api.shared.snapshot_capture import SnapshotGate
from kvserver.kvpb.service_errors import GrpcCode
from kvserver.server.metrics import Metrics
from kvserver.server.service import KVService

from . import auth, learner, maintenance, ops, ranks, rest, ui, ui_data, v3, watch
from .common import (
    DEFAULT_MAX_REQUEST_BYTES,
    LIMITS_KEY,
    METRICS_KEY,
    MSG_TOO_LARGE,
    REVISION_HEADER,
    SERVICE_KEY,
    SNAPSHOT_GATE_KEY,
    ApiLimits,
    error_parts,
    etcd_error_body,
    json_response,
    rest_error_body,
)

log = logging.getLogger(__name__)

MSG_INTERNAL = "raftkv: internal error"


def route_table() -> list[web.RouteDef]:
    """Every route of the client API, in one place."""
    table: list[web.RouteDef] = []
    for prefix in v3.PREFIXES:
        table += [web.post(prefix + path, handler) for path, handler in v3.ROUTES]
        table += [web.post(prefix + path, handler) for path, handler in maintenance.ROUTES]
    table += [
        web.put("/v1/kv/{key:.*}", rest.put_key),
        web.get("/v1/kv/{key:.*}", rest.get_key),
        web.delete("/v1/kv/{key:.*}", rest.delete_key),
        web.get("/v1/kv", rest.get_key),
        web.get("/v1/status", ops.node_status),
        web.post(ranks.PATH, ranks.key_ranks),
        web.get("/health", ops.health),
        web.get("/version", ops.version),
        web.get("/metrics", ops.metrics),
    ]
    table += [web.route(m, path, h) for m, path, h in (*ui_data.ROUTES, *ui.ROUTES)]
    # Last: anything else under a v3 prefix (405 / 501 / 404 in etcd's error shape).
    table += [web.route("*", prefix + "/{tail:.*}", v3.fallback) for prefix in v3.PREFIXES]
    return table


def _is_rest(path: str) -> bool:
    return path.startswith("/v1/")


def _render(request: web.Request, code: int, message: str, status: int) -> web.Response:
    if not _is_rest(request.path):
        return json_response(etcd_error_body(code, message), status)
    headers = {}
    try:
        headers[REVISION_HEADER] = str(request.app[SERVICE_KEY].status().revision)
    except Exception:  # the revision header is best effort on an error path
        pass
    return json_response(rest_error_body(code, message), status, headers)


def _http_exception_parts(request: web.Request, exc: web.HTTPException) -> tuple[int, str]:
    where = f"{request.method} {request.path}"
    if exc.status == 404:
        return GrpcCode.NOT_FOUND, f"raftkv: no such endpoint: {where}"
    if exc.status == 405:
        return GrpcCode.UNIMPLEMENTED, f"raftkv: method not allowed: {where}"
    if exc.status == 413:
        return GrpcCode.INVALID_ARGUMENT, MSG_TOO_LARGE
    if exc.status < 500:
        return GrpcCode.INVALID_ARGUMENT, f"raftkv: {exc.reason}"
    return GrpcCode.UNKNOWN, f"raftkv: {exc.reason}"


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code, message = _http_exception_parts(request, exc)
        return _render(request, int(code), message, exc.status)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        parts = error_parts(exc)
        if parts is None:
            log.exception("unexpected error serving %s %s", request.method, request.path)
            return _render(request, int(GrpcCode.INTERNAL), MSG_INTERNAL, 500)
        return _render(request, *parts)


def build_client_app(
    service: KVService, metrics: Metrics, *, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
) -> web.Application:
    """The client HTTP API of one node (see the module docstring)."""
    limits = ApiLimits.for_max_request(max_request_bytes)
    app = web.Application(
        middlewares=[
            metrics.http_middleware(),
            error_middleware,
            learner.learner_middleware,
            auth.auth_middleware,
        ],
        client_max_size=limits.max_body_bytes,
    )
    app[SERVICE_KEY] = service
    app[METRICS_KEY] = metrics
    app[LIMITS_KEY] = limits
    app[SNAPSHOT_GATE_KEY] = SnapshotGate()  # the member sets its own (--max-snapshot-streams)
    app[ui.UI_CONFIG_KEY] = ui.UiConfig()  # the member sets its own (--ui-write, archive)
    watch.setup(app)  # open watch streams end at shutdown
    app.add_routes(route_table())
    return app
