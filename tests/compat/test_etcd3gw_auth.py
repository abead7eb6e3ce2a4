"""``etcd3gw`` (unmodified) with a user restricted to a prefix, against a three-node raftkv
of real processes and against a real etcd: set up root and a user with
READWRITE on ``app/`` through the v3 auth endpoints, enable auth, authenticate on one member,
and let etcd3gw carry the token (etcd3gw 2.7 has no user/password option; it takes a
``requests.Session``, whose ``Authorization`` header is where etcd's gateway reads the raw
token). The user reads and writes under its prefix through any member (the token is
replicated), is refused outside it with etcd's 403, and after the test auth is disabled
again. This module has its own backends (module scope), so enabling auth disturbs no other
test."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("etcd3gw")
import requests  # noqa: E402
from etcd3gw import exceptions  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.external]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def post(url: str, path: str, body: dict, token: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    if token:
        req.add_header("Authorization", token)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def client_with_token(backend, url: str, token: str):  # type: ignore[no-untyped-def]
    from urllib.parse import urlsplit

    import etcd3gw

    session = requests.Session()
    session.headers["Authorization"] = token
    parts = urlsplit(url)
    return etcd3gw.client(host=parts.hostname, port=parts.port, timeout=10, session=session)


def test_user_restricted_to_a_prefix_through_etcd3gw(backend) -> None:  # type: ignore
    url = backend.leader_url()
    setup = [
        ("/v3/auth/user/add", {"name": "root", "password": "rootpw"}),
        ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
        ("/v3/auth/role/add", {"name": "app"}),
        (
            "/v3/auth/role/grant",
            {
                "name": "app",
                "perm": {"permType": "READWRITE", "key": _b64("app/"), "range_end": _b64("app0")},
            },
        ),
        ("/v3/auth/user/add", {"name": "alice", "password": "alicepw"}),
        ("/v3/auth/user/grant", {"user": "alice", "role": "app"}),
    ]
    status, out = post(url, "/v3/auth/enable", {})
    assert status == 412 and out["error"] == "etcdserver: root user does not exist"
    for path, body in setup:
        status, out = post(url, path, body)
        assert status == 200, (path, out)
    assert post(url, "/v3/auth/enable", {})[0] == 200
    root = None
    try:
        status, out = post(url, "/v3/auth/authenticate", {"name": "root", "password": "rootpw"})
        assert status == 200
        root = out["token"]
        status, out = post(url, "/v3/auth/authenticate", {"name": "alice", "password": "no"})
        assert (status, out["error"]) == (
            400,
            "etcdserver: authentication failed, invalid user ID or password",
        )
        status, out = post(url, "/v3/auth/authenticate", {"name": "alice", "password": "alicepw"})
        alice = out["token"]
        for member_url in {url, backend.follower_url()}:
            c = client_with_token(backend, member_url, alice)
            assert c.put("app/k", "v1") is True
            assert c.get("app/k") == [b"v1"]
            with pytest.raises(exceptions.Etcd3Exception) as caught:
                c.get("other/k")
            assert "permission denied" in str(caught.value.detail_text)
            with pytest.raises(exceptions.Etcd3Exception):
                c.put("other/k", "v")
        anonymous = backend.client(url)
        with pytest.raises(exceptions.Etcd3Exception):
            anonymous.get("app/k")
    finally:
        if root is not None:
            assert post(url, "/v3/auth/disable", {}, root)[0] == 200
