"""The etcd v3 JSON gateway dialect over HTTP: every route, with etcd's exact JSON shapes.

Shapes were recorded from a real etcd 3.4.23 gateway (``/usr/bin/etcd``, one member on
loopback) with the same requests; comments say what etcd answered. ``test_etcd_compat.py``
replays a script against a live etcd and compares mechanically.
"""

from __future__ import annotations

import pytest

from kvserver.api.http import v3
from kvserver.kvpb.service_errors import GrpcCode, ServiceError, no_leader
from kvserver.mvcc.store import MVCCStore

from .fakes import DEFAULT_CLUSTER_ID, DEFAULT_MEMBER_ID, LocalKV
from .helpers import b64, serve

CID, MID = str(DEFAULT_CLUSTER_ID), str(DEFAULT_MEMBER_ID)


def hdr(revision: int) -> dict[str, str]:
    return {"cluster_id": CID, "member_id": MID, "revision": str(revision), "raft_term": "2"}


async def test_put_then_range_round_trip_with_etcd_shapes() -> None:
    async with serve() as api:
        # etcd 3.4: {"header":{...,"revision":"2",...}} and nothing else for a plain put
        assert await api.post("/v3/kv/put", {"key": b64("foo"), "value": b64("bar")}) == (
            200,
            {"header": hdr(2)},
        )
        # etcd 3.4: prev_kv present only when asked for and the key existed
        status, body = await api.post(
            "/v3/kv/put", {"key": b64("foo"), "value": b64("baz"), "prev_kv": True}
        )
        assert status == 200
        assert body == {
            "header": hdr(3),
            "prev_kv": {
                "key": "Zm9v",
                "create_revision": "2",
                "mod_revision": "2",
                "version": "1",
                "value": "YmFy",
            },
        }
        # etcd 3.4: kvs + count (a string); more absent when false
        assert await api.post("/v3/kv/range", {"key": b64("foo")}) == (
            200,
            {
                "header": hdr(3),
                "kvs": [
                    {
                        "key": "Zm9v",
                        "create_revision": "2",
                        "mod_revision": "3",
                        "version": "2",
                        "value": "YmF6",
                    }
                ],
                "count": "1",
            },
        )


async def test_range_of_missing_key_is_only_a_header() -> None:
    async with serve() as api:
        # etcd 3.4 gateway answers {"header":{...}}: no kvs, no count, no more
        assert await api.post("/v3/kv/range", {"key": b64("none")}) == (200, {"header": hdr(1)})


async def test_range_options_limit_count_keys_only_sort() -> None:
    async with serve() as api:
        for k in ("a", "b", "c"):
            await api.post("/v3/kv/put", {"key": b64(k), "value": b64(k * 2)})
        everything = {"key": b64("\0"), "range_end": b64("\0")}
        # etcd 3.4: limit 1 of 3 -> one kv, "more": true, "count": "3"
        _, body = await api.post("/v3/kv/range", {**everything, "limit": 1})
        assert [kv["key"] for kv in body["kvs"]] == [b64("a")]
        assert body["more"] is True and body["count"] == "3"
        # count_only: only the count
        _, body = await api.post("/v3/kv/range", {**everything, "count_only": True})
        assert body == {"header": hdr(4), "count": "3"}
        # keys_only: values omitted
        _, body = await api.post("/v3/kv/range", {**everything, "keys_only": True})
        assert all("value" not in kv for kv in body["kvs"]) and len(body["kvs"]) == 3
        # enums by name or by number mean the same; lowerCamel names work as in etcd
        _, by_name = await api.post(
            "/v3/kv/range", {**everything, "sort_order": "DESCEND", "sort_target": "MOD"}
        )
        _, by_number = await api.post(
            "/v3/kv/range", {**everything, "sortOrder": 2, "sortTarget": 3}
        )
        assert by_name == by_number
        assert [kv["key"] for kv in by_name["kvs"]] == [b64("c"), b64("b"), b64("a")]
        # etcd 3.4 accepts a negative limit (= no limit) and int64 as string or number
        _, body = await api.post("/v3/kv/range", {**everything, "limit": "-1"})
        assert body["count"] == "3" and len(body["kvs"]) == 3
        # past revision
        _, body = await api.post("/v3/kv/range", {**everything, "revision": "2"})
        assert [kv["key"] for kv in body["kvs"]] == [b64("a")]
        # serializable is accepted (LocalKV answers locally anyway)
        status, _ = await api.post("/v3/kv/range", {**everything, "serializable": True})
        assert status == 200


async def test_unknown_fields_are_ignored_like_grpc_gateway_v1() -> None:
    async with serve() as api:
        await api.post("/v3/kv/put", {"key": b64("k"), "value": b64("v"), "bogus": [1, 2]})
        # etcd 3.4 gateway answers 200 for {"key":..., "unknown": 1}
        status, body = await api.post("/v3/kv/range", {"key": b64("k"), "unknown": 1})
        assert status == 200 and body["count"] == "1"


