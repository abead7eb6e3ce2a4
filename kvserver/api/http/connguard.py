"""Client-port connection limits aiohttp does not have (see docs/operations.md).

aiohttp closes idle keep-alive connections (``keepalive_timeout``) but gives no deadline for
the headers or the body of a request and no bound on open connections: 1,000 clients
trickling header bytes, or sending half a body, hold 1,000 sockets (and file descriptors)
for ever. ``ConnectionGuard`` adds, per listener of the client app:

- **a bound on open connections** (``max_connections``): a connection accepted beyond it is
  closed at once (counted in ``refused``), so the member keeps file descriptors for the
  clients it is serving and for its WAL and peers;
- **a header deadline** (``header_timeout_s``): from the moment a connection opens, and again
  from the end of each request, the next request's headers must arrive within this time,
  else the connection is closed (``timed_out``). A request being handled has no such
  deadline (a watch stream lives as long as its client);
- **a body deadline** (``body_timeout_s``, the ``middleware``): a request with a
  Content-Length must deliver its whole body within this time, else it gets 408 (an etcd or
  REST error body, code DeadlineExceeded) and the connection is closed. Streaming requests (``/watch``: watch requests keep coming on the
  body) are left alone;
- **an idle timeout** (``idle_timeout_s``): a kept-alive connection with no new request for
  this long is closed (aiohttp's ``keepalive_timeout``, which ``runner`` sets to it); the
  header deadline starts at the first byte of the next request.

Usage (kvserver.assembly.member): ``guard = ConnectionGuard(limits)``; add ``guard.middleware`` as the
innermost middleware of the app; ``runner = guard.runner(app, **kw)``. ``raise_nofile_limit``
raises the open-file soft limit to the hard limit (Go does so for etcd at start).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from kvserver.api.http.common import LIMITS_KEY, etcd_error_body, json_response, rest_error_body
from kvserver.kvpb.service_errors import GrpcCode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 4096
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 60.0


class _Conn(asyncio.Protocol):
    """Wraps aiohttp's RequestHandler: forwards every event, adds the header deadline."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.active = 0  # requests of this connection inside a handler
        self.admitted = False
        self.idle = False  # between requests, no byte of the next one yet

    def connection_made(self, transport) -> None:
        self.transport = transport
        guard = self.guard
        if len(guard.open) >= guard.limits.max_connections:
            guard.refused += 1
            transport.abort()
            return
        self.admitted = True
        guard.open[transport] = self
        self.inner.connection_made(transport)
        self.arm(guard.limits.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if self.idle and self.active == 0:  # a new request begins: its headers are due
            self.idle = False
            self.arm(self.guard.limits.header_timeout_s)
        self.inner.data_received(data)

    def eof_received(self):
        if self.admitted:
            return self.inner.eof_received()
        return None

    def connection_lost(self, exc) -> None:
        self.disarm()
        if self.admitted and self.transport is not None:
            self.guard.open.pop(self.transport, None)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()

    # --- sent away (a client URL's front end has taken over) -------------------------------

    def close(self) -> None:
        """Close once the answer in progress is out (aiohttp's ``RequestHandler.close``)."""
        if self.admitted:
            cast(RequestHandler, self.inner).close()

    def force_close(self) -> None:
        """Close now, whatever is running."""
        if self.admitted:
            cast(RequestHandler, self.inner).force_close()

    # --- the header deadline -------------------------------------------------------------

    def arm(self, delay_s: float) -> None:
        self.disarm()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(delay_s, self._expired)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if self.active == 0 and self.transport is not None and not self.transport.is_closing():
            self.guard.timed_out += 1  # the next request's headers were due, not received
            self.transport.close()

    def request_started(self) -> None:
        self.active += 1
        self.idle = False
        self.disarm()

    def request_finished(self) -> None:
        self.active -= 1
        if self.active == 0:
            # Idle until the next request's first byte; closing an idle connection is
            # aiohttp's own keepalive_timeout (set to idle_timeout_s by ``runner``), so no
            # timer of ours runs between requests.
            self.idle = True


class _GuardedServer:
    """aiohttp's ``web.Server`` with each protocol wrapped in ``_Conn`` (everything else is
    the server's own: shutdown, connections, ...)."""

    def __init__(self, guard: ConnectionGuard, inner: web.Server):
        self._guard = guard
        self._inner = inner

    def __call__(self) -> asyncio.Protocol:
        return _Conn(self._guard, self._inner())

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _GuardedRunner(web.AppRunner):
    def __init__(self, guard: ConnectionGuard, app: web.Application, **kwargs):
        super().__init__(app, **kwargs)
        self._guard = guard

    async def _make_server(self):
        return _GuardedServer(self._guard, await super()._make_server())


class ConnectionGuard:
    def __init__(self, limits: ConnectionLimits = ConnectionLimits()):
        self.limits = limits
        self.open: dict[asyncio.BaseTransport, _Conn] = {}
        self.refused = 0  # connections closed at once: max_connections were open
        self.timed_out = 0  # connections closed: no request headers in time
        self.slow_bodies = 0  # requests answered 408: body not received in time

    def runner(self, app: web.Application, **kwargs) -> web.AppRunner:
        """An AppRunner whose connections this guard limits (kwargs: AppRunner's)."""
        kwargs.setdefault("keepalive_timeout", self.limits.idle_timeout_s)
        return _GuardedRunner(self, app, **kwargs)

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        conn = self.open.get(request.transport) if request.transport is not None else None
        if conn is not None:
            conn.request_started()
        try:
            declared = request.content_length
            limits = request.app.get(LIMITS_KEY)
            if (
                declared
                and not request.path.endswith("/watch")
                and (limits is None or declared <= limits.max_body_bytes)
            ):
                try:
                    async with asyncio.timeout(self.limits.body_timeout_s):
                        await request.read()  # cached: the handler's read gets it at once
                except TimeoutError:
                    self.slow_bodies += 1
                    return _body_timeout_response(request, self.limits.body_timeout_s)
            return await handler(request)
        finally:
            if conn is not None:
                conn.request_finished()

    def stats(self) -> dict:
        return {
            "open": len(self.open),
            "refused": self.refused,
            "timed_out": self.timed_out,
            "slow_bodies": self.slow_bodies,
        }


def _body_timeout_response(request: web.Request, timeout_s: float) -> web.Response:
    """408 in the request's dialect, closing the connection once sent: the rest of the body
    may still come and must not be read as the next request."""
    message = f"raftkv: request body not received within {timeout_s:g} s"
    code = int(GrpcCode.DEADLINE_EXCEEDED)
    body = (
        rest_error_body(code, message)
        if request.path.startswith("/v1/")
        else etcd_error_body(code, message)
    )
    resp = json_response(body, 408)
    resp.force_close()
    return resp


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft limit of open files to the hard limit; return (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        target = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else soft
    else:
        target = hard
    if soft != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # e.g. a container's stricter limit
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft, hard
