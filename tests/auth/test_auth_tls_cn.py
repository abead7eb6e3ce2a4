"""With ``--client-cert-auth`` the verified certificate's common name is the user (etcd's
``AuthInfoFromTLS``): one in-process TLS member, trustme certificates. A token, when sent,
wins; a common name that is no user is refused; a request marked as forwarded by a member does
not take the connection's certificate as its user."""

from __future__ import annotations

import asyncio
import json
import ssl

import aiohttp
import pytest

from kvserver.client import Client, ClientError
from tests.tls.conftest import cluster_configs

FAST = {"timeout_s": 5.0, "attempt_timeout_s": 2.0, "retries": 2}


def test_certificate_common_name_is_the_user(tmp_path, pki, start_member):
    server = pki.pair("member")
    (cfg,) = cluster_configs(
        tmp_path,
        client="https",
        cert_file=server.cert,
        key_file=server.key,
        trusted_ca_file=pki.ca_file,
        client_cert_auth=True,
    )
    m = start_member(cfg)
    m.wait_leader()

    def as_cert(cn: str, **creds) -> Client:
        pair = pki.pair(f"client-{cn}", common_name=cn)
        return Client(
            m.url, ca_file=pki.ca_file, cert_file=pair.cert, key_file=pair.key, **FAST, **creds
        )

    with as_cert("root") as root:
        for op, body in (
            ("user/add", {"name": "root", "password": "rootpw"}),
            ("user/grant", {"user": "root", "role": "root"}),
            ("role/add", {"name": "app"}),
            (
                "role/grant",
                {
                    "name": "app",
                    "perm": {"permType": "READWRITE", "key": "YS8=", "range_end": "YTA="},
                },
            ),
            ("user/add", {"name": "alice", "password": "alicepw"}),
            ("user/grant", {"user": "alice", "role": "app"}),
            ("enable", {}),
        ):
            root.auth_request(op, body)
        # auth is on: the root certificate alone is the root user (no token, no password)
        assert root.auth_request("user/list")["users"] == ["alice", "root"]
        root.put("b/secret", "s")
    with as_cert("alice") as alice:
        alice.put("a/1", "x")
        assert alice.get("a/1").value == b"x"
        with pytest.raises(ClientError, match="permission denied"):
            alice.get("b/secret")
        with pytest.raises(ClientError, match="permission denied"):
            alice.auth_request("user/list")
    with as_cert("mallory") as mallory, pytest.raises(ClientError, match="permission denied"):
        mallory.put("a/2", "x")
    with as_cert("alice", user="root", password="rootpw") as token_wins:
        assert token_wins.get("b/secret").value == b"s"
    revision = m.revision()

    async def forwarded_put() -> tuple[int, dict]:
        pair = pki.pair("client-root2", common_name="root")
        ctx = ssl.create_default_context(cafile=pki.ca_file)
        ctx.load_cert_chain(pair.cert, pair.key)
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s,
            s.post(
                m.url + "/v3/kv/put",
                data=json.dumps({"key": "YS8z", "value": "eA=="}),
                headers={"X-Raftkv-Forwarded": "1"},
            ) as resp,
        ):
            return resp.status, await resp.json()

    status, body = asyncio.run(forwarded_put())
    assert status == 400 and body["message"] == "etcdserver: user name is empty"
    assert m.revision() == revision
