"""This member's gRPC server: etcd's services over the same ``KVService`` as the JSON gateway.

``GrpcServer(service, auth, max_request_bytes=...)``; ``await start()`` binds a grpc.aio server
to an abstract unix socket and returns the ``GrpcBackend`` that the client URLs'
listeners splice HTTP/2 connections to (``kvserver.api.grpc.mux``); ``await stop()`` ends it.
Clients never dial that socket themselves: they use the client URLs, and calls on a
connection that did not come through a splice are refused.

Settings, as etcd's server has them:

- messages up to ``--max-request-bytes`` + 512 KiB are received (etcd's
  ``MaxRequestBytes + grpcOverheadBytes``); answers of any size are sent;
- keepalive enforcement: clients may ping every 5 s, with or without calls in flight (etcd's
  ``--grpc-keepalive-min-time``; etcdctl pings every 10 s and an idle watch must not be
  dropped for "too many pings"); the server pings an idle client every 2 h and drops it after
  20 s without an answer (etcd's ``--grpc-keepalive-interval`` and ``-timeout``).
"""

from __future__ import annotations

from typing import Any

import grpc

from .auth import AuthServicer
from .calls import Calls
from .cluster import ClusterServicer
from .forward import LeaderForwarder
from .kv import KVServicer
from .lease import LeaseServicer
from .maintenance import MaintenanceServicer
from .mux import GrpcBackend
from .watch import WatchServicer

GRPC_OVERHEAD_BYTES = 512 * 1024
KEEPALIVE_MIN_TIME_MS = 5_000
KEEPALIVE_INTERVAL_MS = 2 * 3600 * 1000
KEEPALIVE_TIMEOUT_MS = 20_000


def server_options(max_request_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", max_request_bytes + GRPC_OVERHEAD_BYTES),
        ("grpc.max_send_message_length", -1),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MIN_TIME_MS),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_MIN_TIME_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_time_ms", KEEPALIVE_INTERVAL_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.so_reuseport", 0),
    ]


class GrpcServer:
    def __init__(
        self,
        service: Any,
        auth: Any,
        *,
        max_request_bytes: int,
        forward_credentials: grpc.ChannelCredentials | None = None,
    ):
        self.service = service
        self.backend = GrpcBackend()
        self.calls = Calls(self.backend, auth, max_request_bytes)
        # https leaders need this member's client TLS credentials (kvserver.api.grpc.forward)
        self.forwarder = LeaderForwarder(service, forward_credentials)
        self.max_request_bytes = max_request_bytes
        self.server: grpc.aio.Server | None = None

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        service, calls, forwarder = self.service, self.calls, self.forwarder
        servicers = (
            KVServicer(service, calls),
            WatchServicer(service, calls),
            LeaseServicer(service, calls, forwarder),
            ClusterServicer(service, calls, forwarder),
            MaintenanceServicer(service, calls),
            AuthServicer(service, calls),
        )
        return [servicer.handler() for servicer in servicers]

    async def start(self) -> GrpcBackend:
        server = grpc.aio.server(options=server_options(self.max_request_bytes))
        server.add_generic_rpc_handlers(self.handlers())
        server.add_insecure_port(self.backend.target)
        await server.start()
        self.server = server
        return self.backend

    async def stop(self, grace_s: float = 1.0) -> None:
        if self.server is not None:
            await self.server.stop(grace_s)
            self.server = None
        await self.forwarder.close()
