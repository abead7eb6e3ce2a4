"""etcd's Watch service over gRPC (``etcdserverpb.Watch``).

Not built yet: a method that is not registered in ``handler()`` answers Unimplemented.
"""

from __future__ import annotations

from typing import Any

import grpc

from .calls import Calls, service_handler


class WatchServicer:
    def __init__(self, service: Any, calls: Calls):
        self.service = service
        self.calls = calls

    def handler(self) -> grpc.GenericRpcHandler:
        return service_handler("etcdserverpb.Watch", {})
