"""``/health``, ``/version``, ``/v1/status`` and ``/metrics`` over HTTP."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from kvserver.kvpb.service_errors import stopping
from kvserver.server.metrics import DurationHistogram

from .helpers import b64, serve


async def test_health_follows_leader_and_apply_progress() -> None:
    async with serve() as api:
        # etcd 3.4: 200 {"health":"true"}
        status, body, _ = await api.request("GET", "/health")
        assert (status, body) == (200, b'{"health":"true"}')
        api.service.leader = 0
        status, body, _ = await api.request("GET", "/health")
        # etcd 3.5: 503 {"health":"false","reason":"RAFT NO LEADER"}
        assert (status, json.loads(body)) == (503, {"health": "false", "reason": "RAFT NO LEADER"})
        api.service.leader = api.service.member_id
        api.service.raft_index = api.service.raft_applied_index + 3
        status, body, _ = await api.request("GET", "/health")
        assert (status, json.loads(body)["reason"]) == (503, "RAFT APPLY BEHIND COMMIT")
        api.service.fail_with = stopping()
        status, body, _ = await api.request("GET", "/health")
        assert status == 503 and json.loads(body)["health"] == "false"


async def test_version_names_the_etcd_api_we_speak() -> None:
    async with serve() as api:
        status, body, _ = await api.request("GET", "/version")
        # etcd 3.4: {"etcdserver":"3.4.23","etcdcluster":"3.4.0"}
        assert (status, json.loads(body)) == (200, {"etcdserver": "3.5.0", "etcdcluster": "3.5.0"})


async def test_v1_status_fields() -> None:
    async with serve() as api:
        await api.request("PUT", "/v1/kv/k", data=b"v")
        status, body, headers = await api.request("GET", "/v1/status")
        assert status == 200 and headers["X-Raftkv-Revision"] == "2"
        out = json.loads(body)
        assert out == {
            "id": "8e9e05c52164694d",
            "name": "local",
            "cluster_id": "cdf818194e3a8c32",
            "leader": "8e9e05c52164694d",
            "is_leader": True,
            "healthy": True,
            "term": 2,
            "commit_index": 2,
            "applied_index": 2,
            "revision": 2,
            "compact_revision": -1,
            "db_size_bytes": 4098,
            "is_learner": False,
            "version": "0.1.0",
            "etcd_version": "3.5.0",
            "members": [
                {
                    "id": "8e9e05c52164694d",
                    "name": "local",
                    "peer_urls": ["http://127.0.0.1:2380"],
                    "client_urls": ["http://127.0.0.1:2379"],
                    "is_learner": False,
                }
            ],
        }
        api.service.leader = 0
        _, body, _ = await api.request("GET", "/v1/status")
        assert json.loads(body)["leader"] is None


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


PUT_COUNT = (
    "raftkv_http_request_duration_seconds_count",
    (("dialect", "etcd"), ("route", "/v3/kv/put"), ("status", "200")),
)


async def test_metrics_histogram_moves_with_requests() -> None:
    async with serve() as api:
        status, body, headers = await api.request("GET", "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert PUT_COUNT not in _samples(body.decode())
        for i in range(5):
            await api.post("/v3/kv/put", {"key": b64(f"k{i}"), "value": b64("v")})
        await api.post("/v3/kv/put", {"key": ""})  # a 400
        await api.request("GET", "/v1/kv/k0")
        await api.request("GET", "/no/such/path")
        _, body, _ = await api.request("GET", "/metrics")
        samples = _samples(body.decode())
        assert samples[PUT_COUNT] == 5
        assert (
            samples[
                (
                    "raftkv_http_request_duration_seconds_count",
                    (("dialect", "etcd"), ("route", "/v3/kv/put"), ("status", "400")),
                )
            ]
            == 1
        )
        assert (
            samples[
                (
                    "raftkv_http_request_duration_seconds_count",
                    (("dialect", "rest"), ("route", "/v1/kv/{key}"), ("status", "200")),
                )
            ]
            == 1
        )
        # unmatched paths share one label value: bounded cardinality
        assert (
            samples[
                (
                    "raftkv_http_request_duration_seconds_count",
                    (("dialect", "ops"), ("route", "unmatched"), ("status", "404")),
                )
            ]
            == 1
        )
        assert samples[("raftkv_http_request_duration_seconds_sum", PUT_COUNT[1])] > 0


async def test_metrics_include_node_stats_source() -> None:
    async with serve() as api:
        fsync = DurationHistogram()
        for seconds in (0.0001, 0.0002, 0.004):
            fsync.observe(seconds)
        api.metrics.node_stats = lambda: {
            "raft_term": 7,
            "raft_commit_index": 100,
            "raft_applied_index": 99,
            "raft_leader_changes": 3,
            "proposals_committed": 90,
            "proposals_failed": 2,
            "raft_apply_lag_entries": 1,
            "wal_fsync_duration_seconds": fsync,
            "peer_send_failures": {2: 5, 3: 0},
            "not_a_known_key": 1,
        }
        _, body, _ = await api.request("GET", "/metrics")
        samples = _samples(body.decode())
        assert samples[("raftkv_raft_term", ())] == 7
        assert samples[("raftkv_raft_commit_index", ())] == 100
        assert samples[("raftkv_raft_leader_changes_total", ())] == 3
        assert samples[("raftkv_proposals_failed_total", ())] == 2
        assert samples[("raftkv_wal_fsync_duration_seconds_count", ())] == 3
        assert samples[("raftkv_wal_fsync_duration_seconds_bucket", (("le", "0.0001"),))] == 1
        assert samples[("raftkv_peer_send_failures_total", (("peer", "2"),))] == 5
        assert not any(name.startswith("raftkv_not_a_known_key") for name, _ in samples)
