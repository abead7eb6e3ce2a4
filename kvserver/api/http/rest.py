"""The plain REST dialect, for people and curl: ``/v1/kv/{key}``.

Keys are the URL path after ``/v1/kv/``, percent-decoded to bytes (``%2F`` and a literal ``/``
both give ``/``; ``%FF`` gives the byte 0xff; ``+`` stays ``+``). Values are raw bytes.

``PUT /v1/kv/{key}`` — body = the value (bounded by ``max_request_bytes``: over it, 413).
  Query: ``lease=<id>`` (decimal), ``prev_kv=true``. Answers 200
  ``{"revision": 5}`` plus ``"prev_kv": <kv>`` when asked for and the key existed.
``GET /v1/kv/{key}`` — the value bytes (``application/octet-stream``), with the key's
  ``X-Raftkv-Create-Revision``, ``X-Raftkv-Mod-Revision``, ``X-Raftkv-Version`` and
  ``X-Raftkv-Lease`` headers; 404 when the key does not exist.
  Query: ``revision=<rev>`` (read the past), ``serializable=true`` (local, possibly stale).
  With ``prefix=true``: every key starting with ``{key}`` (``GET /v1/kv/?prefix=true``: all
  keys) as a JSON list of kvs in key order; also ``limit=<n>`` (0 = no limit),
  ``keys_only=true``, ``encoding=base64``; headers ``X-Raftkv-Count`` (keys matching, before
  the limit) and ``X-Raftkv-More`` (``true`` when the limit cut the list).
``DELETE /v1/kv/{key}`` — 200 ``{"revision": 6, "deleted": 1}`` (plus ``"prev_kvs": [...]``
  with ``prev_kv=true``); 404 when the single key did not exist. ``prefix=true`` deletes every
  key with that prefix (an empty prefix is refused: no delete-everything by accident).

The kv JSON object (one clear scheme, no guessing): numbers are JSON numbers;
``{"key": "<text>", "value": "<text>", "create_revision": 2, "mod_revision": 3,
"version": 2, "lease": 0}`` where ``key``/``value`` are the bytes decoded as UTF-8. Bytes that
are not valid UTF-8 appear instead as ``key_b64``/``value_b64`` (standard base64): each kv
has exactly one of ``key``/``key_b64`` and (unless ``keys_only``) one of ``value``/
``value_b64``. ``encoding=base64`` always uses the ``_b64`` forms. (Lease ids above 2^53 lose
precision in JavaScript's JSON numbers; use the v3 dialect there.)

Boolean query flags: ``true``/``1``/empty (``?prefix``) or ``false``/``0``. Every response
carries ``X-Raftkv-Revision`` (the store revision the answer reflects); every failure is a JSON
``{"error": "<message>", "code": "<gRPC code name>"}`` with the matching HTTP status.
Writes honour the ``X-Raftkv-Client-Id``/``X-Raftkv-Request-Id`` pair like the v3 dialect.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_to_bytes

from aiohttp import web
from multidict import MultiMapping

from kvserver.api.shared.request_size import request_size_bytes
from kvserver.kvpb.kv import (
    DeleteRangeRequest,
    KeyValue,
    PutRequest,
    RangeRequest,
    prefix_range_end,
)
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.mvcc.validate import validate_request

from .common import (
    LIMITS_KEY,
    REVISION_HEADER,
    SERVICE_KEY,
    body_too_large,
    dumps,
    json_response,
    read_body,
    request_ids,
)
from .gateway_json import b64

KV_PREFIX = "/v1/kv/"
COUNT_HEADER = "X-Raftkv-Count"
MORE_HEADER = "X-Raftkv-More"

_INT = re.compile(r"-?[0-9]{1,19}", re.ASCII)
_INT64_MAX = (1 << 63) - 1
_TRUE = frozenset(("true", "1", ""))
_FALSE = frozenset(("false", "0"))


def _invalid(message: str) -> ServiceError:
    return ServiceError(GrpcCode.INVALID_ARGUMENT, "raftkv: " + message)


def _key(request: web.Request) -> bytes:
    """The key bytes: the raw (still percent-encoded) path after /v1/kv/, decoded."""
    raw = request.raw_path
    cut = raw.find("?")
    if cut >= 0:
        raw = raw[:cut]
    if raw.startswith(KV_PREFIX):
        return unquote_to_bytes(raw[len(KV_PREFIX) :])
    return request.match_info.get("key", "").encode("utf-8")  # /v1/kv, or an absolute URL


def _flag(query: MultiMapping[str], name: str) -> bool:
    value = query.get(name)
    if value is None:
        return False
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise _invalid(f"query parameter {name} must be true or false, got {value[:40]!r}")


def _int_param(query: MultiMapping[str], name: str) -> int:
    value = query.get(name)
    if value is None:
        return 0
    if _INT.fullmatch(value) is None or not 0 <= int(value) <= _INT64_MAX:
        raise _invalid(f"query parameter {name} must be a non-negative integer, got {value[:40]!r}")
    return int(value)


def _bytes_field(out: dict[str, Any], name: str, data: bytes, base64_only: bool) -> None:
    if not base64_only:
        try:
            out[name] = data.decode("utf-8")
            return
        except UnicodeDecodeError:
            pass
    out[name + "_b64"] = b64(data)


def kv_json(kv: KeyValue, *, base64_only: bool = False, keys_only: bool = False) -> dict:
    out: dict[str, Any] = {}
    _bytes_field(out, "key", kv.key, base64_only)
    if not keys_only:
        _bytes_field(out, "value", kv.value, base64_only)
    out["create_revision"] = kv.create_revision
    out["mod_revision"] = kv.mod_revision
    out["version"] = kv.version
    out["lease"] = kv.lease
    return out


def _show_key(key: bytes) -> str:
    text = key.decode("utf-8", "backslashreplace")
    return text if len(text) <= 80 else text[:77] + "..."


def _not_found(key: bytes, revision: int) -> web.Response:
    body = dumps({"error": f"raftkv: key not found: {_show_key(key)}", "code": "NotFound"})
    return json_response(body.encode("ascii"), 404, {REVISION_HEADER: str(revision)})


async def put_key(request: web.Request) -> web.Response:
    key = _key(request)
    query = request.query
    lease = _int_param(query, "lease")
    prev_kv = _flag(query, "prev_kv")
    client_id, request_id = request_ids(request.headers)
    limits = request.app[LIMITS_KEY]
    value = await read_body(request, limits.max_request_bytes)
    req = PutRequest(key, value, lease, prev_kv)
    if request_size_bytes(req) > limits.max_request_bytes:
        raise body_too_large()
    validate_request(req)
    resp = await request.app[SERVICE_KEY].put(req, client_id=client_id, request_id=request_id)
    revision = resp.header.revision
    out: dict[str, Any] = {"revision": revision}
    if resp.prev_kv is not None:
        out["prev_kv"] = kv_json(resp.prev_kv)
    return json_response(dumps(out).encode("ascii"), 200, {REVISION_HEADER: str(revision)})


async def get_key(request: web.Request) -> web.StreamResponse:
    key = _key(request)
    query = request.query
    revision = _int_param(query, "revision")
    serializable = _flag(query, "serializable")
    if _flag(query, "prefix"):
        return await _get_prefix(request, key, revision, serializable)
    req = RangeRequest(key, revision=revision, serializable=serializable)
    validate_request(req)
    resp = await request.app[SERVICE_KEY].range(req)
    read_revision = resp.header.revision
    if not resp.kvs:
        return _not_found(key, read_revision)
    kv = resp.kvs[0]
    return web.Response(
        body=kv.value,
        headers={
            "Content-Type": "application/octet-stream",
            REVISION_HEADER: str(read_revision),
            "X-Raftkv-Create-Revision": str(kv.create_revision),
            "X-Raftkv-Mod-Revision": str(kv.mod_revision),
            "X-Raftkv-Version": str(kv.version),
            "X-Raftkv-Lease": str(kv.lease),
        },
    )


async def _get_prefix(
    request: web.Request, key: bytes, revision: int, serializable: bool
) -> web.Response:
    query = request.query
    limit = _int_param(query, "limit")
    keys_only = _flag(query, "keys_only")
    encoding = query.get("encoding", "text")
    if encoding not in ("text", "base64"):
        raise _invalid(f"query parameter encoding must be text or base64, got {encoding[:40]!r}")
    if key:
        req = RangeRequest(
            key,
            prefix_range_end(key),
            limit=limit,
            revision=revision,
            serializable=serializable,
            keys_only=keys_only,
        )
    else:  # every key: [\0, \0) in etcd's range notation means "all keys >= \0"
        req = RangeRequest(
            b"\0",
            b"\0",
            limit=limit,
            revision=revision,
            serializable=serializable,
            keys_only=keys_only,
        )
    validate_request(req)
    resp = await request.app[SERVICE_KEY].range(req)
    base64_only = encoding == "base64"
    items = [kv_json(kv, base64_only=base64_only, keys_only=keys_only) for kv in resp.kvs]
    return json_response(
        dumps(items).encode("ascii"),
        200,
        {
            REVISION_HEADER: str(resp.header.revision),
            COUNT_HEADER: str(resp.count),
            MORE_HEADER: "true" if resp.more else "false",
        },
    )


async def delete_key(request: web.Request) -> web.Response:
    key = _key(request)
    query = request.query
    prefix = _flag(query, "prefix")
    prev_kv = _flag(query, "prev_kv")
    client_id, request_id = request_ids(request.headers)
    if prefix and not key:
        raise _invalid("refusing to delete every key: give a non-empty prefix")
    req = DeleteRangeRequest(key, prefix_range_end(key) if prefix else b"", prev_kv)
    validate_request(req)
    resp = await request.app[SERVICE_KEY].delete_range(
        req, client_id=client_id, request_id=request_id
    )
    revision = resp.header.revision
    if not prefix and resp.deleted == 0:
        return _not_found(key, revision)
    out: dict[str, Any] = {"revision": revision, "deleted": resp.deleted}
    if prev_kv:
        out["prev_kvs"] = [kv_json(kv) for kv in resp.prev_kvs]
    return json_response(dumps(out).encode("ascii"), 200, {REVISION_HEADER: str(revision)})
