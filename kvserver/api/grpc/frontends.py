"""A member's client front-end processes: started, given the client URLs, replaced, stopped.

With ``--client-frontends N`` (N > 0; ``raftkv serve`` defaults to one per core beyond the
first) a member opens its client URLs' listening sockets and does not accept on them: it
starts N front-end processes (``kvserver.api.grpc.frontend``) that inherit the sockets and
accept every client connection themselves, TLS included, so the handshake, HTTP/2 and every
per-connection budget cost the front ends' cores and never the raft loop's. A front end
serves gRPC itself and passes each call over its link (``FrontendLink``), where the member's
own method table runs it, except Watch streams, which it keeps and feeds from one member-side
watcher per distinct watch (``kvserver.api.grpc.watch_feeds``); it passes HTTP/1.1 connections to the member over its hand-off
socket (``kvserver.api.grpc.handoff``: the socket itself for plain TCP, a relay of the
plaintext for TLS), and the member serves them with its HTTP app.

- While no front end is ready (all starting, or gone), the member accepts on the sockets
  itself and serves both dialects (``fallback``), so a client URL never stops answering;
  it stops again as soon as one is ready.
- A front end that exits is started again after ``RESTART_DELAY_S``; its clients lose their
  connections and reconnect, as they would to a restarted etcd grpc-proxy.
- ``stop()`` closes the links (each front end sends its clients GOAWAY and exits) and waits
  for the processes, killing what is left after ``STOP_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from kvserver.tls import TLSInfo

from . import frontend_wire as wire
from .connection import ServerSettings
from .frontend_link import FrontendLink
from .handoff import ConnectionReceiver, handoff_pair
from .mux import ClientPortProtocol
from .watch_feeds import WatchFeeds

log = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 3.0
RETIRE_GRACE_S = 10.0  # what a fallback connection still runs this long after GOAWAY is cut


@dataclasses.dataclass
class ClientListener:
    """One client URL's listening socket; ``tls`` is its context on an https URL."""

    sock: socket.socket
    tls: ssl.SSLContext | None


