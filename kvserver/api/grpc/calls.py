"""What every gRPC handler does around its service call: who is calling, and errors as status.

- ``Calls.user(context)``: the user a call acts as, as etcd resolves it. With auth enabled, the ``token`` metadata (from ``Authenticate``) names the user; without a
  token, a verified client certificate's common name does (``--client-cert-auth``); with
  neither, ``etcdserver: user name is empty``. With auth disabled: None (no checks). A call
  another member forwarded (metadata ``x-raftkv-forwarded``, ``kvserver.api.grpc.forward``)
  acts by its token only: the connection's certificate is the forwarding member's.
- ``Calls.run(context, coro)``: awaits a service call and turns a client-visible failure
  (``EtcdError``: etcd's code and text) into the gRPC status etcd would send, e.g.
  ``etcdserver: mvcc: required revision has been compacted`` as OutOfRange. Anything else
  is logged and answered Internal ``raftkv: internal error``: no input crashes the server.
  ``Calls.unary(body)`` is the handler of a unary method whose ``body(request, context)``
  runs that way; the servicers register their bodies through it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from kvserver.kvpb.errors import EtcdError

from .rpc import ClientIdentity, Method, RpcAbort, RpcContext

log = logging.getLogger(__name__)

T = TypeVar("T")

MSG_INTERNAL = "raftkv: internal error"
_STATUS_BY_CODE = {status.value[0]: status for status in grpc.StatusCode}


def status_of(code: int) -> grpc.StatusCode:
    return _STATUS_BY_CODE.get(int(code), grpc.StatusCode.UNKNOWN)


FORWARDED_KEY = "x-raftkv-forwarded"  # metadata of a call a member forwarded to the leader


def metadata_value(context: RpcContext, name: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


def is_forwarded(context: RpcContext) -> bool:
    return metadata_value(context, FORWARDED_KEY) is not None


HASLEADER_KEY = "hasleader"  # etcd's rpctypes.MetadataRequireLeaderKey
HASLEADER_VALUE = "true"


def requires_leader(context: RpcContext) -> bool:
    """The client asked for a stream that only lives while this member knows a leader
    (clientv3's ``WithRequireLeader``; etcdctl's watch sends it): etcd refuses such a stream
    on a member without a leader, Unavailable ``etcdserver: no leader``."""
    return metadata_value(context, HASLEADER_KEY) == HASLEADER_VALUE  # the first value only


class Calls:
    def __init__(self, auth: Any, max_request_bytes: int):
        self.auth = auth  # kvserver.auth.service.AuthService, or None (tests without auth)
        self.max_request_bytes = max_request_bytes  # --max-request-bytes

    def caller(self, context: RpcContext) -> ClientIdentity:
        return context.identity

    def user(self, context: RpcContext) -> str | None:
        """The user this call acts as (None: auth is disabled). Raises etcd's auth errors."""
        who = self.caller(context)
        auth = self.auth
        if auth is None or not auth.enabled:
            return None
        token = metadata_value(context, "token")
        if token or is_forwarded(context):  # forwarded: the certificate is a member's
            return auth.user_for(token)
        if who.cert_common_name:
            return who.cert_common_name
        return auth.user_for(None)  # raises: user name is empty

    def token_user(self, context: RpcContext) -> str | None:
        """For the Auth service's own calls: the caller if it sent a token or a certificate,
        else None (e.g. ``Authenticate``, ``AuthStatus``)."""
        who = self.caller(context)
        auth = self.auth
        if auth is None or not auth.enabled:
            return None
        token = metadata_value(context, "token")
        if token:
            return auth.user_for(token)
        return who.cert_common_name

    async def run(self, context: RpcContext, call: Awaitable[T]) -> T:
        try:
            return await call
        except RpcAbort:
            raise  # the call already chose its status
        except EtcdError as exc:
            await self.abort(context, exc)
        except Exception:
            log.exception("a gRPC call failed")
            await context.abort(grpc.StatusCode.INTERNAL, MSG_INTERNAL)
        raise AssertionError("unreachable")  # context.abort raises

    def unary(
        self, body: Callable[[Any, RpcContext], Awaitable[T]]
    ) -> Callable[[Any, RpcContext], Awaitable[T]]:
        """A unary method's handler: ``body(request, context)`` under ``run``, so its
        failures reach the client as etcd's statuses."""

        async def handle(request: Any, context: RpcContext) -> T:
            return await self.run(context, body(request, context))

        return handle

    async def abort(self, context: RpcContext, exc: EtcdError) -> NoReturn:
        await context.abort(status_of(exc.grpc_code), exc.message)
        raise AssertionError("unreachable")


def service_handler(name: str, methods: dict[str, tuple[Any, ...]]) -> dict[str, Method]:
    """The method table of service ``name`` for ``{method: (handler, request class[, kind])}``;
    kind is ``unary_unary`` (default), ``unary_stream`` or ``stream_stream``."""
    return {
        f"/{name}/{method}": Method(fn, kind, *shape)
        for method, (fn, kind, *shape) in methods.items()
    }
