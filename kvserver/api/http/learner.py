"""While this member is a learner, the gateway answers only what etcd's learner answers.

etcd's gateway reaches its gRPC server, so a learner (it receives the log but does not vote,
and its state may lag) serves ``/v3/maintenance/status`` and a serializable
``/v3/kv/range`` only, under either prefix. Every other v3 request is refused with
Unavailable ``etcdserver: rpc not supported for learner`` (HTTP 503), which clients take as
"try another endpoint". raftkv's own routes (``/health``, ``/metrics``, the dashboard) are
served as on any member.

``learner_middleware`` refuses by path; ``refuse_linearizable_read(request, req)`` is the
range handler's check once it has decoded the body. Whether the member is a learner is
asked per request, since a learner is promoted while it serves.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from kvserver.kvpb import service_errors
from kvserver.kvpb.kv import RangeRequest
from kvserver.server.service import serves_as_learner

from .common import SERVICE_KEY

_PREFIXES = ("/v3/", "/v3beta/")
_SERVED = frozenset({"maintenance/status", "kv/range"})  # the range: serializable only


@web.middleware
async def learner_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    path = request.path
    if path.startswith(_PREFIXES) and path.split("/", 2)[2] not in _SERVED:
        if serves_as_learner(request.app[SERVICE_KEY]):
            raise service_errors.not_for_learner()
    return await handler(request)


def refuse_linearizable_read(request: web.Request, req: RangeRequest) -> None:
    if not req.serializable and serves_as_learner(request.app[SERVICE_KEY]):
        raise service_errors.not_for_learner()
