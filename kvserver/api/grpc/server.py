"""This member's gRPC server: etcd's services over the same ``KVService`` as the JSON gateway.

``GrpcServer(service, auth, max_request_bytes=...)`` holds the method table of the six
services and the settings every connection shares. In a member without front ends, its
client URLs' listeners give it each connection that opens with the HTTP/2 preface
(``kvserver.api.grpc.mux``), and ``connection(identity)`` makes the protocol that serves it
(``GrpcConnection``) on this member's event loop. ``start_frontends(...)`` instead starts
client front-end processes that accept on the client URLs themselves
(``kvserver.api.grpc.frontends``), serve the HTTP/2 side on other cores and send each call
back to this method table. ``await stop()`` sends every connection GOAWAY, lets running
calls end for a moment, then closes what is left and stops the front ends.

Settings, as etcd's server has them:

- messages up to ``--max-request-bytes`` + 512 KiB are received (etcd's
  ``MaxRequestBytes + grpcOverheadBytes``); answers of any size are sent;
- keepalive enforcement: clients may ping every 5 s, with or without calls in flight (etcd's
  ``--grpc-keepalive-min-time``; etcdctl pings every 10 s and an idle watch must not be
  dropped for "too many pings"); the server pings an idle client every 2 h and drops it after
  20 s without an answer (etcd's ``--grpc-keepalive-interval`` and ``-timeout``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc

from kvserver.api.shared.snapshot_capture import SnapshotGate
from kvserver.server.service import serves_as_learner
from kvserver.tls import TLSInfo
from kvserver.watch.hub import WatchLimits

from .auth import AuthServicer
from .budgets import Http2Limits
from .calls import Calls
from .cluster import ClusterServicer
from .connection import GrpcConnection, ServerSettings
from .forward import LeaderForwarder
from .frontends import ClientListener, FrontendPool
from .kv import KVServicer
from .learner import refuse_on_learner
from .lease import LeaseServicer
from .maintenance import MaintenanceServicer
from .metrics import GrpcCollector
from .rpc import ClientIdentity, Method
from .watch import WatchServicer
from .watch_feeds import WatchFeeds

GRPC_OVERHEAD_BYTES = 512 * 1024
KEEPALIVE_MIN_TIME_S = 5.0
KEEPALIVE_INTERVAL_S = 2 * 3600.0
KEEPALIVE_TIMEOUT_S = 20.0
STOP_POLL_S = 0.02


class GrpcServer:
    def __init__(
        self,
        service: Any,
        auth: Any,
        *,
        max_request_bytes: int,
        forward_credentials: grpc.ChannelCredentials | None = None,
        limits: Http2Limits | None = None,
        snapshot_gate: SnapshotGate | None = None,
    ):
        self.snapshot_gate = snapshot_gate or SnapshotGate()
        self.service = service
        self.calls = Calls(auth, max_request_bytes)
        # https leaders need this member's client TLS credentials (kvserver.api.grpc.forward)
        self.forwarder = LeaderForwarder(service, forward_credentials)
        self.max_request_bytes = max_request_bytes
        self.settings = ServerSettings(
            self.methods(),
            max_receive=max_request_bytes + GRPC_OVERHEAD_BYTES,
            keepalive_min_time=KEEPALIVE_MIN_TIME_S,
            keepalive_interval=KEEPALIVE_INTERVAL_S,
            keepalive_timeout=KEEPALIVE_TIMEOUT_S,
            limits=limits,
        )
        self.frontends: FrontendPool | None = None

    async def start_frontends(
        self,
        count: int,
        max_calls: int,
        listeners: list[ClientListener],
        http_protocol: Callable[[], asyncio.Protocol],
        fallback_protocol: Callable[[], asyncio.Protocol],
        tls: TLSInfo | None,
    ) -> None:
        """Client front ends that accept on ``listeners`` (``kvserver.api.grpc.frontends``)."""
        hub_limits = getattr(getattr(self.service, "watch_hub", None), "limits", None)
        limits = hub_limits if hub_limits is not None else WatchLimits()
        self.frontends = FrontendPool(
            count,
            self.settings,
            max_calls,
            listeners,
            http_protocol,
            fallback_protocol,
            tls,
            watch_feeds=lambda link: WatchFeeds(self.service, self.calls, link),
            watch_limits={
                "max_watchers": limits.max_watchers,
                "max_watchers_per_stream": limits.max_watchers_per_stream,
                "max_buffered_bytes": limits.max_buffered_bytes,
            },
        )
        await self.frontends.start()

    def methods(self) -> dict[str, Method]:
        service, calls, forwarder = self.service, self.calls, self.forwarder
        servicers = (
            KVServicer(service, calls),
            WatchServicer(service, calls),
            LeaseServicer(service, calls, forwarder),
            ClusterServicer(service, calls, forwarder),
            MaintenanceServicer(service, calls, self.snapshot_gate),
            AuthServicer(service, calls),
        )
        table: dict[str, Method] = {}
        for servicer in servicers:
            table.update(servicer.methods())
        return refuse_on_learner(table, self._is_learner)

    def _is_learner(self) -> bool:
        return serves_as_learner(self.service)

    @property
    def connections_accepted(self) -> int:
        return self.settings.accepted

    @property
    def open_connections(self) -> int:
        return len(self.settings.connections)

    def collector(self) -> GrpcCollector:
        """The call counters for this member's Prometheus registry."""
        kinds = {path: method.kind for path, method in self.settings.methods.items()}
        return GrpcCollector(self.settings, kinds, lambda: self.frontends)

    def connection(self, identity: ClientIdentity) -> GrpcConnection:
        """The protocol of a client connection that opened with the HTTP/2 preface."""
        return GrpcConnection(self.settings, identity)

    async def stop(self, grace_s: float = 1.0) -> None:
        connections = list(self.settings.connections)
        for conn in connections:
            conn.go_away()
        deadline = time.monotonic() + grace_s
        while any(conn.streams for conn in connections) and time.monotonic() < deadline:
            await asyncio.sleep(STOP_POLL_S)
        for conn in connections:
            conn.abort()
        if self.frontends is not None:
            await self.frontends.stop()
        await self.forwarder.close()