async def test_empty_value_is_omitted_from_the_kv() -> None:
    async with serve() as api:
        await api.post("/v3/kv/put", {"key": b64("ab"), "value": ""})
        # etcd 3.4: {"key":"YWI=","create_revision":"5","mod_revision":"5","version":"1"}
        _, body = await api.post("/v3/kv/range", {"key": b64("ab")})
        assert body["kvs"] == [
            {"key": "YWI=", "create_revision": "2", "mod_revision": "2", "version": "1"}
        ]


async def test_base64_alphabets_accepted() -> None:
    async with serve() as api:
        key = b"\xfb\xff\xbe"  # standard "+/++", URL-safe "-_-+"... both accepted
        await api.post("/v3/kv/put", {"key": b64(key), "value": b64("x")})
        urlsafe = b64(key).replace("+", "-").replace("/", "_")
        _, body = await api.post("/v3/kv/range", {"key": urlsafe})
        assert body["count"] == "1"
        # missing padding is accepted too (proto3 JSON mapping; etcd 3.4 refuses it)
        await api.post("/v3/kv/put", {"key": "Zm9vYg", "value": b64("x")})
        _, body = await api.post("/v3/kv/range", {"key": b64("foob")})
        assert body["count"] == "1"


async def test_deleterange_shapes() -> None:
    async with serve() as api:
        await api.post("/v3/kv/put", {"key": b64("ac"), "value": b64("x")})
        await api.post("/v3/kv/put", {"key": b64("ad"), "value": b64("y")})
        # etcd 3.4: deleting a missing key -> only the header, revision unchanged
        assert await api.post("/v3/kv/deleterange", {"key": b64("none")}) == (
            200,
            {"header": hdr(3)},
        )
        # etcd 3.4: {"header":..., "deleted":"1", "prev_kvs":[...]}
        assert await api.post("/v3/kv/deleterange", {"key": b64("ac"), "prev_kv": True}) == (
            200,
            {
                "header": hdr(4),
                "deleted": "1",
                "prev_kvs": [
                    {
                        "key": b64("ac"),
                        "create_revision": "2",
                        "mod_revision": "2",
                        "version": "1",
                        "value": b64("x"),
                    }
                ],
            },
        )
        # a range delete without prev_kv: just the count
        assert await api.post("/v3/kv/deleterange", {"key": b64("a"), "range_end": b64("b")}) == (
            200,
            {"header": hdr(5), "deleted": "1"},
        )


async def test_txn_success_branch_shapes() -> None:
    async with serve() as api:
        await api.post("/v3/kv/put", {"key": b64("foo"), "value": b64("bar")})
        status, body = await api.post(
            "/v3/kv/txn",
            {
                "compare": [
                    {"key": b64("foo"), "target": "VALUE", "result": "EQUAL", "value": b64("bar")}
                ],
                "success": [
                    {"request_put": {"key": b64("foo"), "value": b64("baz")}},
                    {"request_range": {"key": b64("foo")}},
                ],
                "failure": [{"request_range": {"key": b64("foo")}}],
            },
        )
        # etcd 3.4: sub-response headers carry only the revision
        assert (status, body) == (
            200,
            {
                "header": hdr(3),
                "succeeded": True,
                "responses": [
                    {"response_put": {"header": {"revision": "3"}}},
                    {
                        "response_range": {
                            "header": {"revision": "3"},
                            "kvs": [
                                {
                                    "key": "Zm9v",
                                    "create_revision": "2",
                                    "mod_revision": "3",
                                    "version": "2",
                                    "value": "YmF6",
                                }
                            ],
                            "count": "1",
                        }
                    },
                ],
            },
        )


async def test_txn_failure_branch_and_nested_txn_shapes() -> None:
    async with serve() as api:
        await api.post("/v3/kv/put", {"key": b64("foo"), "value": b64("baz")})
        status, body = await api.post(
            "/v3/kv/txn",
            {
                "compare": [
                    {"key": b64("foo"), "target": "VALUE", "result": "EQUAL", "value": b64("bar")}
                ],
                "success": [{"request_put": {"key": b64("foo"), "value": b64("baz")}}],
                "failure": [
                    {"request_delete_range": {"key": b64("none")}},
                    {"request_put": {"key": b64("x"), "value": b64("x")}},
                    {"request_txn": {}},
                ],
            },
        )
        # etcd 3.4: succeeded absent (false); a nested txn's header is {} and an empty
        # nested txn "succeeded"
        assert (status, body) == (
            200,
            {
                "header": hdr(3),
                "responses": [
                    {"response_delete_range": {"header": {"revision": "2"}}},
                    {"response_put": {"header": {"revision": "3"}}},
                    {"response_txn": {"header": {}, "succeeded": True}},
                ],
            },
        )


