"""etcd's Auth service through the JSON gateway (``POST /v3/auth/...``) and the request
checks every other endpoint goes through.

Endpoints (bodies and answers in etcd's gateway shapes: proto field names, bytes base64,
defaults omitted, every answer with a ``header``):
``auth/enable``, ``auth/disable``, ``auth/status`` -> ``{enabled, authRevision}``,
``auth/authenticate`` ``{name, password}`` -> ``{token}``,
``auth/user/add`` ``{name, password}``, ``user/get`` ``{name}`` -> ``{roles}``,
``user/list`` -> ``{users}``, ``user/delete`` ``{name}``, ``user/changepw`` ``{name,
password}``, ``user/grant`` ``{user, role}``, ``user/revoke`` ``{name, role}``,
``role/add`` ``{name}``, ``role/get`` ``{role}`` -> ``{perm: [{permType, key, range_end}]}``,
``role/list`` -> ``{roles}``, ``role/delete`` ``{role}``, ``role/grant`` ``{name, perm:
{permType ("READ"|"WRITE"|"READWRITE" or 0..2; ``perm_type`` also accepted), key,
range_end}}``, ``role/revoke`` ``{role, key, range_end}``.
This module decodes the bodies and renders the answers; the calls themselves (who may make
them, the checks in order, what is proposed) are ``kvserver.auth.management``'s, shared with
gRPC: with auth enabled every management call needs the root role except ``authenticate``,
``status``, ``user/get`` of oneself and ``role/get`` of a role one holds. Users without a
password and pre-hashed passwords (``options.no_password``, ``hashedPassword``) are refused.

Credentials. The token from ``authenticate`` travels raw in the ``Authorization`` header (what
etcd's gateway and etcd3gw do; ``Bearer <token>`` is accepted too). ``auth_middleware``
resolves it for every ``/v3`` and ``/v1`` request outside ``/v3/auth/`` and keeps the user
under ``USER_KEY``; the handlers then check keys (``check_request``, ``check_lease_revoke``,
the watch create). Paths and what they need with auth enabled: member add/remove/promote/
update, maintenance (but status) and the REST dialect ``/v1/kv`` need root (the REST dialect
has no per-key check yet); lease, compaction, member list need a valid token; maintenance
status, ``/health``, ``/version``, ``/metrics``, ``/v1/status`` need nothing; under ``/ui/``
the token is resolved when one is sent and ``ui_data`` checks it per endpoint.

Client certificates (etcd's ``AuthInfoFromTLS``). With ``--client-cert-auth`` the TLS
handshake has verified the client's certificate against the trusted CA; a request that carries
no ``Authorization`` header then acts as the user named by the certificate's common name (a
token, when sent, wins, as in etcd). A common name that is no user gets ``permission denied``
on every check. Without client-cert-auth the server asks for no certificate, so there is no
peer certificate and nothing changes. A request forwarded by a follower (``X-Raftkv-Forwarded``)
arrives with the follower's own certificate, which must not become the user: it acts by its
token only (so a certificate-only client's leader-only calls — lease keep-alive through a
follower — are refused ``user name is empty``; send them to the leader or use a token).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from kvserver.auth import errors as E
from kvserver.auth import management as M
from kvserver.auth.management import invalid
from kvserver.auth.perms import Permission, PermType
from kvserver.kvpb.kv import ResponseHeader
from kvserver.tls import peer_common_name

from . import gateway_json
from .common import LIMITS_KEY, SERVICE_KEY, json_response, read_body
from .forward import FORWARDED_HEADER

MSG_PERMISSION_DENIED = E.PermissionDeniedError.default_message
USER_KEY = web.RequestKey("raftkv_auth_user", object)  # the user a request acts as (None: no auth)

_OPEN = ("/health", "/version", "/metrics", "/v1/status")
_UI = "/ui"  # the dashboard: its files are open, its data endpoints check the user (ui_data)
_OPEN_V3 = frozenset({"/maintenance/status", "/cluster/member/list"})
_ROOT_V3_PREFIXES = ("/maintenance/", "/cluster/")


def auth_service(request: web.Request) -> Any:
    return getattr(request.app[SERVICE_KEY], "auth", None)


def _tail(path: str) -> str | None:
    for prefix in ("/v3beta", "/v3"):
        if path.startswith(prefix + "/"):
            return path[len(prefix) :]
    return None


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    auth = auth_service(request)
    if auth is None or not auth.enabled or request.path in _OPEN:
        request[USER_KEY] = None
        return await handler(request)
    if request.path == _UI or request.path.startswith(_UI + "/"):
        request[USER_KEY] = _user_or_none(auth, request)
        return await handler(request)
    tail = _tail(request.path)
    if tail is not None and (tail.startswith("/auth/") or tail in _OPEN_V3):
        request[USER_KEY] = None if tail in _OPEN_V3 else _user_or_none(auth, request)
        return await handler(request)
    header = request.headers.get("Authorization")
    user = auth.user_for(header) if header else (cert_user(request) or auth.user_for(None))
    request[USER_KEY] = user
    if tail is None or tail.startswith(_ROOT_V3_PREFIXES):
        auth.check_admin(user)  # /v1/kv, member changes, maintenance: root only
    return await handler(request)


def _user_or_none(auth: Any, request: web.Request) -> str | None:
    """For auth endpoints: the caller if it sent a token (invalid ones are refused)."""
    header = request.headers.get("Authorization")
    return auth.user_for(header) if header else cert_user(request)


def cert_user(request: web.Request) -> str | None:
    """The common name of the client's verified certificate, or None (no TLS, no certificate:
    the listener only asks for one with --client-cert-auth, and then verifies it)."""
    if FORWARDED_HEADER in request.headers:
        return None  # the forwarding member's certificate, not the client's
    return peer_common_name(request.transport)


def user_of(request: web.Request) -> str | None:
    return request.get(USER_KEY)


def check_request(request: web.Request, req: Any) -> None:
    """The KV checks (range, put, deleterange, txn, compaction) for this request's user."""
    auth = auth_service(request)
    if auth is not None:
        auth.check_request(user_of(request), req)


