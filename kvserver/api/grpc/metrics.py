"""gRPC call counts for ``/metrics``, named and labelled as go-grpc-prometheus counts them in
etcd (``grpc_server_started_total``, ``grpc_server_handled_total``), with raftkv's prefix.

``CallCounts`` is what the connections count into, two dict increments per call:
``started(path)`` when a call to a known method opens, ``handled(path, code)`` when it ends
(its status; ``CANCELLED`` when the client reset it). Unknown methods are not counted, so the
labels stay bounded by the method table. ``GrpcCollector(settings, kinds)`` is a Prometheus
collector that turns them into the two counter families at scrape time:

- ``raftkv_grpc_server_started_total{grpc_type,grpc_service,grpc_method}``
- ``raftkv_grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}``

``grpc_type`` is ``unary``, ``server_stream`` or ``bidi_stream``; ``grpc_code`` is the
status's name as gRPC spells it (``OK``, ``Unavailable``, ...). A member with gRPC front-end
processes (``kvserver.api.grpc.frontends``) also reports them:

- ``raftkv_grpc_frontends_ready``: front ends up and taking connections;
- ``raftkv_grpc_frontend_starts_total``: front-end processes started, restarts included;
- ``raftkv_grpc_frontend_connections_total``: HTTP/1.1 connections the front ends passed
  to the member (they serve gRPC themselves).

And whatever process serves the connection, ``raftkv_client_budget_exceeded_total{budget}``:
how often clients met each budget of ``kvserver.api.grpc.budgets`` (every budget is listed,
at 0 until a client meets it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .budgets import BUDGETS
from .rpc import STREAM_STREAM, UNARY_STREAM, UNARY_UNARY

_TYPES = {UNARY_UNARY: "unary", UNARY_STREAM: "server_stream", STREAM_STREAM: "bidi_stream"}
# grpc.StatusCode.DEADLINE_EXCEEDED -> "DeadlineExceeded", as grpc-go's codes.Code.String()
_CODE_NAMES = {
    int(code.value[0]): "".join(part.capitalize() for part in code.name.split("_"))
    for code in grpc.StatusCode
}
_CODE_NAMES[0] = "OK"


class CallCounts:
    def __init__(self) -> None:
        self.started_calls: Counter[str] = Counter()
        self.handled_calls: Counter[tuple[str, int]] = Counter()

    def started(self, path: str) -> None:
        self.started_calls[path] += 1

    def handled(self, path: str, code: int) -> None:
        self.handled_calls[(path, code)] += 1


class GrpcCollector:
    def __init__(
        self,
        settings: Any,
        kinds: Mapping[str, str],
        frontends: Callable[[], Any] = lambda: None,
    ):
        self.counts: CallCounts = settings.calls
        self.budgets: Mapping[str, int] = settings.budgets
        self.kinds = kinds  # method path -> kind
        self.frontends = frontends  # the FrontendPool, or None, at scrape time

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        started = CounterMetricFamily(
            "raftkv_grpc_server_started",
            "gRPC calls started on this member, by method.",
            labels=labels,
        )
        handled = CounterMetricFamily(
            "raftkv_grpc_server_handled",
            "gRPC calls this member ended, by method and status code.",
            labels=[*labels, "grpc_code"],
        )
        for path, n in sorted(self.counts.started_calls.items()):
            started.add_metric(self._labels(path), n)
        for (path, code), n in sorted(self.counts.handled_calls.items()):
            handled.add_metric([*self._labels(path), _CODE_NAMES.get(code, str(code))], n)
        exceeded = CounterMetricFamily(
            "raftkv_client_budget_exceeded",
            "Times a client met a budget of what one connection may hold, by budget.",
            labels=["budget"],
        )
        pool = self.frontends()
        extra = pool.budgets() if pool is not None else {}
        for name in BUDGETS:
            exceeded.add_metric([name], self.budgets.get(name, 0) + extra.get(name, 0))
        if pool is None:
            return [started, handled, exceeded]
        return [
            started,
            handled,
            exceeded,
            GaugeMetricFamily(
                "raftkv_grpc_frontends_ready", "gRPC front ends taking connections.", pool.ready
            ),
            CounterMetricFamily(
                "raftkv_grpc_frontend_starts",
                "gRPC front-end processes started, restarts included.",
                pool.started,
            ),
            CounterMetricFamily(
                "raftkv_grpc_frontend_connections",
                "HTTP/1.1 client connections the front ends passed to this member.",
                pool.handed_off,
            ),
        ]

    def _labels(self, path: str) -> list[str]:
        service, _, method = path.lstrip("/").partition("/")
        return [_TYPES.get(self.kinds.get(path, ""), "unknown"), service, method]
