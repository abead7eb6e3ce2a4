"""In-process API tests of etcd's auth through the gateway (``tests/api`` helpers over a
``LocalKV`` with an ``AuthService`` applying locally): each attack or mistake gets etcd's
error (code, text, HTTP status) and changes nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ..api.helpers import Api, b64, serve
from .helpers import Clock, auth_kv

WAIT_S = 10.0


async def setup_users(api: Api) -> tuple[str, str]:
    """root (root role) and alice (readwrite on prefix "a/"); auth enabled. Tokens."""
    for path, body in [
        ("/v3/auth/user/add", {"name": "root", "password": "rootpw"}),
        ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
        ("/v3/auth/role/add", {"name": "app"}),
        (
            "/v3/auth/role/grant",
            {
                "name": "app",
                "perm": {"permType": "READWRITE", "key": b64("a/"), "range_end": b64("a0")},
            },
        ),
        ("/v3/auth/user/add", {"name": "alice", "password": "alicepw"}),
        ("/v3/auth/user/grant", {"user": "alice", "role": "app"}),
        ("/v3/auth/enable", {}),
    ]:
        status, out = await api.post(path, body)
        assert status == 200, (path, out)
    root = await token(api, "root", "rootpw")
    alice = await token(api, "alice", "alicepw")
    return root, alice


async def token(api: Api, name: str, password: str) -> str:
    status, out = await api.post("/v3/auth/authenticate", {"name": name, "password": password})
    assert status == 200, out
    return out["token"]


def etcd_error(out: Any, status: int, expect_status: int, code: int, text: str) -> None:
    assert (status, out["code"], out["error"], out["message"]) == (
        expect_status,
        code,
        text,
        text,
    ), (status, out)


async def test_enabling_auth_without_root_is_refused_as_etcd() -> None:
    async with serve(auth_kv()) as api:
        status, out = await api.post("/v3/auth/enable", {})
        etcd_error(out, status, 412, 9, "etcdserver: root user does not exist")
        status, out = await api.post("/v3/auth/status", {})
        assert status == 200 and "enabled" not in out
        # auth disabled: nothing changes, no header needed
        assert (await api.post("/v3/kv/put", {"key": b64("k"), "value": b64("v")}))[0] == 200


async def test_users_roles_and_shapes() -> None:
    async with serve(auth_kv()) as api:
        root, alice = await setup_users(api)
        h = {"Authorization": root}
        status, out = await api.post("/v3/auth/user/list", {}, headers=h)
        assert status == 200 and out["users"] == ["alice", "root"] and "header" in out
        status, out = await api.post("/v3/auth/role/get", {"role": "app"}, headers=h)
        assert out["perm"] == [{"permType": "READWRITE", "key": b64("a/"), "range_end": b64("a0")}]
        status, out = await api.post(
            "/v3/auth/user/get", {"name": "alice"}, headers={"Authorization": alice}
        )
        assert status == 200 and out["roles"] == ["app"]  # oneself: no root needed
        status, out = await api.post("/v3/auth/user/list", {}, headers={"Authorization": alice})
        etcd_error(out, status, 403, 7, "etcdserver: permission denied")
        status, out = await api.post(
            "/v3/auth/user/add", {"name": "alice", "password": "x"}, headers=h
        )
        etcd_error(out, status, 412, 9, "etcdserver: user name already exists")
        status, out = await api.post(
            "/v3/auth/user/grant", {"user": "alice", "role": "nope"}, headers=h
        )
        etcd_error(out, status, 412, 9, "etcdserver: role name not found")
        status, out = await api.post("/v3/auth/status", {})
        assert out["enabled"] is True


async def test_wrong_password_missing_forged_and_expired_tokens() -> None:
    clock = Clock()
    async with serve(auth_kv(clock)) as api:
        _, alice = await setup_users(api)
        before = api.snapshot()
        status, out = await api.post(
            "/v3/auth/authenticate", {"name": "alice", "password": "wrong"}
        )
        etcd_error(
            out, status, 400, 3, "etcdserver: authentication failed, invalid user ID or password"
        )
        put = {"key": b64("a/x"), "value": b64("v")}
        status, out = await api.post("/v3/kv/put", put)
        etcd_error(out, status, 400, 3, "etcdserver: user name is empty")
        status, out = await api.post("/v3/kv/put", put, headers={"Authorization": "forged"})
        etcd_error(out, status, 401, 16, "etcdserver: invalid auth token")
        status, out = await api.post("/v3/kv/put", put, headers={"Authorization": alice + "x"})
        etcd_error(out, status, 401, 16, "etcdserver: invalid auth token")
        assert api.snapshot() == before
        assert (await api.post("/v3/kv/put", put, headers={"Authorization": alice}))[0] == 200
        clock.t += 61  # TTL 60 s since last use
        status, out = await api.post("/v3/kv/put", put, headers={"Authorization": alice})
        etcd_error(out, status, 401, 16, "etcdserver: invalid auth token")


async def test_key_permissions_on_range_put_delete_and_admin_paths() -> None:
    async with serve(auth_kv()) as api:
        _, alice = await setup_users(api)
        h = {"Authorization": alice}
        assert (await api.post("/v3/kv/put", {"key": b64("a/1"), "value": b64("v")}, headers=h))[
            0
        ] == 200
        assert (
            await api.post("/v3/kv/range", {"key": b64("a/"), "range_end": b64("a0")}, headers=h)
        )[0] == 200
        before = api.snapshot()
        for path, body in [
            ("/v3/kv/put", {"key": b64("b"), "value": b64("v")}),
            ("/v3/kv/range", {"key": b64("a/"), "range_end": b64("a1")}),
            ("/v3/kv/deleterange", {"key": b64("\0"), "range_end": b64("\0")}),
            ("/v3/cluster/member/remove", {"ID": "1"}),
            ("/v3/maintenance/snapshot", {}),
        ]:
            status, out = await api.post(path, body, headers=h)
            etcd_error(out, status, 403, 7, "etcdserver: permission denied")
        status, _, _ = await api.request("GET", "/v1/kv/a/1", headers=h)
        assert status == 403  # REST dialect: root only with auth on
        assert api.snapshot() == before
        assert (await api.post("/v3/maintenance/status", {}))[0] == 200  # open, as etcd


async def test_txn_reaching_outside_the_users_range_is_refused_and_changes_nothing() -> None:
    async with serve(auth_kv()) as api:
        _, alice = await setup_users(api)
        h = {"Authorization": alice}
        before = api.snapshot()
        inside = {"request_put": {"key": b64("a/1"), "value": b64("v")}}
        for txn in [
            {"success": [inside, {"request_put": {"key": b64("b/1"), "value": b64("v")}}]},
            {"failure": [{"request_delete_range": {"key": b64("zz")}}], "success": [inside]},
            {
                "compare": [{"key": b64("secret"), "target": "VERSION", "version": "0"}],
                "success": [inside],
            },
            {"success": [{"request_txn": {"success": [{"request_range": {"key": b64("b")}}]}}]},
        ]:
            status, out = await api.post("/v3/kv/txn", txn, headers=h)
            etcd_error(out, status, 403, 7, "etcdserver: permission denied")
        assert api.snapshot() == before
        assert (await api.post("/v3/kv/txn", {"success": [inside]}, headers=h))[0] == 200


async def test_lease_revoke_needs_write_on_every_attached_key() -> None:
    async with serve(auth_kv()) as api:
        root, alice = await setup_users(api)
        lease = (await api.service.lease_grant(60)).lease_id
        for key in ("a/1", "b/1"):
            status, _ = await api.post(
                "/v3/kv/put",
                {"key": b64(key), "value": b64("v"), "lease": str(lease)},
                headers={"Authorization": root},
            )
            assert status == 200
        status, out = await api.post(
            "/v3/lease/revoke", {"ID": str(lease)}, headers={"Authorization": alice}
        )
        etcd_error(out, status, 403, 7, "etcdserver: permission denied")
        assert api.service.lessor.exists(lease)


async def test_brute_force_is_bounded_per_client_address() -> None:
    async with serve(auth_kv(burst=5)) as api:
        await setup_users(api)
        statuses = []
        for _ in range(20):
            status, _ = await api.post(
                "/v3/auth/authenticate", {"name": "alice", "password": "guess"}
            )
            statuses.append(status)
        assert statuses.count(400) == 5 and statuses.count(429) == 15
        status, out = await api.post(
            "/v3/auth/authenticate", {"name": "alice", "password": "alicepw"}
        )
        assert status == 429 and "too many" in out["error"]  # even the right one, for now


async def _lines(resp: Any, n: int) -> list[dict]:
    out = []
    while len(out) < n:
        line = await asyncio.wait_for(resp.content.readline(), WAIT_S)
        assert line, "stream ended early"
        out.append(json.loads(line)["result"])
    return out


async def test_watch_refused_outside_range_and_canceled_when_permission_is_revoked() -> None:
    async with serve(auth_kv()) as api:
        root, alice = await setup_users(api)
        h = {"Authorization": alice}
        resp = await api.client.post(
            "/v3/watch",
            headers=h,
            data=json.dumps({"create_request": {"key": b64("b/"), "range_end": b64("b0")}}),
        )
        first = (await _lines(resp, 1))[0]
        assert first["created"] and first["canceled"]
        assert first["cancel_reason"] == "etcdserver: permission denied"
        resp.close()

        resp = await api.client.post(
            "/v3/watch",
            headers=h,
            data=json.dumps({"create_request": {"key": b64("a/"), "range_end": b64("a0")}}),
        )
        assert (await _lines(resp, 1))[0]["created"]
        await api.post("/v3/kv/put", {"key": b64("a/1"), "value": b64("v")}, headers=h)
        assert (await _lines(resp, 1))[0]["events"][0]["kv"]["key"] == b64("a/1")
        status, _ = await api.post(
            "/v3/auth/role/revoke",
            {"role": "app", "key": b64("a/"), "range_end": b64("a0")},
            headers={"Authorization": root},
        )
        assert status == 200
        last = (await _lines(resp, 1))[0]
        assert last["canceled"] and last["cancel_reason"] == "etcdserver: permission denied"
        resp.close()


async def test_changed_password_and_disable_drop_tokens() -> None:
    async with serve(auth_kv()) as api:
        root, alice = await setup_users(api)
        status, _ = await api.post(
            "/v3/auth/user/changepw",
            {"name": "alice", "password": "n"},
            headers={"Authorization": root},
        )
        assert status == 200
        status, out = await api.post(
            "/v3/kv/range", {"key": b64("a/1")}, headers={"Authorization": alice}
        )
        etcd_error(out, status, 401, 16, "etcdserver: invalid auth token")
        assert (await api.post("/v3/auth/disable", {}, headers={"Authorization": root}))[0] == 200
        assert (await api.post("/v3/kv/range", {"key": b64("b")}))[0] == 200