def check_lease_revoke(request: web.Request, lease_id: int) -> None:
    """etcd: revoking a lease needs write permission on every key attached to it."""
    auth = auth_service(request)
    user = user_of(request)
    if auth is None or user is None or not auth.enabled:
        return
    store = getattr(request.app[SERVICE_KEY], "store", None)
    keys = store.keys_with_lease(lease_id) if store is not None else ()
    for key in keys:
        auth.check_write(user, key)


# --- body decoding ----------------------------------------------------------------------------


async def _body(request: web.Request, allowed: tuple[str, ...]) -> dict[str, Any]:
    obj = gateway_json.parse_json(await read_body(request, request.app[LIMITS_KEY].max_body_bytes))
    if obj is None:
        return {}
    if type(obj) is not dict:
        raise invalid("body: expected a JSON object")
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise invalid(f"body: unknown field {unknown[0][:40]!r}")
    return obj


def _str(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name, "")
    if value is None:
        return ""
    if type(value) is not str:
        raise invalid(f'field "{name}": expected a string')
    return value


def _bytes(obj: dict[str, Any], name: str) -> bytes:
    value = obj.get(name)
    return b"" if value is None else gateway_json._bytes(value, name)


def _password(obj: dict[str, Any]) -> str:
    opts = obj.get("options")
    hashed = bool(obj.get("hashedPassword") or obj.get("hashed_password"))
    no_password = isinstance(opts, dict) and bool(opts.get("no_password") or opts.get("noPassword"))
    return M.new_password(_str(obj, "password"), hashed=hashed, no_password=no_password)


_PW_FIELDS = ("name", "password", "hashedPassword", "hashed_password", "options")


def _perm_type(raw: Any) -> PermType:
    if raw is None:
        return PermType.READ
    if type(raw) is str and raw in PermType.__members__:
        return PermType[raw]
    if type(raw) is int and raw in (0, 1, 2):
        return PermType(raw)
    raise invalid(f'field "perm.permType": expected READ, WRITE or READWRITE, got {raw!r:.40}')


def _perm(obj: dict[str, Any]) -> Permission | None:
    raw = obj.get("perm")
    if raw is None:
        return None
    if type(raw) is not dict:
        raise invalid('field "perm": expected an object')
    for k in raw:
        if k not in ("permType", "perm_type", "key", "range_end", "rangeEnd"):
            raise invalid(f'field "perm": unknown field {k[:40]!r}')
    ptype = _perm_type(raw.get("permType", raw.get("perm_type")))
    return Permission(
        ptype, _bytes(raw, "key"), _bytes(raw, "range_end") or _bytes(raw, "rangeEnd")
    )


# --- rendering --------------------------------------------------------------------------------


def _answer(request: web.Request, fields: dict[str, Any] | None = None) -> web.Response:
    st = request.app[SERVICE_KEY].status()
    h = ResponseHeader(st.cluster_id, st.member_id, st.revision, st.raft_term)
    return json_response(gateway_json.encode({"header": gateway_json.header(h), **(fields or {})}))


def _perm_json(p: Permission) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if p.perm_type != PermType.READ:
        out["permType"] = p.perm_type.name
    if p.key:
        out["key"] = gateway_json.b64(p.key)
    if p.range_end:
        out["range_end"] = gateway_json.b64(p.range_end)
    return out


# --- handlers (the calls themselves are kvserver.auth.management's) ----------------------------