class FrontendProcess:
    """One front end: its process, its link, and the socket its HTTP/1.1 clients come by."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        link: FrontendLink,
        receiver: ConnectionReceiver,
    ):
        self.process = process
        self.link = link
        self.receiver = receiver


class FrontendPool:
    def __init__(
        self,
        count: int,
        settings: ServerSettings,
        max_calls: int,
        listeners: list[ClientListener],
        http_protocol: Callable[[], asyncio.Protocol],
        fallback_protocol: Callable[[], asyncio.Protocol],
        tls: TLSInfo | None = None,
        watch_feeds: Callable[[FrontendLink], WatchFeeds] | None = None,
        watch_limits: dict[str, int] | None = None,
    ):
        self.count = count
        self.watch_feeds = watch_feeds  # the member's end of the front ends' watches
        self.watch_limits = watch_limits  # for the front ends' own checks of Watch streams
        self.settings = settings
        self.max_calls = max_calls  # calls in flight here from one front end
        self.listeners = listeners
        self.http_protocol = http_protocol  # serves an HTTP/1.1 connection a front end passed
        self.fallback_protocol = fallback_protocol  # both dialects, while no front end is ready
        self.tls = tls
        self.frontends: list[FrontendProcess] = []
        self.fallback: list[asyncio.Server] = []
        # accepted while no front end was ready; closed ones pruned each time the list doubles
        self.fallback_connections: list[ClientPortProtocol] = []
        self.fallback_prune_at = 64
        self.stopping = False
        self.started = 0  # processes started, restarts included
        self.restart_tasks: set[asyncio.Task[None]] = set()

    def hello(self) -> tuple[Any, ...]:
        kinds = {path: method.kind for path, method in self.settings.methods.items()}
        s = self.settings
        tls = dataclasses.asdict(self.tls) if self.tls is not None else None
        return (
            kinds,
            s.max_receive,
            s.keepalive_min_time,
            s.keepalive_interval,
            s.keepalive_timeout,
            dataclasses.asdict(s.limits),
            tls,
            self.watch_limits if self.watch_feeds is not None else None,
            wire.LINK_VERSION,
        )

    async def start(self) -> None:
        await self._serve_fallback()  # until a front end says READY
        for _ in range(self.count):
            await self._spawn()

    async def _spawn(self) -> None:
        loop = asyncio.get_running_loop()
        link_here, link_there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handoff_here, handoff_there = handoff_pair()
        listen_args = []
        for listener in self.listeners:
            fd = listener.sock.fileno()
            listen_args += ["--listen-fd", f"{fd}:{'tls' if listener.tls else 'plain'}"]
        try:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kvserver.api.grpc.frontend",
                    "--link-fd",
                    str(link_there.fileno()),
                    "--handoff-fd",
                    str(handoff_there.fileno()),
                    *listen_args,
                ],
                pass_fds=(
                    link_there.fileno(),
                    handoff_there.fileno(),
                    *(listener.sock.fileno() for listener in self.listeners),
                ),
                stdin=subprocess.DEVNULL,
            )
        finally:
            link_there.close()
            handoff_there.close()
        link = FrontendLink(
            self.settings.methods,
            self.settings.calls,
            self.hello(),
            max_calls=self.max_calls,
            budgets=self.settings.budgets,
            on_ready=lambda: self._ready(frontend),
            on_lost=lambda: self._lost(frontend),
            watch_feeds=self.watch_feeds,
        )
        receiver = ConnectionReceiver(handoff_here, self.http_protocol)
        frontend = FrontendProcess(process, link, receiver)
        self.frontends.append(frontend)
        await loop.create_unix_connection(lambda: link, sock=link_here)
        self.started += 1

    def _ready(self, frontend: FrontendProcess) -> None:
        log.info("client front end %d ready", frontend.process.pid)
        self._stop_fallback()

    def _lost(self, frontend: FrontendProcess) -> None:
        if frontend in self.frontends:
            self.frontends.remove(frontend)
        frontend.receiver.stop()
        frontend.receiver.channel.close()
        if self.stopping:
            return
        log.warning("client front end %d went away; starting another", frontend.process.pid)
        loop = asyncio.get_running_loop()
        if not self.ready:
            self._track(loop.create_task(self._serve_fallback()))
        self._track(loop.create_task(self._restart(frontend)))

    def _track(self, task: asyncio.Task[None]) -> None:
        self.restart_tasks.add(task)
        task.add_done_callback(self.restart_tasks.discard)

    async def _restart(self, frontend: FrontendProcess) -> None:
        await asyncio.sleep(RESTART_DELAY_S)
        await asyncio.to_thread(_reap, frontend.process, STOP_TIMEOUT_S)
        if not self.stopping:
            await self._spawn()

    # --- the member accepts while no front end is ready ----------------------------------------

    async def _serve_fallback(self) -> None:
        if self.fallback or self.stopping:
            return
        loop = asyncio.get_running_loop()
        for listener in self.listeners:
            # a duplicate of the socket: closing this server must leave the front ends' open
            server = await loop.create_server(
                self._fallback_connection, sock=listener.sock.dup(), ssl=listener.tls
            )
            self.fallback.append(server)
        if self.ready:  # a front end became ready meanwhile
            self._stop_fallback()

    def _fallback_connection(self) -> asyncio.Protocol:
        protocol = self.fallback_protocol()
        if isinstance(protocol, ClientPortProtocol):
            if len(self.fallback_connections) >= self.fallback_prune_at:
                live = [c for c in self.fallback_connections if not c.closed()]
                self.fallback_connections = live
                self.fallback_prune_at = max(64, 2 * len(live))
            self.fallback_connections.append(protocol)
        return protocol

    def _stop_fallback(self) -> None:
        """Stop accepting, and send the clients accepted meanwhile to the front ends: a
        connection lives long (gRPC clients keep theirs), and one left here would keep its
        client's calls on the raft loop for good."""
        servers, self.fallback = self.fallback, []
        for server in servers:
            server.close()
        connections, self.fallback_connections = self.fallback_connections, []
        for connection in connections:
            connection.retire(RETIRE_GRACE_S)

    # --- state ----------------------------------------------------------------------------------

    @property
    def ready(self) -> int:
        return sum(1 for f in self.frontends if f.link.ready)

    @property
    def handed_off(self) -> int:
        """HTTP/1.1 connections front ends passed to this member (live processes only)."""
        return sum(f.receiver.received for f in self.frontends)

    @property
    def calls_served(self) -> int:
        """gRPC calls the front ends passed to this member (live processes only)."""
        return sum(f.link.calls_served for f in self.frontends)

    def budgets(self) -> dict[str, int]:
        """How often the front ends' clients met each budget (the live processes' counts)."""
        total: dict[str, int] = {}
        for frontend in self.frontends:
            for name, n in frontend.link.frontend_budgets.items():
                total[name] = total.get(name, 0) + n
        return total

    async def stop(self) -> None:
        self.stopping = True
        for task in list(self.restart_tasks):
            task.cancel()
        self._stop_fallback()
        frontends, self.frontends = self.frontends, []
        for frontend in frontends:
            frontend.link.close()
            frontend.receiver.stop()
            frontend.receiver.channel.close()
        await asyncio.gather(
            *(asyncio.to_thread(_reap, f.process, STOP_TIMEOUT_S) for f in frontends)
        )
        for listener in self.listeners:
            listener.sock.close()


def _reap(process: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
