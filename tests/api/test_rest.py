"""The plain REST dialect (``/v1/kv/{key}``): raw values, URL-decoded byte keys, the JSON
list format of prefix reads, revision headers and JSON errors."""

from __future__ import annotations

import json

from kvserver.mvcc.store import MVCCStore

from .fakes import LocalKV
from .helpers import b64, serve


async def test_put_get_round_trip_of_raw_bytes() -> None:
    async with serve() as api:
        value = bytes(range(256))
        status, body, headers = await api.request("PUT", "/v1/kv/blob", data=value)
        assert (status, json.loads(body)) == (200, {"revision": 2})
        assert headers["X-Raftkv-Revision"] == "2"
        status, body, headers = await api.request("GET", "/v1/kv/blob")
        assert status == 200 and body == value
        assert headers["Content-Type"] == "application/octet-stream"
        assert (
            headers["X-Raftkv-Revision"],
            headers["X-Raftkv-Create-Revision"],
            headers["X-Raftkv-Mod-Revision"],
            headers["X-Raftkv-Version"],
            headers["X-Raftkv-Lease"],
        ) == ("2", "2", "2", "1", "0")


async def test_keys_are_url_decoded_bytes_and_may_contain_slashes() -> None:
    async with serve() as api:
        cases = {
            "/v1/kv/jobs/42/state": b"jobs/42/state",
            "/v1/kv/a%2Fb": b"a/b",
            "/v1/kv/bin%FF%00x": b"bin\xff\x00x",
            "/v1/kv/sp%20ace+plus": b"sp ace+plus",
            "/v1/kv/%C3%A9t%C3%A9": "été".encode(),
        }
        for path, key in cases.items():
            status, _, _ = await api.request("PUT", path, data=path.encode())
            assert status == 200, path
            assert api.service.store.get(key).value == path.encode(), path
            status, body, _ = await api.request("GET", path)
            assert (status, body) == (200, path.encode())


async def test_put_with_prev_kv_and_lease() -> None:
    async with serve() as api:
        await api.request("PUT", "/v1/kv/k", data=b"one")
        status, body, _ = await api.request("PUT", "/v1/kv/k?prev_kv=true&lease=7", data=b"two")
        assert status == 200
        assert json.loads(body) == {
            "revision": 3,
            "prev_kv": {
                "key": "k",
                "value": "one",
                "create_revision": 2,
                "mod_revision": 2,
                "version": 1,
                "lease": 0,
            },
        }
        assert api.service.store.get(b"k").lease == 7


async def test_prefix_list_format_text_and_base64() -> None:
    async with serve() as api:
        await api.request("PUT", "/v1/kv/p/a", data=b"alpha")
        await api.request("PUT", "/v1/kv/p/b%FF", data=b"\xfe\x00")
        await api.request("PUT", "/v1/kv/q", data=b"other")
        status, body, headers = await api.request("GET", "/v1/kv/p/?prefix=true")
        assert status == 200
        # UTF-8 bytes as text; other bytes as *_b64; exactly one form per field
        assert json.loads(body) == [
            {
                "key": "p/a",
                "value": "alpha",
                "create_revision": 2,
                "mod_revision": 2,
                "version": 1,
                "lease": 0,
            },
            {
                "key_b64": b64(b"p/b\xff"),
                "value_b64": b64(b"\xfe\x00"),
                "create_revision": 3,
                "mod_revision": 3,
                "version": 1,
                "lease": 0,
            },
        ]
        assert (
            headers["X-Raftkv-Revision"],
            headers["X-Raftkv-Count"],
            headers["X-Raftkv-More"],
        ) == ("4", "2", "false")
        _, body, _ = await api.request("GET", "/v1/kv/p/?prefix=true&encoding=base64")
        assert [kv["key_b64"] for kv in json.loads(body)] == [b64("p/a"), b64(b"p/b\xff")]
        assert all("key" not in kv and "value" not in kv for kv in json.loads(body))
        _, body, headers = await api.request("GET", "/v1/kv/p?prefix&limit=1&keys_only=1")
        assert json.loads(body) == [
            {"key": "p/a", "create_revision": 2, "mod_revision": 2, "version": 1, "lease": 0}
        ]
        assert (headers["X-Raftkv-Count"], headers["X-Raftkv-More"]) == ("2", "true")
        # all keys
        _, body, _ = await api.request("GET", "/v1/kv/?prefix=true")
        assert len(json.loads(body)) == 3
        _, body, _ = await api.request("GET", "/v1/kv?prefix=true")
        assert len(json.loads(body)) == 3
        # an empty match is an empty list, not a 404
        status, body, _ = await api.request("GET", "/v1/kv/zzz?prefix=true")
        assert (status, json.loads(body)) == (200, [])


