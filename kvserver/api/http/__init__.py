"""kvserver.api.http: the client API over HTTP/1.1 (etcd v3 JSON gateway dialect + plain REST + ops).

``build_client_app(service, metrics)`` is the entry point. Modules: ``app`` (routes,
middlewares, factory), ``v3`` and ``gateway_json`` (etcd's gateway dialect), ``rest``
(``/v1/kv``), ``ops`` (``/health``, ``/version``, ``/v1/status``, ``/metrics``), ``common``
(errors, request ids, limits, app keys), ``ui`` and ``ui_data`` (the dashboard at ``/ui/``:
its packaged files and its JSON endpoints).
"""

from .app import build_client_app, error_middleware, route_table
from .common import LIMITS_KEY, METRICS_KEY, SERVICE_KEY, ApiLimits

__all__ = [
    "LIMITS_KEY",
    "METRICS_KEY",
    "SERVICE_KEY",
    "ApiLimits",
    "build_client_app",
    "error_middleware",
    "route_table",
]
