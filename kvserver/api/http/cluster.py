"""etcd's Cluster service on the JSON gateway: ``POST /v3/cluster/member/list|add|remove|
promote|update`` (also under ``/v3beta/``), with etcd 3.4's shapes.

Requests (unknown fields are ignored, as etcd does; 64-bit IDs as decimal strings or numbers):
``list {}``; ``add {"peerURLs": [...], "isLearner": bool}``; ``remove {"ID"}``;
``promote {"ID"}``; ``update {"ID", "peerURLs"}``.

Responses: ``{"header": {cluster_id, member_id, raft_term}, "members": [...]}`` (``add`` also
``"member"``); a member is ``{"ID", "name", "peerURLs", "clientURLs", "isLearner"}`` with empty
fields left out (etcd's gateway omits zero values: an added member that has not started has no
name and no client URLs, a voter has no ``isLearner``). The header has no revision (etcd's
cluster responses carry none).

``list`` is answered by any member from its applied registry. The changes are answered by
the leader once the conf change is applied there; a follower forwards the request over HTTP to
the leader's client URL (once: a forwarded request that reaches a non-leader answers etcd's
``not leader``, Unavailable, which clients retry elsewhere). Errors are etcd's texts in the
gateway's error shape (``kvserver.membership.reconfig`` lists them).
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from kvserver.kvpb.member import Member
from kvserver.kvpb.service_errors import GrpcCode, ServiceError

from . import forward, gateway_json
from .common import LIMITS_KEY, SERVICE_KEY, dumps, json_response, read_body

_UINT64_MAX = (1 << 64) - 1
_DECIMAL = re.compile(r"[0-9]{1,20}", re.ASCII)


def _invalid(message: str) -> ServiceError:
    return ServiceError(GrpcCode.INVALID_ARGUMENT, "raftkv: " + message)


def _object(body: bytes) -> dict[str, Any]:
    obj = gateway_json.parse_json(body)
    if obj is None:
        return {}
    if type(obj) is not dict:
        raise _invalid("body: expected a JSON object")
    return obj


def _uint64(obj: dict[str, Any], name: str) -> int:
    raw = obj.get(name)
    if raw is None:
        return 0
    if type(raw) is int:
        value = raw
    elif type(raw) is str and _DECIMAL.fullmatch(raw):
        value = int(raw)
    else:
        raise _invalid(
            f'field "{name}": expected a 64-bit unsigned integer (a JSON integer '
            f"or a decimal string)"
        )
    if not 0 <= value <= _UINT64_MAX:
        raise _invalid(f'field "{name}": {value} is out of the uint64 range')
    return value


def _urls(obj: dict[str, Any], name: str) -> list[str]:
    raw = obj.get(name)
    if raw is None:
        return []
    if type(raw) is not list or any(type(u) is not str for u in raw):
        raise _invalid(f'field "{name}": expected an array of strings')
    return raw


def _bool(obj: dict[str, Any], name: str) -> bool:
    raw = obj.get(name)
    if raw is None:
        return False
    if raw is not True and raw is not False:
        raise _invalid(f'field "{name}": expected true or false')
    return raw


def member_json(m: Member) -> dict[str, Any]:
    out: dict[str, Any] = {"ID": str(m.id)}
    if m.name:
        out["name"] = m.name
    if m.peer_urls:
        out["peerURLs"] = list(m.peer_urls)
    if m.client_urls:
        out["clientURLs"] = list(m.client_urls)
    if m.is_learner:
        out["isLearner"] = True
    return out


def response_json(resp: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"header": gateway_json.header(resp.header)}
    member = getattr(resp, "member", None)
    if member is not None:
        out["member"] = member_json(member)
    out["members"] = [member_json(m) for m in resp.members]
    return out


def _render(resp: Any) -> web.Response:
    return json_response(dumps(response_json(resp)).encode("ascii"))


async def _body(request: web.Request) -> bytes:
    return await read_body(request, request.app[LIMITS_KEY].max_body_bytes)


async def _change(request: web.Request, body: bytes, call) -> web.Response:
    """Run a member change; on a follower, forward it once to the leader."""
    try:
        return _render(await call(request.app[SERVICE_KEY]))
    except ServiceError as exc:
        if not forward.forwardable(request, exc):
            raise
        refused = exc
    return await forward.to_leader(request, body, refused)


async def member_list(request: web.Request) -> web.Response:
    _object(await _body(request))  # MemberListRequest: "linearizable" (3.5) is ignored
    return _render(await request.app[SERVICE_KEY].member_list())


async def member_add(request: web.Request) -> web.Response:
    body = await _body(request)
    obj = _object(body)
    urls, learner = _urls(obj, "peerURLs"), _bool(obj, "isLearner")
    return await _change(request, body, lambda s: s.member_add(urls, learner))


async def member_remove(request: web.Request) -> web.Response:
    body = await _body(request)
    mid = _uint64(_object(body), "ID")
    return await _change(request, body, lambda s: s.member_remove(mid))


async def member_promote(request: web.Request) -> web.Response:
    body = await _body(request)
    mid = _uint64(_object(body), "ID")
    return await _change(request, body, lambda s: s.member_promote(mid))


async def member_update(request: web.Request) -> web.Response:
    body = await _body(request)
    obj = _object(body)
    mid, urls = _uint64(obj, "ID"), _urls(obj, "peerURLs")
    return await _change(request, body, lambda s: s.member_update(mid, urls))


ROUTES = (
    ("/cluster/member/list", member_list),
    ("/cluster/member/add", member_add),
    ("/cluster/member/remove", member_remove),
    ("/cluster/member/promote", member_promote),
    ("/cluster/member/update", member_update),
)

__all__ = ["ROUTES", "member_json", "response_json"]
