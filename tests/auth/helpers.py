"""Shared pieces of the auth tests: an auth-enabled ``LocalKV`` whose ``AuthService`` applies
its entries at once (no raft) on a fake clock, and the client API over it on a loopback port
in a loop thread (``AuthServed``), counting authentications."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kvserver.api.http import build_client_app
from kvserver.auth import AuthService
from kvserver.auth.tokens import FailureLimiter, TokenTable
from kvserver.server.metrics import Metrics
from tests.api.fakes import LocalKV
from tests.client.fakeserver import LoopThread, _free_port


class Clock:
    """A clock that moves only when a test sets ``t``."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def auth_kv(clock: Clock | None = None, burst: int = 5) -> LocalKV:
    kv = LocalKV()
    clock = clock or Clock()

    async def propose(payload: bytes) -> Any:
        result = kv.auth.apply_entry(payload)
        if isinstance(result, Exception):
            raise result
        return result

    kv.auth = AuthService(
        propose=propose,
        tokens=TokenTable(60.0, clock=clock),  # type: ignore
        limiter=FailureLimiter(burst=burst, rate_per_s=0.5, clock=clock),
        hash_n=16,
    )
    return kv


class AuthServed:
    """The client API over an auth-enabled ``LocalKV`` on a loopback port, in a loop thread;
    counts authentications."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kv = auth_kv(burst=50)
        self.authentications = 0
        original = self.kv.auth.authenticate

        async def counted(*args: Any) -> str:
            self.authentications += 1
            return await original(*args)

        self.kv.auth.authenticate = counted  # type: ignore[method-assign]
        self.loop_thread = LoopThread()
        self.runner: web.AppRunner | None = None

    async def _start(self) -> None:
        self.runner = web.AppRunner(
            build_client_app(self.kv, Metrics(process_metrics=False)), access_log=None
        )
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    def start(self) -> AuthServed:
        self.loop_thread.run(self._start())
        return self

    def close(self) -> None:
        if self.runner is not None:
            self.loop_thread.run(self.runner.cleanup())
        self.loop_thread.close()
