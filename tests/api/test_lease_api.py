"""The etcd v3 JSON gateway's lease endpoints over ``LocalKV``, with etcd 3.4's shapes.

Shapes were recorded from a real etcd 3.4.23 (``/usr/bin/etcd``) with the same requests;
comments quote what it answered. Expiry uses a fake clock (no sleeping).
"""

from __future__ import annotations

import json

import pytest

from kvserver.kvpb.service_errors import GrpcCode, no_leader

from .fakes import DEFAULT_CLUSTER_ID, DEFAULT_MEMBER_ID, LocalKV
from .helpers import b64, serve

CID, MID = str(DEFAULT_CLUSTER_ID), str(DEFAULT_MEMBER_ID)


def hdr(revision: int) -> dict[str, str]:
    return {"cluster_id": CID, "member_id": MID, "revision": str(revision), "raft_term": "2"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_grant_put_timetolive_leases_revoke_in_etcd_shapes() -> None:
    async with serve(LocalKV(bind_leases=True)) as api:
        # etcd 3.4: {"header":{...,"revision":"1",...},"ID":"7","TTL":"30"}
        assert await api.post("/v3/lease/grant", {"TTL": 30, "ID": 7}) == (
            200,
            {"header": hdr(1), "ID": "7", "TTL": "30"},
        )
        assert (await api.post("/v3/kv/put", {"key": b64("k"), "value": b64("v"), "lease": "7"}))[
            0
        ] == 200
        # etcd 3.4: "TTL":"29","grantedTTL":"30","keys":["aw=="] (TTL truncated to seconds)
        status, body = await api.post("/v3/lease/timetolive", {"ID": "7", "keys": True})
        assert status == 200
        assert list(body) == ["header", "ID", "TTL", "grantedTTL", "keys"]
        assert body["ID"] == "7" and body["grantedTTL"] == "30" and body["keys"] == ["aw=="]
        assert int(body["TTL"]) in (29, 30)
        # etcd 3.4: an unknown lease is TTL "-1", no grantedTTL, not an error
        assert await api.post("/v3/kv/lease/timetolive", {"ID": 8}) == (
            200,
            {"header": hdr(2), "ID": "8", "TTL": "-1"},
        )
        # etcd 3.4: {"header":...,"leases":[{"ID":"7"}]}
        assert await api.post("/v3/lease/leases", {}) == (
            200,
            {"header": hdr(2), "leases": [{"ID": "7"}]},
        )
        assert await api.post("/v3/kv/lease/leases") == (
            200,
            {"header": hdr(2), "leases": [{"ID": "7"}]},
        )
        # etcd 3.4: revoke deletes the key in a new revision; answer {"header":{rev 3}}
        assert await api.post("/v3/kv/lease/revoke", {"ID": 7}) == (200, {"header": hdr(3)})
        assert await api.post("/v3/kv/range", {"key": b64("k")}) == (200, {"header": hdr(3)})
        assert await api.post("/v3/lease/leases") == (200, {"header": hdr(3)})


async def test_lease_errors_have_etcd_texts_and_statuses() -> None:
    async with serve(LocalKV(bind_leases=True)) as api:
        not_found = {
            "error": "etcdserver: requested lease not found",
            "message": "etcdserver: requested lease not found",
            "code": 5,
        }
        # etcd 3.4: 404 for revoke of an unknown lease and for a put naming one
        assert await api.post("/v3/lease/revoke", {"ID": 7}) == (404, not_found)
        assert await api.post("/v3/kv/put", {"key": b64("k"), "lease": "99"}) == (404, not_found)
        # etcd 3.4: 412 FailedPrecondition "lease already exists"
        assert (await api.post("/v3/lease/grant", {"ID": 5, "TTL": 5}))[0] == 200
        status, body = await api.post("/v3/lease/grant", {"ID": 5, "TTL": 5})
        # (the HTTP status is checked in test_lease_exists_is_http_412_like_etcd)
        assert (body["code"], body["error"]) == (
            GrpcCode.FAILED_PRECONDITION,
            "etcdserver: lease already exists",
        )
        # etcd 3.4: too large TTL is OutOfRange (400)
        status, body = await api.post("/v3/lease/grant", {"TTL": "9000000001"})
        assert (status, body["error"]) == (400, "etcdserver: too large lease TTL")
        # bad input never reaches the lessor
        before = len(api.service.lessor)
        for bad in ({"TTL": "abc"}, {"TTL": -1}, {"ID": 1.5}, [1]):
            status, body = await api.post("/v3/lease/grant", bad)
            assert status == 400 and body["code"] == GrpcCode.INVALID_ARGUMENT, bad
        status, body = await api.post("/v3/lease/timetolive", {"ID": 5, "keys": "yes"})
        assert status == 400
        assert len(api.service.lessor) == before


async def test_lease_exists_is_http_412_like_etcd() -> None:
    async with serve() as api:
        await api.post("/v3/lease/grant", {"ID": 5, "TTL": 5})
        assert (await api.post("/v3/lease/grant", {"ID": 5, "TTL": 5}))[0] == 412


async def test_grant_without_id_or_ttl_gets_server_id_and_minimum_ttl() -> None:
    async with serve() as api:
        # etcd 3.4: {} -> a server-chosen ID and TTL "2" (the minimum with default timing)
        status, body = await api.post("/v3/lease/grant", {})
        assert status == 200 and body["TTL"] == "2" and int(body["ID"]) > 0


async def _keepalive(api, raw: bytes):  # type: ignore[no-untyped-def]
    resp = await api.client.post("/v3/lease/keepalive", data=raw)
    text = await resp.text()
    return resp.status, resp.headers.get("Transfer-Encoding"), text


async def test_keepalive_answers_chunked_one_result_line_per_request() -> None:
    async with serve(LocalKV(bind_leases=True)) as api:
        await api.post("/v3/lease/grant", {"TTL": 30, "ID": 7})
        # etcd 3.4: chunked, '{"result":{"header":{...},"ID":"7","TTL":"30"}}\n'
        status, encoding, text = await _keepalive(api, b'{"ID":7}')
        assert (status, encoding) == (200, "chunked")
        assert text.endswith("\n") and text.count("\n") == 1
        assert json.loads(text) == {"result": {"header": hdr(1), "ID": "7", "TTL": "30"}}
        # etcd 3.4: several request objects in one body -> one line each; an unknown lease
        # answers without TTL (not an error)
        status, _, text = await _keepalive(api, b'{"ID":7}\n{"ID":"9"}')
        lines = [json.loads(line) for line in text.splitlines()]
        assert status == 200 and lines == [
            {"result": {"header": hdr(1), "ID": "7", "TTL": "30"}},
            {"result": {"header": hdr(1), "ID": "9"}},
        ]
        assert api.service.calls["LeaseKeepAliveRequest"] == 3


async def test_keepalive_refreshes_and_unrefreshed_lease_expires() -> None:
    clock = FakeClock()
    async with serve(LocalKV(clock=clock, bind_leases=True)) as api:
        await api.post("/v3/lease/grant", {"TTL": 10, "ID": 1})
        await api.post("/v3/lease/grant", {"TTL": 10, "ID": 2})
        await api.post("/v3/kv/put", {"key": b64("a"), "lease": "1"})
        await api.post("/v3/kv/put", {"key": b64("b"), "lease": "2"})
        clock.now += 8
        assert (await _keepalive(api, b'{"ID":2}'))[0] == 200
        clock.now += 8  # lease 1 is 16 s old, lease 2 refreshed 8 s ago
        assert api.service.expire_leases() == [1]
        _, body = await api.post("/v3/kv/range", {"key": b64("a"), "range_end": b64("c")})
        assert [kv["key"] for kv in body["kvs"]] == [b64("b")]
        _, body = await api.post("/v3/lease/timetolive", {"ID": 2})
        assert body["TTL"] == "2" and body["grantedTTL"] == "10"


async def test_keepalive_failure_is_a_plain_error_response_for_failover() -> None:
    service = LocalKV()
    service.fail_with = no_leader()
    async with serve(service) as api:
        status, body = await api.post("/v3/lease/keepalive", {"ID": 1})
        assert (status, body["error"]) == (503, "etcdserver: no leader")


@pytest.mark.parametrize(
    "path",
    [
        "/v3/lease/grant",
        "/v3/lease/revoke",
        "/v3/lease/keepalive",
        "/v3/lease/timetolive",
        "/v3/kv/lease/leases",
    ],
)
async def test_lease_routes_are_post_only(path: str) -> None:
    async with serve() as api:
        status, _, _ = await api.request("GET", path)
        assert status == 405