async def test_empty_txn_succeeds_and_every_compare_target_decodes() -> None:
    async with serve() as api:
        # etcd 3.4: {} -> {"header":...,"succeeded":true}
        assert await api.post("/v3/kv/txn", {}) == (200, {"header": hdr(1), "succeeded": True})
        await api.post("/v3/kv/put", {"key": b64("k"), "value": b64("v")})
        cases = [
            ({"target": "VERSION", "result": "EQUAL", "version": "1"}, True),
            ({"target": "CREATE", "result": "LESS", "create_revision": 100}, True),
            ({"target": "MOD", "result": "GREATER", "mod_revision": "1"}, True),
            ({"target": "VALUE", "result": "NOT_EQUAL", "value": b64("v")}, False),
            ({"target": "LEASE", "result": "EQUAL", "lease": "0"}, True),
            ({"target": 4, "result": 3, "lease": "0"}, False),  # numbers: LEASE NOT_EQUAL
        ]
        for compare, expected in cases:
            _, body = await api.post("/v3/kv/txn", {"compare": [{"key": b64("k"), **compare}]})
            assert body.get("succeeded", False) is expected, compare


async def test_compaction_and_compacted_reads() -> None:
    async with serve() as api:
        for i in range(3):
            await api.post("/v3/kv/put", {"key": b64("foo"), "value": b64(str(i))})
        assert await api.post("/v3/kv/compaction", {"revision": "3"}) == (200, {"header": hdr(4)})
        compacted = {
            "error": "etcdserver: mvcc: required revision has been compacted",
            "message": "etcdserver: mvcc: required revision has been compacted",
            "code": 11,
        }
        # etcd 3.4 gateway answers 400 with code 11 (OutOfRange) for both
        assert await api.post("/v3/kv/compaction", {"revision": "3"}) == (400, compacted)
        assert await api.post("/v3/kv/range", {"key": b64("foo"), "revision": "2"}) == (
            400,
            compacted,
        )
        future = "etcdserver: mvcc: required revision is a future revision"
        assert await api.post("/v3/kv/compaction", {"revision": "1000"}) == (
            400,
            {"error": future, "message": future, "code": 11},
        )
        # physical is accepted
        status, _ = await api.post("/v3/kv/compaction", {"revision": 4, "physical": True})
        assert status == 200


async def test_maintenance_status_uses_etcd_field_names() -> None:
    async with serve() as api:
        await api.post("/v3/kv/put", {"key": b64("k"), "value": b64("v")})
        status, body = await api.post("/v3/maintenance/status", raw="")
        # etcd 3.4: {"header":{...},"version":"3.4.23","dbSize":"20480","leader":"...",
        #   "raftIndex":"17","raftTerm":"2","raftAppliedIndex":"17","dbSizeInUse":"16384"}
        assert status == 200
        assert list(body) == [
            "header",
            "version",
            "dbSize",
            "leader",
            "raftIndex",
            "raftTerm",
            "raftAppliedIndex",
            "dbSizeInUse",
        ]
        assert body["header"] == hdr(2)
        assert body["version"] == "3.5.0"
        assert body["leader"] == MID and body["raftTerm"] == "2"
        assert body["raftIndex"] == body["raftAppliedIndex"] == "2"


@pytest.mark.parametrize(
    "path",
    sorted(
        p
        for p in v3.IMPLEMENTED  # auth: tests/auth
        if not p.startswith("/auth/")
    ),
)
async def test_v3beta_alias_answers_like_v3(path: str) -> None:
    async with serve() as api:
        await api.post("/v3/kv/put", {"key": b64("k"), "value": b64("v")})
        body = {"revision": "1"} if path.endswith("compaction") else {"key": b64("k")}
        if path.endswith("status") or path.startswith("/cluster/"):
            body = {}
        if path.startswith("/cluster/member/") and not path.endswith("list"):
            added = await api.service.member_add(["http://127.0.0.1:1"], True)
            body = {"ID": str(added.member.id), "peerURLs": ["http://127.0.0.1:3"]}
            if path.endswith("add"):
                body = {"peerURLs": ["http://127.0.0.1:2"], "isLearner": True}
                await api.service.member_remove(added.member.id)
        if "lease" in path:
            lease_id = (await api.service.lease_grant(60)).lease_id
            body = {"ID": str(lease_id), "TTL": "60"}
            if path.endswith("grant"):
                body = {"TTL": "60"}
        if path.endswith("transfer-leadership"):
            body = {"targetID": MID}  # to itself: done at once
        beta = await api.post("/v3beta" + path, body)
        assert beta[0] == 200
        if path in ("/kv/range", "/maintenance/status", "/maintenance/hashkv"):  # reads
            assert beta == await api.post("/v3" + path, body)


