"""A member's gRPC front-end processes: started, handed connections, replaced, stopped.

With ``--grpc-frontends N`` (N > 0) a member starts N front-end processes
(``kvserver.api.grpc.frontend``) and hands them the gRPC connections of its plain-TCP client
URLs, in turn. The member keeps accepting every connection itself and still tells the two
dialects apart by the first bytes (``kvserver.api.grpc.mux``): HTTP/1.1 stays here, and an
HTTP/2 connection goes, with the bytes read so far, to a front end over a Unix socket
(``SCM_RIGHTS``). The front end then serves it and passes each call back over its link
(``FrontendLink``), where the member's own method table runs it.

- A connection stays here when no front end is ready (still starting, or all gone), when its
  client URL is https (a TLS session cannot move to another process), or when the hand-off
  socket is full. So with front ends a member serves exactly what it serves without them.
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
import subprocess
import sys
from typing import Any

from .connection import ServerSettings
from .frontend_link import FrontendLink

log = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 3.0


class FrontendProcess:
    """One front end: its process, its link and the socket that hands it connections."""

    def __init__(
        self, process: subprocess.Popen[bytes], link: FrontendLink, handoff: socket.socket
    ):
        self.process = process
        self.link = link
        self.handoff = handoff
        self.handed_off = 0


class FrontendPool:
    def __init__(self, count: int, settings: ServerSettings, max_calls: int = 4096):
        self.count = count
        self.settings = settings
        self.max_calls = max_calls  # calls in flight here from one front end
        self.frontends: list[FrontendProcess] = []
        self.turn = 0
        self.stopping = False
        self.started = 0  # processes started, restarts included
        self.handed_off = 0  # connections handed to front ends
        self.restart_tasks: set[asyncio.Task[None]] = set()

    def hello(self) -> tuple[Any, ...]:
        kinds = {path: method.kind for path, method in self.settings.methods.items()}
        s = self.settings
        return (
            kinds,
            s.max_receive,
            s.keepalive_min_time,
            s.keepalive_interval,
            s.keepalive_timeout,
            dataclasses.asdict(s.limits),
        )

    async def start(self) -> None:
        for _ in range(self.count):
            await self._spawn()

    async def _spawn(self) -> None:
        loop = asyncio.get_running_loop()
        link_here, link_there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handoff_here, handoff_there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        handoff_here.setblocking(False)
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
                ],
                pass_fds=(link_there.fileno(), handoff_there.fileno()),
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
            on_ready=lambda: log.info("gRPC front end %d ready", process.pid),
            on_lost=lambda: self._lost(frontend),
        )
        frontend = FrontendProcess(process, link, handoff_here)
        self.frontends.append(frontend)
        await loop.create_unix_connection(lambda: link, sock=link_here)
        self.started += 1

    def _lost(self, frontend: FrontendProcess) -> None:
        if frontend in self.frontends:
            self.frontends.remove(frontend)
        frontend.handoff.close()
        if self.stopping:
            return
        log.warning("gRPC front end %d went away; starting another", frontend.process.pid)
        task = asyncio.get_running_loop().create_task(self._restart(frontend))
        self.restart_tasks.add(task)
        task.add_done_callback(self.restart_tasks.discard)

    async def _restart(self, frontend: FrontendProcess) -> None:
        await asyncio.sleep(RESTART_DELAY_S)
        await asyncio.to_thread(_reap, frontend.process, STOP_TIMEOUT_S)
        if not self.stopping:
            await self._spawn()

    def budgets(self) -> dict[str, int]:
        """How often the front ends' clients met each budget (the live processes' counts)."""
        total: dict[str, int] = {}
        for frontend in self.frontends:
            for name, n in frontend.link.frontend_budgets.items():
                total[name] = total.get(name, 0) + n
        return total

    @property
    def ready(self) -> int:
        return sum(1 for f in self.frontends if f.link.ready)

    def hand_off(self, transport: asyncio.BaseTransport, first: bytes) -> bool:
        """Passes a client's HTTP/2 connection to a front end; False if it stays here."""
        if transport.get_extra_info("sslcontext") is not None:
            return False
        ready = [f for f in self.frontends if f.link.ready]
        if not ready:
            return False
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        self.turn += 1
        frontend = ready[self.turn % len(ready)]
        try:
            socket.send_fds(frontend.handoff, [first], [sock.fileno()])
        except OSError:  # full, or the front end is gone: serve it here
            return False
        # The front end holds the connection now; closing this process's descriptor does not
        # end it (no shutdown, and the socket lives on in the other process).
        transport.pause_reading()  # type: ignore[attr-defined]
        transport.abort()  # type: ignore[attr-defined]
        frontend.handed_off += 1
        self.handed_off += 1
        return True

    async def stop(self) -> None:
        self.stopping = True
        for task in list(self.restart_tasks):
            task.cancel()
        frontends, self.frontends = self.frontends, []
        for frontend in frontends:
            frontend.link.close()
            frontend.handoff.close()
        await asyncio.gather(
            *(asyncio.to_thread(_reap, f.process, STOP_TIMEOUT_S) for f in frontends)
        )


def _reap(process: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
