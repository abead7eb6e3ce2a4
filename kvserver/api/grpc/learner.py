"""While this member is a learner it answers over gRPC only what etcd's learner answers.

etcd 3.4's interceptors: a learner (it receives the log but does not vote, and its state may
lag) serves ``Maintenance.Status`` and serializable ``KV.Range`` only. Every other unary call
and every stream is refused with Unavailable ``etcdserver: rpc not supported for learner``,
which clients take as "try another endpoint".

``refuse_on_learner(methods, is_learner)`` returns the method table with each handler
wrapped; ``is_learner()`` is asked per call, since a learner is promoted while it serves.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from kvserver.kvpb.service_errors import MSG_NOT_FOR_LEARNER

from .rpc import UNARY_UNARY, Method, RpcContext

STATUS_PATH = "/etcdserverpb.Maintenance/Status"
RANGE_PATH = "/etcdserverpb.KV/Range"


def refuse_on_learner(
    methods: dict[str, Method], is_learner: Callable[[], bool]
) -> dict[str, Method]:
    out = {}
    for path, method in methods.items():
        if path == STATUS_PATH:
            out[path] = method
        elif method.kind == UNARY_UNARY:
            wrapped = _unary(method.handler, is_learner, serializable_ok=path == RANGE_PATH)
            out[path] = Method(wrapped, method.request_type, method.kind)
        else:
            out[path] = Method(
                _stream(method.handler, is_learner), method.request_type, method.kind
            )
    return out


def _unary(
    handler: Callable[..., Any], is_learner: Callable[[], bool], *, serializable_ok: bool
) -> Callable[..., Any]:
    def guarded(request: Any, context: RpcContext) -> Awaitable[Any]:
        if is_learner() and not (serializable_ok and request.serializable):
            return _refuse(context)
        return handler(request, context)  # the handler's own coroutine: no extra frame

    return guarded


def _stream(handler: Callable[..., Any], is_learner: Callable[[], bool]) -> Callable[..., Any]:
    def guarded(requests: Any, context: RpcContext) -> Any:
        if is_learner():
            return _refuse(context)
        return handler(requests, context)  # the handler's own generator: no extra layer

    return guarded


async def _refuse(context: RpcContext) -> None:
    await context.abort(grpc.StatusCode.UNAVAILABLE, MSG_NOT_FOR_LEARNER)