@pytest.mark.parametrize("path", ["/v3/maintenance/downgrade", "/v3beta/maintenance/downgrade"])
async def test_unserved_etcd_endpoints_are_501_in_etcd_shape(path: str) -> None:
    async with serve() as api:
        status, body = await api.post(path, {"version": "3.4.0"})
        assert status == 501
        assert body["code"] == GrpcCode.UNIMPLEMENTED == 12
        assert body["error"] == body["message"] and "not supported" in body["error"]


async def test_unknown_path_and_wrong_method() -> None:
    async with serve() as api:
        # etcd answers a plain-text 404/405; we answer in its JSON error shape
        status, body = await api.post("/v3/kv/nothing", {})
        assert status == 404 and body["code"] == 5 and "no such endpoint" in body["error"]
        status, raw, _ = await api.request("GET", "/v3/kv/range")
        assert status == 405 and b'"code":12' in raw
        status, raw, _ = await api.request("GET", "/v3/lease/grant")
        assert status == 405


async def test_retried_write_with_same_request_id_applies_once() -> None:
    async with serve() as api:
        ids = {"X-Raftkv-Client-Id": "77", "X-Raftkv-Request-Id": "1"}
        first = await api.post("/v3/kv/put", {"key": b64("k"), "value": b64("v")}, headers=ids)
        again = await api.post("/v3/kv/put", {"key": b64("k"), "value": b64("v")}, headers=ids)
        assert first == again == (200, {"header": hdr(2)})
        assert api.service.store.revision == 2
        ids2 = {**ids, "X-Raftkv-Request-Id": "2"}
        await api.post("/v3/kv/put", {"key": b64("k"), "value": b64("v")}, headers=ids2)
        assert api.service.store.revision == 3
        # deleterange and txn take the ids too
        ids3 = {**ids, "X-Raftkv-Request-Id": "3"}
        for _ in range(2):
            status, _ = await api.post(
                "/v3/kv/txn",
                {"success": [{"request_put": {"key": b64("t"), "value": b64("1")}}]},
                headers=ids3,
            )
            assert status == 200
        assert api.service.store.revision == 4


async def test_service_errors_render_with_their_code_and_status() -> None:
    async with serve() as api:
        api.service.fail_with = no_leader()
        # etcd: "etcdserver: no leader" is Unavailable -> 503
        msg = "etcdserver: no leader"
        assert await api.post("/v3/kv/put", {"key": b64("k")}) == (
            503,
            {"error": msg, "message": msg, "code": 14},
        )
        api.service.fail_with = ServiceError(
            GrpcCode.DEADLINE_EXCEEDED, "etcdserver: request timed out"
        )
        status, body = await api.post("/v3/kv/range", {"key": b64("k")})
        assert (status, body["code"]) == (504, 4)


async def test_unexpected_exception_is_a_generic_500_and_the_server_lives_on(caplog) -> None:
    async with serve() as api:
        api.service.fail_with = RuntimeError("secret internals")
        status, body = await api.post("/v3/kv/put", {"key": b64("k")})
        assert status == 500
        assert body == {
            "error": "raftkv: internal error",
            "message": "raftkv: internal error",
            "code": 13,
        }
        assert "secret internals" in caplog.text  # logged, not shown to the client
        api.service.fail_with = None
        assert (await api.post("/v3/kv/put", {"key": b64("k")}))[0] == 200


async def test_unknown_lease_is_404_not_found() -> None:
    service = LocalKV(store=MVCCStore(lease_exists=lambda lease_id: False))
    async with serve(service) as api:
        msg = "etcdserver: requested lease not found"
        # etcd 3.4 gateway answers 404 {"error": msg, "message": msg, "code": 5}
        assert await api.post("/v3/kv/put", {"key": b64("a"), "lease": "123"}) == (
            404,
            {"error": msg, "message": msg, "code": 5},
        )
        assert api.service.store.revision == 1


async def test_deeply_nested_txn_within_etcds_op_budget_round_trips() -> None:
    async with serve() as api:
        depth = 100  # each level spends one of etcd's 128 ops; deeper is "too many operations"
        inner: dict = {"success": [{"request_put": {"key": b64("deep"), "value": b64("v")}}]}
        for _ in range(depth):
            inner = {"success": [{"request_txn": inner}]}
        status, body = await api.post("/v3/kv/txn", inner)
        assert status == 200 and body["header"]["revision"] == "2"
        for _ in range(depth):
            body = body["responses"][0]["response_txn"]
        assert body == {
            "header": {},
            "succeeded": True,
            "responses": [{"response_put": {"header": {"revision": "2"}}}],
        }
