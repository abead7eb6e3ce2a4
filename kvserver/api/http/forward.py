"""Forwarding a request a follower cannot serve to the leader's client URL (HTTP, once).

etcd forwards leader-only requests (member changes, lease keep-alive and time-to-live) from a
follower to the leader, so a client that knows one endpoint works. raftkv does the same over
HTTP: the handler first tries the service; if it answers ``etcdserver: not leader`` and the
request was not already forwarded, the same body is posted to the leader's client URL (from
the member registry) with ``X-Raftkv-Forwarded: 1``, and the leader's status and body are
relayed unchanged. A forwarded request that reaches a non-leader is answered ``not leader``
(Unavailable, retryable), never forwarded again, so requests cannot loop. When the leader is
unknown or unreachable, the original ``not leader`` error is raised.
"""

from __future__ import annotations

import ssl

import aiohttp
from aiohttp import web

from kvserver.api.shared.leader import FORWARD_TIMEOUT_S, MSG_NOT_LEADER, leader_client_url
from kvserver.kvpb.service_errors import ServiceError

from .common import JSON_CONTENT_TYPE, SERVICE_KEY

FORWARDED_HEADER = "X-Raftkv-Forwarded"
# The member's client TLS dial context (kvserver.tls), for a leader with an https client URL.
FORWARD_SSL_KEY: web.AppKey[ssl.SSLContext | None] = web.AppKey("forward_ssl")


def _forward_headers(request: web.Request) -> dict[str, str]:
    headers = {FORWARDED_HEADER: "1", "Content-Type": JSON_CONTENT_TYPE}
    if "Authorization" in request.headers:  # auth tokens are valid on every member
        headers["Authorization"] = request.headers["Authorization"]
    return headers


def forwardable(request: web.Request, exc: ServiceError) -> bool:
    return exc.message == MSG_NOT_LEADER and FORWARDED_HEADER not in request.headers


async def to_leader(request: web.Request, body: bytes, refused: ServiceError) -> web.Response:
    """Post ``body`` to the same path on the leader and relay its answer; raise ``refused``
    when there is no leader to ask or it cannot be reached."""
    url = leader_client_url(request.app[SERVICE_KEY])
    if url is None:
        raise refused
    ssl_context = request.app.get(FORWARD_SSL_KEY)
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S),
            connector=aiohttp.TCPConnector(ssl=True if ssl_context is None else ssl_context),
        ) as session:
            async with session.post(
                url + request.path, data=body, headers=_forward_headers(request)
            ) as resp:
                payload = await resp.read()
                return web.Response(
                    body=payload, status=resp.status, content_type=JSON_CONTENT_TYPE
                )
    except (aiohttp.ClientError, OSError, TimeoutError):
        raise refused from None
