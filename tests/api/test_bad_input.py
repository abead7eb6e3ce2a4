"""Bad input gets a clear 4xx JSON error and changes nothing.

Every case runs against a store holding a few keys; afterwards the revision and the data are
exactly as before, no write reached the service (for input refused by the HTTP layer), and
the node still answers ``/health`` with 200. Comments quote what the etcd 3.4.23 gateway
answered for the same input; where our text differs, status and gRPC code still match.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from .helpers import b64, serve

SMALL_LIMIT = 1024  # max_request_bytes of the app used for the size cases
MAX_BODY = SMALL_LIMIT * 4 // 3 + 512 * 1024

K = b64("k")


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: bytes | str = b""
    status: int = 400
    code: int | str = 3  # gRPC code number (etcd dialect) or name (REST dialect)
    message: str = ""  # a substring the error message must contain
    headers: dict[str, str] = field(default_factory=dict)
    reaches_store: bool = False  # refused by the store (compacted, future revision...)


def put(body: object) -> str:
    return body if isinstance(body, str) else json.dumps(body)


V3_CASES = [
    # etcd: "unexpected EOF"
    Case("truncated JSON", "POST", "/v3/kv/put", '{"key":"Zm9v",', message="invalid JSON"),
    # etcd: "invalid character 'o' in literal null (expecting 'u')"
    Case("not JSON", "POST", "/v3/kv/put", "notjson", message="invalid JSON"),
    Case("not UTF-8", "POST", "/v3/kv/put", b'{"key":"\xff"}', message="invalid JSON"),
    # etcd: "json: cannot unmarshal array into Go value of type map[string]json.RawMessage"
    Case("array body", "POST", "/v3/kv/put", "[]", message="expected a JSON object"),
    Case("string body", "POST", "/v3/kv/range", '"str"', message="expected a JSON object"),
    Case("deeply nested JSON", "POST", "/v3/kv/put", "[" * 100_000, message="invalid JSON"),
    # etcd: "etcdserver: key is not provided" for an empty body, {}, null and ""
    Case("empty body", "POST", "/v3/kv/put", "", message="etcdserver: key is not provided"),
    Case("null body", "POST", "/v3/kv/put", "null", message="etcdserver: key is not provided"),
    Case(
        "empty key",
        "POST",
        "/v3/kv/put",
        put({"key": "", "value": b64("v")}),
        message="etcdserver: key is not provided",
    ),
    Case(
        "missing key range", "POST", "/v3/kv/range", "{}", message="etcdserver: key is not provided"
    ),
    Case(
        "missing key delete",
        "POST",
        "/v3/kv/deleterange",
        put({"key": None}),
        message="etcdserver: key is not provided",
    ),
    # etcd: "json: cannot unmarshal number into Go value of type []uint8"
    Case(
        "key is a number",
        "POST",
        "/v3/kv/put",
        put({"key": 123}),
        message='field "key": expected a base64 string',
    ),
    # etcd: "illegal base64 data at input byte 0"
    Case(
        "bad base64",
        "POST",
        "/v3/kv/put",
        put({"key": "!!!"}),
        message='field "key": invalid base64',
    ),
    Case(
        "base64 of impossible length",
        "POST",
        "/v3/kv/put",
        put({"key": "Zm9vY"}),
        message="invalid base64",
    ),
    Case(
        "non-ASCII base64",
        "POST",
        "/v3/kv/put",
        put({"key": "Zm9v\u00e9"}),
        message="invalid base64",
    ),
    Case(
        "bad base64 value",
        "POST",
        "/v3/kv/put",
        put({"key": K, "value": "%%%"}),
        message='field "value": invalid base64',
    ),
    # etcd: "json: cannot unmarshal number 1.5 into Go value of type int64"
    Case(
        "fractional int64",
        "POST",
        "/v3/kv/range",
        put({"key": K, "limit": 1.5}),
        message='field "limit": expected a 64-bit integer',
    ),
    # etcd: "invalid character 'a' looking for beginning of value"
    Case(
        "int64 text not a number",
        "POST",
        "/v3/kv/range",
        put({"key": K, "limit": "abc"}),
        message='field "limit"',
    ),
    Case(
        "int64 from bool",
        "POST",
        "/v3/kv/range",
        put({"key": K, "revision": True}),
        message='field "revision"',
    ),
    Case(
        "int64 exponent",
        "POST",
        "/v3/kv/range",
        '{"key":"ax==","revision":1e2}',
        message='field "revision"',
    ),
    # etcd: "json: cannot unmarshal number 9223372036854775808 into Go value of type int64"
    Case(
        "int64 overflow",
        "POST",
        "/v3/kv/range",
        put({"key": K, "revision": "9223372036854775808"}),
        message="out of the int64 range",
    ),
    # etcd: "json: cannot unmarshal string into Go value of type bool"
    Case(
        "bool as string",
        "POST",
        "/v3/kv/range",
        put({"key": K, "keys_only": "true"}),
        message='field "keys_only": expected true or false',
    ),
    Case(
        "bool as number",
        "POST",
        "/v3/kv/range",
        put({"key": K, "keys_only": 1}),
        message='field "keys_only"',
    ),
    # etcd: 'unknown value "BOGUS" for enum etcdserverpb.RangeRequest_SortOrder'
    Case(
        "unknown enum name",
        "POST",
        "/v3/kv/range",
        put({"key": K, "sort_order": "BOGUS"}),
        message='unknown value "BOGUS" for enum SortOrder',
    ),
    # etcd 3.4 accepts sort_order 7; etcd 3.6 and we refuse it
    Case(
        "unknown enum number",
        "POST",
        "/v3/kv/range",
        put({"key": K, "sort_order": 7}),
        message="etcdserver: invalid sort option",
    ),
    # etcd: "etcdserver: value is provided"
    Case(
        "ignore_value with value",
        "POST",
        "/v3/kv/put",
        put({"key": K, "ignore_value": True, "value": b64("x")}),
        message="etcdserver: value is provided",
    ),
    Case(
        "ignore_lease with lease",
        "POST",
        "/v3/kv/put",
        put({"key": K, "ignore_lease": True, "lease": "5"}),
        message="etcdserver: lease is provided",
    ),
    # etcd: "etcdserver: key not found" (ignore_value on a missing key; refused by the store)
    Case(
        "ignore_value on missing key",
        "POST",
        "/v3/kv/put",
        put({"key": b64("nope"), "ignore_value": True}),
        message="etcdserver: key not found",
        reaches_store=True,
    ),
    # etcd: "json: cannot unmarshal object into Go value of type []json.RawMessage"
    Case(
        "compare not a list",
        "POST",
        "/v3/kv/txn",
        put({"compare": {"key": K}}),
        message='field "compare": expected a JSON array',
    ),
    # etcd: "json: cannot unmarshal number into Go value of type map[string]json.RawMessage"
    Case(
        "op not an object",
        "POST",
        "/v3/kv/txn",
        put({"success": [1]}),
        message='field "success[0]": expected a JSON object',
    ),
    # etcd 3.4.23's gateway drops the connection (a nil op); etcd's check says key not found
    Case(
        "null op",
        "POST",
        "/v3/kv/txn",
        put({"success": [None]}),
        message="etcdserver: key not found",
    ),
    Case(
        "empty op",
        "POST",
        "/v3/kv/txn",
        put({"success": [{}]}),
        message="etcdserver: key not found",
    ),
    # etcd silently keeps one member of the oneof; we refuse
    Case(
        "two requests in one op",
        "POST",
        "/v3/kv/txn",
        put({"success": [{"request_put": {"key": K}, "request_range": {"key": K}}]}),
        message="exactly one of",
    ),
    # etcd: "etcdserver: key is not provided"
    Case(
        "compare without key",
        "POST",
        "/v3/kv/txn",
        put({"compare": [{"target": "VERSION", "result": "NOT_EQUAL", "version": 0}]}),
        message="etcdserver: key is not provided",
    ),
    # etcd: 'unknown value "NOPE" for enum etcdserverpb.Compare_CompareTarget'
    Case(
        "unknown compare target",
        "POST",
        "/v3/kv/txn",
        put({"compare": [{"key": K, "target": "NOPE", "result": "EQUAL"}]}),
        message='field "compare[0].target": unknown value "NOPE"',
    ),
    Case(
        "bad nested put key",
        "POST",
        "/v3/kv/txn",
        put({"success": [{"request_put": {"key": 5}}]}),
        message='field "success[0].request_put.key"',
    ),
    # etcd: "etcdserver: duplicate key given in txn request"
    Case(
        "duplicate put in txn",
        "POST",
        "/v3/kv/txn",
        put(
            {
                "success": [
                    {"request_put": {"key": K, "value": b64("a")}},
                    {"request_put": {"key": K, "value": b64("b")}},
                ]
            }
        ),
        message="etcdserver: duplicate key given in txn request",
    ),
    Case(
        "too many txn ops",
        "POST",
        "/v3/kv/txn",
        put({"success": [{"request_put": {"key": b64(f"k{i}")}} for i in range(129)]}),
        message="etcdserver: too many operations in txn request",
    ),
    Case(
        "txn nested too deeply",
        "POST",
        "/v3/kv/txn",
        '{"success":[{"request_txn":' * 200 + "{}" + "}]}" * 200,
        message="nested deeper than",
    ),
    # etcd: "etcdserver: mvcc: required revision is a future revision" (code 11)
    Case(
        "future revision",
        "POST",
        "/v3/kv/range",
        put({"key": K, "revision": "100"}),
        code=11,
        message="required revision is a future revision",
        reaches_store=True,
    ),
    Case(
        "compact future revision",
        "POST",
        "/v3/kv/compaction",
        put({"revision": "100"}),
        code=11,
        message="required revision is a future revision",
        reaches_store=True,
    ),
    # etcd: "etcdserver: request is too large" (400) for a decoded request over the limit
    Case(
        "request over max_request_bytes",
        "POST",
        "/v3/kv/put",
        put({"key": K, "value": b64(b"x" * SMALL_LIMIT)}),
        message="etcdserver: request is too large",
    ),
    Case(
        "body over the body limit",
        "POST",
        "/v3/kv/put",
        put({"key": K, "value": b64(b"x" * (MAX_BODY * 3 // 4 + 10))}),
        status=413,
        message="etcdserver: request is too large",
    ),
    Case(
        "body over the body limit, chunked",
        "POST",
        "/v3/kv/txn",
        b" " * (MAX_BODY + 1),
        status=413,
        message="etcdserver: request is too large",
    ),
    # request ids: decimal uint64, both or neither
    Case(
        "client id not a number",
        "POST",
        "/v3/kv/put",
        put({"key": K}),
        headers={"X-Raftkv-Client-Id": "abc", "X-Raftkv-Request-Id": "1"},
        message="X-Raftkv-Client-Id must be a decimal uint64",
    ),
    Case(
        "request id negative",
        "POST",
        "/v3/kv/put",
        put({"key": K}),
        headers={"X-Raftkv-Client-Id": "1", "X-Raftkv-Request-Id": "-1"},
        message="X-Raftkv-Request-Id must be a decimal uint64",
    ),
    Case(
        "request id over uint64",
        "POST",
        "/v3/kv/deleterange",
        put({"key": K}),
        headers={"X-Raftkv-Client-Id": "1", "X-Raftkv-Request-Id": str(1 << 64)},
        message="must be a decimal uint64",
    ),
    Case(
        "request id without client id",
        "POST",
        "/v3/kv/txn",
        "{}",
        headers={"X-Raftkv-Request-Id": "1"},
        message="must be sent together",
    ),
    Case(
        "bad ids on a read",
        "POST",
        "/v3/kv/range",
        put({"key": K}),
        headers={"X-Raftkv-Client-Id": "x", "X-Raftkv-Request-Id": "1"},
        message="decimal uint64",
    ),
    # etcd answers a plain-text "404 page not found" / "Method Not Allowed"
    Case(
        "unknown path",
        "POST",
        "/v3/kv/nothing",
        "{}",
        status=404,
        code=5,
        message="no such endpoint",
    ),
    Case(
        "unknown top-level path", "GET", "/nothing", status=404, code=5, message="no such endpoint"
    ),
    Case("wrong method", "GET", "/v3/kv/put", status=405, code=12, message="not allowed"),
    Case("v3alpha is not served", "POST", "/v3alpha/kv/range", put({"key": K}), status=404, code=5),
]

REST_CASES = [
    Case(
        "empty key put",
        "PUT",
        "/v1/kv/",
        "v",
        code="InvalidArgument",
        message="etcdserver: key is not provided",
    ),
    Case(
        "empty key get",
        "GET",
        "/v1/kv/",
        code="InvalidArgument",
        message="etcdserver: key is not provided",
    ),
    Case(
        "delete everything refused",
        "DELETE",
        "/v1/kv/?prefix=true",
        code="InvalidArgument",
        message="refusing to delete every key",
    ),
    Case(
        "lease not a number",
        "PUT",
        "/v1/kv/k?lease=abc",
        "v",
        code="InvalidArgument",
        message="lease must be a non-negative integer",
    ),
    Case(
        "flag not a bool",
        "PUT",
        "/v1/kv/k?prev_kv=maybe",
        "v",
        code="InvalidArgument",
        message="prev_kv must be true or false",
    ),
    Case(
        "negative revision",
        "GET",
        "/v1/kv/k?revision=-1",
        code="InvalidArgument",
        message="revision must be a non-negative integer",
    ),
    Case(
        "negative limit",
        "GET",
        "/v1/kv/k?prefix=true&limit=-1",
        code="InvalidArgument",
        message="limit must be a non-negative integer",
    ),
    Case(
        "unknown encoding",
        "GET",
        "/v1/kv/k?prefix=true&encoding=hex",
        code="InvalidArgument",
        message="encoding must be text or base64",
    ),
    Case(
        "future revision",
        "GET",
        "/v1/kv/k?revision=100",
        code="OutOfRange",
        message="required revision is a future revision",
        reaches_store=True,
    ),
    Case(
        "value over the limit",
        "PUT",
        "/v1/kv/k",
        b"x" * SMALL_LIMIT,
        status=413,
        code="InvalidArgument",
        message="etcdserver: request is too large",
    ),
    Case(
        "bad request id",
        "DELETE",
        "/v1/kv/k",
        headers={"X-Raftkv-Client-Id": "1", "X-Raftkv-Request-Id": "1.5"},
        code="InvalidArgument",
        message="decimal uint64",
    ),
    Case(
        "unknown REST path",
        "GET",
        "/v1/nothing",
        status=404,
        code="NotFound",
        message="no such endpoint",
    ),
    Case(
        "wrong REST method",
        "POST",
        "/v1/kv/k",
        "v",
        status=405,
        code="Unimplemented",
        message="not allowed",
    ),
]


@pytest.mark.parametrize("case", V3_CASES + REST_CASES, ids=lambda c: c.name)
async def test_bad_input_is_refused_and_changes_nothing(case: Case) -> None:
    async with serve(max_request_bytes=SMALL_LIMIT) as api:
        for key in ("a", "k", "z"):
            await api.post("/v3/kv/put", {"key": b64(key), "value": b64(key)})
        before = api.snapshot()
        calls_before = dict(api.service.calls)
        body = case.body.encode() if isinstance(case.body, str) else case.body
        if case.name.endswith("chunked"):

            async def chunks():
                for i in range(0, len(body), 65536):
                    yield body[i : i + 65536]

            data = chunks()
        else:
            data = body
        status, raw, headers = await api.request(
            case.method, case.path, data=data or None, headers=case.headers
        )
        assert status == case.status, raw[:300]
        assert headers["Content-Type"].startswith("application/json")
        error = json.loads(raw)
        assert error["code"] == case.code, error
        assert case.message in error["error"], error
        if isinstance(case.code, int):
            assert error["message"] == error["error"]  # etcd's shape repeats the text
        else:
            assert set(error) == {"error", "code"}
            assert headers["X-Raftkv-Revision"] == str(before[0])
        assert api.snapshot() == before
        if not case.reaches_store:
            assert dict(api.service.calls) == calls_before, "bad input reached the store"
        status, raw, _ = await api.request("GET", "/health")
        assert (status, raw) == (200, b'{"health":"true"}')


async def test_default_limit_is_etcds_one_and_a_half_mib() -> None:
    async with serve() as api:
        # etcd 3.4 with defaults: a 1.39 MiB value is stored, a 1.5 MiB + 10 B one is
        # "etcdserver: request is too large" (400, code 3), a 2 MiB one never decodes
        status, _ = await api.post("/v3/kv/put", {"key": K, "value": b64(b"x" * 1458176)})
        assert status == 200
        status, body = await api.post("/v3/kv/put", {"key": K, "value": b64(b"x" * 1572874)})
        assert (status, body["code"], body["error"]) == (400, 3, "etcdserver: request is too large")
        status, body = await api.post("/v3/kv/put", {"key": K, "value": b64(b"x" * 2_200_000)})
        assert (status, body["error"]) == (413, "etcdserver: request is too large")
        assert api.service.store.revision == 2