async def test_get_at_past_revision_and_serializable() -> None:
    async with serve() as api:
        await api.request("PUT", "/v1/kv/k", data=b"v1")
        await api.request("PUT", "/v1/kv/k", data=b"v2")
        status, body, headers = await api.request("GET", "/v1/kv/k?revision=2")
        assert (status, body) == (200, b"v1")
        status, body, _ = await api.request("GET", "/v1/kv/k?serializable=true")
        assert (status, body) == (200, b"v2")


async def test_missing_key_is_404_with_json_body_and_revision() -> None:
    async with serve() as api:
        await api.request("PUT", "/v1/kv/other", data=b"x")
        for method in ("GET", "DELETE"):
            status, body, headers = await api.request(method, "/v1/kv/missing")
            assert status == 404
            assert json.loads(body) == {
                "error": "raftkv: key not found: missing",
                "code": "NotFound",
            }
            assert headers["X-Raftkv-Revision"] == "2"
        assert api.service.store.revision == 2


async def test_delete_single_prefix_and_prev_kv() -> None:
    async with serve() as api:
        for k in ("d/1", "d/2", "d/3", "e"):
            await api.request("PUT", f"/v1/kv/{k}", data=k.encode())
        status, body, headers = await api.request("DELETE", "/v1/kv/d/1")
        assert (status, json.loads(body)) == (200, {"revision": 6, "deleted": 1})
        assert headers["X-Raftkv-Revision"] == "6"
        status, body, _ = await api.request("DELETE", "/v1/kv/d/?prefix=true&prev_kv=true")
        out = json.loads(body)
        assert status == 200 and out["deleted"] == 2 and out["revision"] == 7
        assert [kv["key"] for kv in out["prev_kvs"]] == ["d/2", "d/3"]
        # a prefix that matches nothing: 200 with deleted 0 (not 404)
        status, body, _ = await api.request("DELETE", "/v1/kv/nothing/?prefix=true")
        assert (status, json.loads(body)) == (200, {"revision": 7, "deleted": 0})
        assert api.service.store.get(b"e") is not None


async def test_retried_rest_put_with_same_ids_applies_once() -> None:
    async with serve() as api:
        ids = {"X-Raftkv-Client-Id": "5", "X-Raftkv-Request-Id": "9"}
        for _ in range(3):
            status, body, _ = await api.request("PUT", "/v1/kv/k", data=b"v", headers=ids)
            assert (status, json.loads(body)) == (200, {"revision": 2})
        assert api.service.store.revision == 2


async def test_store_errors_use_rest_error_shape() -> None:
    service = LocalKV(store=MVCCStore(lease_exists=lambda lease_id: False))
    async with serve(service) as api:
        status, body, headers = await api.request("PUT", "/v1/kv/k?lease=9", data=b"v")
        assert status == 404
        assert json.loads(body) == {
            "error": "etcdserver: requested lease not found",
            "code": "NotFound",
        }
        assert headers["X-Raftkv-Revision"] == "1"
        status, body, _ = await api.request("GET", "/v1/kv/k?revision=99")
        assert status == 400
        assert json.loads(body) == {
            "error": "etcdserver: mvcc: required revision is a future revision",
            "code": "OutOfRange",
        }