async def auth_enable(request: web.Request) -> web.Response:
    await _body(request, ())
    await M.enable(auth_service(request), user_of(request))
    return _answer(request)


async def auth_disable(request: web.Request) -> web.Response:
    await _body(request, ())
    await M.disable(auth_service(request), user_of(request))
    return _answer(request)


async def auth_status(request: web.Request) -> web.Response:
    await _body(request, ())
    enabled, revision = M.status(auth_service(request))
    fields: dict[str, Any] = {"authRevision": str(revision)}
    if enabled:
        fields = {"enabled": True, **fields}
    return _answer(request, fields)


async def authenticate(request: web.Request) -> web.Response:
    obj = await _body(request, ("name", "password"))
    name, password = _str(obj, "name"), _str(obj, "password")
    token = await M.authenticate(auth_service(request), name, password, request.remote or "unknown")
    return _answer(request, {"token": token})


async def user_add(request: web.Request) -> web.Response:
    obj = await _body(request, _PW_FIELDS)
    name, password = _str(obj, "name"), _password(obj)
    await M.user_add(auth_service(request), user_of(request), name, password)
    return _answer(request)


async def user_get(request: web.Request) -> web.Response:
    obj = await _body(request, ("name",))
    roles = M.user_get(auth_service(request), user_of(request), _str(obj, "name"))
    return _answer(request, {"roles": list(roles)} if roles else {})


async def user_list(request: web.Request) -> web.Response:
    await _body(request, ())
    users = M.user_list(auth_service(request), user_of(request))
    return _answer(request, {"users": users} if users else {})


async def user_delete(request: web.Request) -> web.Response:
    obj = await _body(request, ("name",))
    await M.user_delete(auth_service(request), user_of(request), _str(obj, "name"))
    return _answer(request)


async def user_changepw(request: web.Request) -> web.Response:
    obj = await _body(request, _PW_FIELDS)
    name, password = _str(obj, "name"), _password(obj)
    await M.user_change_password(auth_service(request), user_of(request), name, password)
    return _answer(request)


async def user_grant(request: web.Request) -> web.Response:
    obj = await _body(request, ("user", "role"))
    name, role = _str(obj, "user"), _str(obj, "role")
    await M.user_grant_role(auth_service(request), user_of(request), name, role)
    return _answer(request)


async def user_revoke(request: web.Request) -> web.Response:
    obj = await _body(request, ("name", "role"))
    name, role = _str(obj, "name"), _str(obj, "role")
    await M.user_revoke_role(auth_service(request), user_of(request), name, role)
    return _answer(request)


async def role_add(request: web.Request) -> web.Response:
    obj = await _body(request, ("name",))
    await M.role_add(auth_service(request), user_of(request), _str(obj, "name"))
    return _answer(request)


async def role_get(request: web.Request) -> web.Response:
    obj = await _body(request, ("role",))
    perms = M.role_get(auth_service(request), user_of(request), _str(obj, "role"))
    return _answer(request, {"perm": [_perm_json(p) for p in perms]} if perms else {})


async def role_list(request: web.Request) -> web.Response:
    await _body(request, ())
    roles = M.role_list(auth_service(request), user_of(request))
    return _answer(request, {"roles": roles} if roles else {})


async def role_delete(request: web.Request) -> web.Response:
    obj = await _body(request, ("role",))
    await M.role_delete(auth_service(request), user_of(request), _str(obj, "role"))
    return _answer(request)


async def role_grant(request: web.Request) -> web.Response:
    obj = await _body(request, ("name", "perm"))
    name, perm = _str(obj, "name"), _perm(obj)
    await M.role_grant_permission(auth_service(request), user_of(request), name, perm)
    return _answer(request)


async def role_revoke(request: web.Request) -> web.Response:
    obj = await _body(request, ("role", "key", "range_end", "rangeEnd"))
    role, key = _str(obj, "role"), _bytes(obj, "key")
    range_end = _bytes(obj, "range_end") or _bytes(obj, "rangeEnd")
    await M.role_revoke_permission(auth_service(request), user_of(request), role, key, range_end)
    return _answer(request)


ROUTES = (
    ("/auth/enable", auth_enable),
    ("/auth/disable", auth_disable),
    ("/auth/status", auth_status),
    ("/auth/authenticate", authenticate),
    ("/auth/user/add", user_add),
    ("/auth/user/get", user_get),
    ("/auth/user/list", user_list),
    ("/auth/user/delete", user_delete),
    ("/auth/user/changepw", user_changepw),
    ("/auth/user/grant", user_grant),
    ("/auth/user/revoke", user_revoke),
    ("/auth/role/add", role_add),
    ("/auth/role/get", role_get),
    ("/auth/role/list", role_list),
    ("/auth/role/delete", role_delete),
    ("/auth/role/grant", role_grant),
    ("/auth/role/revoke", role_revoke),
)
