"""Handlers of the etcd v3 JSON gateway dialect (``POST /v3/...``, also under ``/v3beta/``).

Each handler is parse -> check -> one service call -> render:
read the body (bounded, 413 over ``ApiLimits.max_body_bytes``), decode it with
``gateway_json`` (400 on bad JSON/base64/types), refuse a decoded request over
``max_request_bytes`` (etcd's ``request is too large``), run etcd's stateless checks
(``validate_request``; bad input never reaches the log), call ``KVService``, encode.
Writes carry the ``X-Raftkv-Client-Id``/``X-Raftkv-Request-Id`` pair (bad values: 400).

Implemented: ``kv/range``, ``kv/put``, ``kv/deleterange``, ``kv/txn``, ``kv/compaction``,
``maintenance/status``, ``maintenance/alarm`` (``alarm``), ``maintenance/defragment``,
``maintenance/hash``, ``maintenance/hashkv`` and ``maintenance/transfer-leadership``
(``maintenance_ops``), the cluster endpoints (``cluster/member/*``, see ``cluster``) and the
lease endpoints (``lease/grant``, ``lease/revoke``,
``lease/keepalive``, ``lease/timetolive``, ``lease/leases``, and etcd's older aliases
``kv/lease/revoke``, ``kv/lease/timetolive``, ``kv/lease/leases``). ``lease/keepalive`` answers
like etcd's gateway stream: chunked, one ``{"result": ...}`` line per request object in the
body; a lease that is not found answers a line without ``TTL`` (etcd's gRPC layer does the
same), any other failure of the first request is an ordinary error response, and a failure
later in the stream ends it with one ``{"error": {"grpc_code", "http_code", "message",
"http_status"}}`` line. Keep-alive and time-to-live are leader-only (as in etcd): a follower
forwards them to the leader (``forward``). ``watch`` is
``kvserver.api.http.watch`` (a long-lived chunked stream); ``auth/*`` is ``kvserver.api.http.auth``,
whose checks every KV request and lease revoke passes; ``maintenance/snapshot`` is
``kvserver.api.http.maintenance`` (a chunked stream, mounted by ``app``). etcd's
``maintenance/downgrade`` answers 501 Unimplemented in etcd's error shape (raftkv has one
storage version); any other path under ``/v3/`` is 404 (etcd answers those with a
plain-text 404).
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus

from aiohttp import web

from kvserver.api.shared.maintenance_ops import MSG_NO_DOWNGRADE
from kvserver.kvpb.errors import LeaseNotFoundError
from kvserver.kvpb.kv import ResponseHeader
from kvserver.kvpb.lease import LeaseKeepAliveResponse
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.mvcc.validate import validate_request

from . import (
    alarm,
    auth,
    cluster,
    forward,
    gateway_json,
    learner,
    maintenance,
    maintenance_ops,
    watch,
)
from .common import (
    LIMITS_KEY,
    SERVICE_KEY,
    HTTPStatusError,
    check_request_size,
    error_parts,
    json_response,
    read_body,
    request_ids,
)

PREFIXES = ("/v3", "/v3beta")

# Paths (after the /v3 prefix) served here.
IMPLEMENTED = frozenset(
    {
        "/kv/range",
        "/kv/put",
        "/kv/deleterange",
        "/kv/txn",
        "/kv/compaction",
        "/maintenance/status",
        "/lease/grant",
        "/lease/revoke",
        "/lease/keepalive",
        "/lease/timetolive",
        "/lease/leases",
        "/kv/lease/revoke",
        "/kv/lease/timetolive",
        "/kv/lease/leases",
        "/watch",
        *(path for path, _ in cluster.ROUTES),
        *(path for path, _ in auth.ROUTES),
        *(path for path, _ in alarm.ROUTES),
        *(path for path, _ in maintenance_ops.ROUTES),
    }
)
# Served by routes app.py mounts itself (a wrong method falls through to ``fallback``).
_STREAMED = frozenset(path for path, _ in maintenance.ROUTES)
# etcd gateway paths raftkv does not serve, and why (501 Unimplemented).
UNIMPLEMENTED = {"/maintenance/downgrade": MSG_NO_DOWNGRADE}


async def _decoded(request: web.Request, decode):  # type: ignore[no-untyped-def]
    limits = request.app[LIMITS_KEY]
    req = decode(await read_body(request, limits.max_body_bytes))
    validate_request(req)  # etcd's order: the gRPC layer's checks, then the size at propose
    check_request_size(req, limits)
    auth.check_request(request, req)  # the user's key permissions (auth enabled only)
    return req


async def kv_range(request: web.Request) -> web.Response:
    request_ids(request.headers)  # reads ignore them, but malformed ones are still refused
    req = await _decoded(request, gateway_json.decode_range)
    learner.refuse_linearizable_read(request, req)
    resp = await request.app[SERVICE_KEY].range(req)
    if len(resp.kvs) > gateway_json.ENCODE_IN_THREAD_KVS:
        # A big answer is encoded in a worker thread, a slice at a time, off the loop.
        body = await asyncio.to_thread(gateway_json.encode_range_in_steps, resp)
        return json_response(body)
    return json_response(gateway_json.encode_range(resp))


async def kv_put(request: web.Request) -> web.Response:
    client_id, request_id = request_ids(request.headers)
    req = await _decoded(request, gateway_json.decode_put)
    resp = await request.app[SERVICE_KEY].put(req, client_id=client_id, request_id=request_id)
    return json_response(gateway_json.encode_put(resp))


async def kv_delete_range(request: web.Request) -> web.Response:
    client_id, request_id = request_ids(request.headers)
    req = await _decoded(request, gateway_json.decode_delete_range)
    resp = await request.app[SERVICE_KEY].delete_range(
        req, client_id=client_id, request_id=request_id
    )
    return json_response(gateway_json.encode_delete_range(resp))


async def kv_txn(request: web.Request) -> web.Response:
    client_id, request_id = request_ids(request.headers)
    req = await _decoded(request, gateway_json.decode_txn)
    resp = await request.app[SERVICE_KEY].txn(req, client_id=client_id, request_id=request_id)
    return json_response(gateway_json.encode_txn(resp))


async def kv_compaction(request: web.Request) -> web.Response:
    req = await _decoded(request, gateway_json.decode_compaction)
    resp = await request.app[SERVICE_KEY].compact(req)
    return json_response(gateway_json.encode_compaction(resp))


async def maintenance_status(request: web.Request) -> web.Response:
    # StatusRequest has no fields, but the body must still be a JSON object (or empty).
    body = gateway_json.parse_json(await read_body(request, request.app[LIMITS_KEY].max_body_bytes))
    if body is not None and type(body) is not dict:
        raise ServiceError(GrpcCode.INVALID_ARGUMENT, "raftkv: body: expected a JSON object")
    status = request.app[SERVICE_KEY].status()
    return json_response(gateway_json.encode(gateway_json.status_response(status)))


async def _body(request: web.Request) -> bytes:
    return await read_body(request, request.app[LIMITS_KEY].max_body_bytes)


async def lease_grant(request: web.Request) -> web.Response:
    client_id, request_id = request_ids(request.headers)
    ttl_s, lease_id = gateway_json.decode_lease_grant(await _body(request))
    resp = await request.app[SERVICE_KEY].lease_grant(
        ttl_s, lease_id, client_id=client_id, request_id=request_id
    )
    return json_response(gateway_json.encode_lease_grant(resp))


async def lease_revoke(request: web.Request) -> web.Response:
    client_id, request_id = request_ids(request.headers)
    lease_id = gateway_json.decode_lease_id(await _body(request))
    auth.check_lease_revoke(request, lease_id)  # write permission on every attached key
    resp = await request.app[SERVICE_KEY].lease_revoke(
        lease_id, client_id=client_id, request_id=request_id
    )
    return json_response(gateway_json.encode_lease_revoke(resp))


async def lease_time_to_live(request: web.Request) -> web.Response:
    body = await _body(request)
    lease_id, keys = gateway_json.decode_lease_time_to_live(body)
    try:
        resp = await request.app[SERVICE_KEY].lease_time_to_live(lease_id, keys)
    except ServiceError as exc:  # leader-only, as in etcd: a follower forwards it
        if not forward.forwardable(request, exc):
            raise
        return await forward.to_leader(request, body, exc)
    return json_response(gateway_json.encode_lease_time_to_live(resp))


async def lease_leases(request: web.Request) -> web.Response:
    gateway_json.decode_empty(await _body(request))
    resp = await request.app[SERVICE_KEY].lease_leases()
    return json_response(gateway_json.encode_lease_leases(resp))


async def _keepalive_one(service, lease_id: int) -> LeaseKeepAliveResponse:  # type: ignore
    try:
        return await service.lease_keepalive(lease_id)
    except LeaseNotFoundError:
        # etcd's gRPC layer: a not-found lease is an answer with TTL 0, not a stream error.
        header = service.status()
        return LeaseKeepAliveResponse(
            ResponseHeader(header.cluster_id, header.member_id, header.revision, header.raft_term),
            lease_id,
            0,
        )


async def lease_keepalive(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE_KEY]
    body = await _body(request)
    ids = gateway_json.decode_lease_keepalive_stream(body)
    try:
        first = await _keepalive_one(service, ids[0])  # fails as a plain error response
    except ServiceError as exc:  # only the leader renews leases: a follower forwards
        if not forward.forwardable(request, exc):
            raise
        return await forward.to_leader(request, body, exc)
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write(gateway_json.encode_lease_keepalive_line(first))
    for lease_id in ids[1:]:
        try:
            line = gateway_json.encode_lease_keepalive_line(await _keepalive_one(service, lease_id))
        except Exception as exc:
            parts = error_parts(exc)
            if parts is None:
                raise
            code, message, status = parts
            await response.write(
                gateway_json.encode(
                    {
                        "error": {
                            "grpc_code": code,
                            "http_code": status,
                            "message": message,
                            "http_status": HTTPStatus(status).phrase,
                        }
                    }
                )
                + b"\n"
            )
            break
        await response.write(line)
    await response.write_eof()
    return response


async def fallback(request: web.Request) -> web.Response:
    """Any other method or path under a v3 prefix: 405, 501 or 404 in etcd's error shape."""
    tail = "/" + request.match_info["tail"]
    where = f"{request.method} {request.path}"
    if tail in IMPLEMENTED or tail in _STREAMED:
        raise HTTPStatusError(
            GrpcCode.UNIMPLEMENTED, f"raftkv: method not allowed: {where} (use POST)", 405
        )
    if tail in UNIMPLEMENTED:
        if request.method != "POST":
            raise HTTPStatusError(
                GrpcCode.UNIMPLEMENTED, f"raftkv: method not allowed: {where} (use POST)", 405
            )
        raise ServiceError(GrpcCode.UNIMPLEMENTED, UNIMPLEMENTED[tail])
    raise HTTPStatusError(GrpcCode.NOT_FOUND, f"raftkv: no such endpoint: {where}", 404)


# (path after the prefix, handler) of every implemented v3 route; app.py mounts them.
ROUTES = (
    ("/kv/range", kv_range),
    ("/kv/put", kv_put),
    ("/kv/deleterange", kv_delete_range),
    ("/kv/txn", kv_txn),
    ("/kv/compaction", kv_compaction),
    ("/maintenance/status", maintenance_status),
    ("/lease/grant", lease_grant),
    ("/lease/revoke", lease_revoke),
    ("/lease/keepalive", lease_keepalive),
    ("/lease/timetolive", lease_time_to_live),
    ("/lease/leases", lease_leases),
    ("/kv/lease/revoke", lease_revoke),
    ("/kv/lease/timetolive", lease_time_to_live),
    ("/kv/lease/leases", lease_leases),
    ("/watch", watch.watch),
    *cluster.ROUTES,
    *auth.ROUTES,
    *alarm.ROUTES,
    *maintenance_ops.ROUTES,
)
assert {path for path, _ in ROUTES} == IMPLEMENTED
