"""The real client API (``build_client_app``) over in-memory stores, served on loopback ports
by an event loop in a background thread, so tests may use the blocking client, the CLI and
async clients from the main thread.

``Served`` is one ``LeaseKV`` (a ``LocalKV`` with leases that records the ids of lease writes
and can fail or delay them) reachable at one or more listeners. ``Replicas`` is N ``LocalKV``
replicas that every write goes to, in order; replica 0 is reported as the leader.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from kvserver.api.http import build_client_app
from kvserver.api.http.watch import SESSIONS_KEY
from kvserver.kvpb.kv import DeleteRangeRequest, PutRequest
from kvserver.kvpb.service_errors import no_leader
from kvserver.server.metrics import Metrics
from kvserver.watch.hub import WatchLimits
from tests.api.fakes import LocalKV
from tests.client.fakeserver import LoopThread, _free_port


class LeaseKV(LocalKV):
    """LocalKV that records the (client id, request id) of every grant/revoke that reached it,
    can fail the first attempt of each op in ``fail_once`` with "no leader" (before applying),
    delay the
    answer of the next ``slow_grants`` grants by ``delay_s`` after applying, and counts
    keep-alives that failed."""

    def __init__(self, **kwargs):
        super().__init__(bind_leases=True, **kwargs)
        self.lessor.min_ttl_s = 1  # short leases keep the keep-alive tests quick
        self.write_ids: list[tuple[str, int, int]] = []
        self.fail_once: set[str] = set()
        self.slow_grants = 0
        self.delay_s = 0.0
        self.keepalive_failures = 0

    def _record(self, op: str, client_id: int, request_id: int) -> None:
        self.write_ids.append((op, client_id, request_id))
        if op in self.fail_once:
            self.fail_once.discard(op)
            raise no_leader()

    async def lease_grant(self, ttl_s, lease_id=0, *, client_id=0, request_id=0):
        self._record("grant", client_id, request_id)
        response = await super().lease_grant(
            ttl_s, lease_id, client_id=client_id, request_id=request_id
        )
        if self.slow_grants:
            self.slow_grants -= 1
            await asyncio.sleep(self.delay_s)
        return response

    async def lease_revoke(self, lease_id, *, client_id=0, request_id=0):
        self._record("revoke", client_id, request_id)
        return await super().lease_revoke(lease_id, client_id=client_id, request_id=request_id)

    async def lease_keepalive(self, lease_id):
        try:
            return await super().lease_keepalive(lease_id)
        except Exception:
            self.keepalive_failures += 1
            raise


class Served:
    """One LeaseKV served on ``ports`` HTTP listeners (the same node reachable at several
    endpoints; closing one listener is a failover test)."""

    def __init__(self, listeners: int = 1) -> None:
        self.ports = [_free_port() for _ in range(listeners)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.url = self.urls[0]
        self.kv = LeaseKV(client_url=self.url)
        self.loop_thread = LoopThread()
        self.runners: list[web.AppRunner] = []

    async def _start(self) -> None:
        for port in self.ports:
            app = build_client_app(self.kv, Metrics(process_metrics=False))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)

    def start(self) -> Served:
        self.loop_thread.run(self._start())
        return self

    def stop_listener(self, index: int) -> None:
        runner = self.runners[index]
        self.loop_thread.run(runner.cleanup())

    def run(self, fn):
        """Run ``fn()`` on the server's loop (LocalKV is not thread-safe)."""

        async def call():
            return fn()

        return self.loop_thread.run(call())

    def close(self) -> None:
        for runner in self.runners:
            self.loop_thread.run(runner.cleanup())
        self.loop_thread.close()


class Replicas:
    """N LocalKV replicas served over HTTP on one background loop; writes go to every live
    replica, in order. Replica 0 is reported as the leader."""

    def __init__(self, n: int = 1, watch_limits: WatchLimits | None = None) -> None:
        self.loop_thread = LoopThread()
        self.ports = [_free_port() for _ in range(n)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.kvs = [
            LocalKV(member_id=0x100 + i, client_url=url, watch_limits=watch_limits)
            for i, url in enumerate(self.urls)
        ]
        self.apps: list[web.Application] = []
        self.runners: list[web.AppRunner | None] = []
        self.set_leader(0)

    def set_leader(self, index: int) -> None:
        for kv in self.kvs:
            kv.leader = self.kvs[index].member_id

    async def _start(self) -> None:
        for kv, port in zip(self.kvs, self.ports, strict=True):
            app = build_client_app(kv, Metrics(process_metrics=False))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.apps.append(app)
            self.runners.append(runner)

    def start(self) -> Replicas:
        self.loop_thread.run(self._start())
        return self

    def live(self) -> list[LocalKV]:
        return [kv for kv, r in zip(self.kvs, self.runners, strict=True) if r is not None]

    def write(self, *requests) -> int:
        """Apply the requests to every live replica (on the serving loop); the revision."""

        async def apply() -> int:
            rev = 0
            for req in requests:
                for kv in self.live():
                    if isinstance(req, PutRequest):
                        rev = (await kv.put(req)).header.revision
                    elif isinstance(req, DeleteRangeRequest):
                        rev = (await kv.delete_range(req)).header.revision
                    else:
                        rev = (await kv.compact(req)).header.revision
            return rev

        return self.loop_thread.run(apply())

    def put(self, key: str, value: str) -> int:
        return self.write(PutRequest(key.encode(), value.encode()))

    def stop(self, index: int) -> None:
        """Shut a replica down (open watch streams get a final Unavailable error line)."""
        runner = self.runners[index]
        self.runners[index] = None
        if runner is not None:
            self.loop_thread.run(runner.cleanup())

    def end_streams(self, index: int) -> int:
        """End every watch stream of a replica abruptly (EOF, as a proxy dropping it)."""

        async def end() -> int:
            sessions = list(self.apps[index][SESSIONS_KEY])
            for s in sessions:
                s.stream.close()
            return len(sessions)

        return self.loop_thread.run(end())

    def watchers(self, index: int = 0) -> int:
        return self.loop_thread.run(_value(self.kvs[index].watch_hub.watcher_count))

    def close(self) -> None:
        for i in range(len(self.runners)):
            self.stop(i)
        self.loop_thread.close()


async def _value(x):
    return x
