"""Operational endpoints: ``/health``, ``/version``, ``/v1/status``, ``/metrics``.

``GET /health`` — etcd's shape: 200 ``{"health":"true"}`` when this node knows a leader and
  has applied everything it knows to be committed (``NodeStatus.healthy``), else 503
  ``{"health":"false","reason":"..."}`` with ``RAFT NO LEADER`` (etcd 3.5's text) or
  ``RAFT APPLY BEHIND COMMIT``, or the node's own problem first (``RAFT LOOP FAILED: ...``,
  ``RAFT LOOP FAILING: ...``, ``RAFT LEADER NOT CONFIRMED``: ``Node.health_problem``). Load
  balancers can use it as is. A member with client front ends adds ``"frontends":
  "<ready>/<configured>"``; none ready does not make it unhealthy (the member then accepts
  its clients itself), but an operator sees it.
``GET /version`` — ``{"etcdserver": "3.5.0", "etcdcluster": "3.5.0"}``: the etcd API version
  we speak (etcd clients pick ``/v3/`` from it).
``GET /v1/status`` — this node's view, as JSON for people and scripts::

    {"id": "8e9e05c52164694d", "name": "n1", "cluster_id": "cdf818194e3a8c32",
     "leader": "8e9e05c52164694d", "is_leader": true, "healthy": true, "term": 2,
     "commit_index": 17, "applied_index": 17, "revision": 8, "compact_revision": -1,
     "db_size_bytes": 4096, "is_learner": false, "version": "0.1.0", "etcd_version": "3.5.0",
     "members": [{"id": "...", "name": "n1", "peer_urls": [...], "client_urls": [...],
                  "is_learner": false}]}

  A member that archives (``--archive-url``) adds ``"archive": {"lag_entries": N,
  "lag_seconds": S}`` (``kvserver.archive.archiver.Archiver.lag``).
  Member and cluster ids are lowercase hex strings, as etcdctl prints them (``leader`` is
  ``null`` when no leader is known); counters are JSON numbers.
``GET /metrics`` — Prometheus text exposition of ``Metrics``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kvserver.kvpb.headers import ETCD_VERSION
from kvserver.server.service import NodeStatus

from .common import (
    FRONTENDS_KEY,
    METRICS_KEY,
    REVISION_HEADER,
    SERVICE_KEY,
    dumps,
    json_response,
)

ETCD_CLUSTER_VERSION = "3.5.0"
_VERSION_BODY = dumps({"etcdserver": ETCD_VERSION, "etcdcluster": ETCD_CLUSTER_VERSION}).encode()
_HEALTHY_BODY = b'{"health":"true"}'


def _unhealthy(reason: str) -> web.Response:
    return json_response(dumps({"health": "false", "reason": reason}).encode("ascii"), 503)


async def health(request: web.Request) -> web.Response:
    try:
        status = request.app[SERVICE_KEY].status()
    except Exception as exc:  # a stopping or broken node is simply unhealthy
        return _unhealthy(f"STATUS UNAVAILABLE: {exc}")
    frontends = request.app.get(FRONTENDS_KEY)
    if status.healthy:
        if frontends is None:
            return json_response(_HEALTHY_BODY)
        ready, configured = frontends()
        return json_response(
            dumps({"health": "true", "frontends": f"{ready}/{configured}"}).encode()
        )
    if status.problem:
        return _unhealthy(status.problem)
    if status.leader == 0:
        return _unhealthy("RAFT NO LEADER")
    return _unhealthy("RAFT APPLY BEHIND COMMIT")


async def version(request: web.Request) -> web.Response:
    return json_response(_VERSION_BODY)


def _hex(member_id: int) -> str:
    return format(member_id, "x")


def status_json(s: NodeStatus) -> dict[str, Any]:
    return {
        "id": _hex(s.member_id),
        "name": s.name,
        "cluster_id": _hex(s.cluster_id),
        "leader": _hex(s.leader) if s.leader else None,
        "is_leader": s.leader != 0 and s.leader == s.member_id,
        "healthy": s.healthy,
        "term": s.raft_term,
        "commit_index": s.raft_index,
        "applied_index": s.raft_applied_index,
        "revision": s.revision,
        "compact_revision": s.compact_revision,
        "db_size_bytes": s.db_size_bytes,
        "is_learner": s.is_learner,
        "version": s.version,
        "etcd_version": ETCD_VERSION,
        **(
            {}
            if s.archive_lag_entries is None
            else {
                "archive": {
                    "lag_entries": s.archive_lag_entries,
                    "lag_seconds": round(s.archive_lag_seconds or 0.0, 3),
                }
            }
        ),
        "members": [
            {
                "id": _hex(m.id),
                "name": m.name,
                "peer_urls": list(m.peer_urls),
                "client_urls": list(m.client_urls),
                "is_learner": m.is_learner,
            }
            for m in s.members
        ],
    }


async def node_status(request: web.Request) -> web.Response:
    status = request.app[SERVICE_KEY].status()
    return json_response(
        dumps(status_json(status)).encode("ascii"), 200, {REVISION_HEADER: str(status.revision)}
    )


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": content_type})
