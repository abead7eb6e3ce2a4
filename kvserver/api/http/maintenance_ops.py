"""etcd's Maintenance calls Defragment, Hash, HashKV and MoveLeader: what each one does,
for every dialect, and the JSON gateway's endpoints for them.

The operations take a ``KVService`` and return the typed answer; they know nothing of HTTP
or protobuf, so both dialects call them (the gRPC servicer converts the same values):

- ``defragment``: succeeds and changes nothing. etcd's defrag rewrites its bolt file so that
  dbSize falls to dbSizeInUse; in an in-memory store the two are always equal. The call
  returns at once, the db size and the process's RSS stay what they were
  (docs/operations.md, "Memory", says what gives memory back).
- ``hash_kv(revision)``: ``service.hash_kv`` (``kvserver.mvcc.hashkv``: what is hashed, the
  errors for a compacted or future revision; equal on members that applied the same log,
  never comparable with etcd's own values).
- ``hash_all``: etcd's Hash hashes its whole backend; here it is the HashKV hash at the
  current revision (the keyspace is the state members may disagree on; leases, auth and
  alarms are not in it).
- ``move_leader(target_id)``: ``service.move_leader``, on the leader only (``etcdserver: not
  leader``, FailedPrecondition, elsewhere; ``etcdserver: bad leader transferee`` for a target
  that is not a voter); returns once this member sees the target lead. Like etcd's, a
  follower does not forward it: the caller asks the leader.
The answers that have nothing else carry this member's header (``header``) after the call.

With auth enabled every one of them needs root; the gateway's auth middleware checks it for
every ``/maintenance/`` path but status (``kvserver.api.http.auth``), before the handler runs.

Gateway shapes (etcd 3.5's paths; grpc-gateway's JSON: proto field names, int64 as decimal
strings, uint32 as numbers, zero values left out; a request body may be empty, ``null`` or an
object, unknown fields are ignored, anything else is 400 InvalidArgument):

- ``POST /v3/maintenance/defragment`` ``{}`` -> ``{"header"}``
- ``POST /v3/maintenance/hash`` ``{}`` -> ``{"header", "hash"}``
- ``POST /v3/maintenance/hashkv`` ``{"revision"}`` -> ``{"header", "hash", "compact_revision",
  "hash_revision"}`` (``compact_revision`` is ``"-1"`` before any compaction, as etcd's;
  ``hash_revision`` is etcd 3.6's field). etcd 3.4 routes HashKV to ``/maintenance/hash``,
  where its Hash answers (``/hashkv`` is a 404 there); 3.5 serves both.
- ``POST /v3/maintenance/transfer-leadership`` ``{"targetID"}`` (uint64, a number or a decimal
  string) -> ``{"header"}``.

etcd's Defragment and MoveLeader leave the header unset and its gateway answers ``{}``; ours
carry the header, as our gRPC answers do (a field etcd's message declares, so its clients
read it or ignore it).
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from kvserver.api.shared.maintenance_ops import (
    defragment,
    hash_all,
    hash_kv,
    move_leader,
)
from kvserver.kvpb.kv import ResponseHeader
from kvserver.mvcc.hashkv import HashKVResponse

from . import gateway_json
from .common import LIMITS_KEY, SERVICE_KEY, json_response, read_body

log = logging.getLogger(__name__)

# --- the JSON gateway ---------------------------------------------------------------------------


def _fields(body: bytes) -> dict[str, Any]:
    """The request's JSON object (``{}`` for an empty body or ``null``), nulls left out."""
    obj = gateway_json.parse_json(body)
    if type(obj) is not dict:
        gateway_json.decode_empty(body)  # null passes; anything else is its 400
        return {}
    return {k: v for k, v in obj.items() if v is not None}


def decode_hash_kv(body: bytes) -> int:
    """HashKVRequest ``{"revision"}`` -> the revision (0: the current one)."""
    raw = _fields(body).get("revision")
    return 0 if raw is None else gateway_json._int64(raw, "revision")


def decode_move_leader(body: bytes) -> int:
    """MoveLeaderRequest ``{"targetID"}`` -> the target's member id (0 if absent, which no
    member has: refused as a bad transferee, as etcd does)."""
    raw = _fields(body).get("targetID")
    return 0 if raw is None else gateway_json._uint64(raw, "targetID")


def hash_kv_response(r: HashKVResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"header": gateway_json.header(r.header)}
    if r.hash:
        out["hash"] = r.hash  # uint32: a JSON number
    if r.compact_revision:
        out["compact_revision"] = str(r.compact_revision)
    if r.hash_revision:
        out["hash_revision"] = str(r.hash_revision)
    return out


def hash_response(r: HashKVResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"header": gateway_json.header(r.header)}
    if r.hash:
        out["hash"] = r.hash
    return out


def header_response(h: ResponseHeader) -> dict[str, Any]:
    return {"header": gateway_json.header(h)}


async def _body(request: web.Request) -> bytes:
    return await read_body(request, request.app[LIMITS_KEY].max_body_bytes)


async def maintenance_defragment(request: web.Request) -> web.Response:
    gateway_json.decode_empty(await _body(request))
    h = await defragment(request.app[SERVICE_KEY])
    return json_response(gateway_json.encode(header_response(h)))


async def maintenance_hash(request: web.Request) -> web.Response:
    gateway_json.decode_empty(await _body(request))
    r = await hash_all(request.app[SERVICE_KEY])
    return json_response(gateway_json.encode(hash_response(r)))


async def maintenance_hash_kv(request: web.Request) -> web.Response:
    revision = decode_hash_kv(await _body(request))
    r = await hash_kv(request.app[SERVICE_KEY], revision)
    return json_response(gateway_json.encode(hash_kv_response(r)))


async def maintenance_move_leader(request: web.Request) -> web.Response:
    target_id = decode_move_leader(await _body(request))
    h = await move_leader(request.app[SERVICE_KEY], target_id)
    return json_response(gateway_json.encode(header_response(h)))


ROUTES = (
    ("/maintenance/defragment", maintenance_defragment),
    ("/maintenance/hash", maintenance_hash),
    ("/maintenance/hashkv", maintenance_hash_kv),
    ("/maintenance/transfer-leadership", maintenance_move_leader),
)
