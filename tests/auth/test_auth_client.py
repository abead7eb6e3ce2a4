"""The client library's ``user``/``password`` against the real API with auth (in process, over
``LocalKV`` with a locally applying ``AuthService``): lazy authentication, the token in the
``Authorization`` header, one re-authentication on ``invalid auth token`` (a restarted member
forgets its tokens) and on ``user name is empty`` (auth enabled after the client looked),
watches, and errors that are not retried."""

from __future__ import annotations

import asyncio

import pytest

from kvserver.client import AsyncClient, Client, ClientError, InvalidArgumentError
from tests.client.fakeserver import FAST

from .helpers import AuthServed

ALICE = dict(user="alice", password="alicepw")
ROOT = dict(user="root", password="rootpw")


def setup_auth(c: Client, *, enable: bool = True) -> None:
    """root (root role), alice (readwrite on "a/"), auth enabled — through the client."""
    c.auth_request("user/add", {"name": "root", "password": "rootpw"})
    c.auth_request("user/grant", {"user": "root", "role": "root"})
    c.auth_request("role/add", {"name": "app"})
    c.auth_request(
        "role/grant",
        {"name": "app", "perm": {"permType": "READWRITE", "key": "YS8=", "range_end": "YTA="}},
    )  # a/ .. a0
    c.auth_request("user/add", {"name": "alice", "password": "alicepw"})
    c.auth_request("user/grant", {"user": "alice", "role": "app"})
    if enable:
        c.auth_request("enable")


@pytest.fixture
def served():
    s = AuthServed().start()
    yield s
    s.close()


def test_user_reads_and_writes_its_prefix_with_one_authentication(served):
    with Client(served.url, **FAST) as anon:
        setup_auth(anon)
    with Client(served.url, **FAST, **ALICE) as c:
        assert served.authentications == 0  # lazy: nothing before the first call
        c.put("a/1", "x")
        assert c.get("a/1").value == b"x"
        assert c.range("a/", prefix=True).count == 1
        assert served.authentications == 1
        with pytest.raises(ClientError, match="permission denied"):
            c.put("b/1", "x")
        with pytest.raises(ClientError, match="permission denied"):
            c.get("b/1")
    assert served.kv.store.revision == 2  # the refused put changed nothing
    with Client(served.url, **FAST) as anon, pytest.raises(ClientError, match="user name is empty"):
        anon.get("a/1")


def test_reauthenticates_once_when_the_member_forgot_its_tokens(served):
    with Client(served.url, **FAST) as anon:
        setup_auth(anon)
    with Client(served.url, **FAST, **ALICE) as c:
        c.put("a/1", "1")
        served.kv.auth.tokens.clear()  # what a restarted member does
        c.put("a/1", "2")
        assert served.authentications == 2
        assert c.get("a/1").value == b"2" and served.authentications == 2
        assert c.get("a/1").version == 2  # the put before the re-authentication applied once


def test_no_token_while_auth_is_off_then_authenticates_once_enabled(served):
    with Client(served.url, **FAST, **ROOT) as root:
        setup_auth(root, enable=False)  # auth off: the client sends no token
        root.put("k", "v")
        root.auth_request("enable")  # the request that enables carries no token either
        assert root.get("k").value == b"v"  # "user name is empty" -> authenticate -> retry
        assert root.auth_request("status")["enabled"] is True
        users = root.auth_request("user/list")["users"]
        assert users == ["alice", "root"]


def test_wrong_password_is_an_error_and_not_retried(served):
    with Client(served.url, **FAST) as anon:
        setup_auth(anon)
    with Client(served.url, **FAST, user="alice", password="nope") as c:
        with pytest.raises(InvalidArgumentError, match="authentication failed"):
            c.get("a/1")
    assert served.authentications == 1


def test_options_are_checked():
    with pytest.raises(ValueError, match="without password"):
        Client("http://127.0.0.1:1", user="alice")
    with pytest.raises(ValueError, match="without user"):
        Client("http://127.0.0.1:1", password="x")


async def test_concurrent_first_calls_authenticate_once_and_watch_carries_the_token(served):
    with Client(served.url, **FAST) as anon:
        setup_auth(anon)

    async with AsyncClient(served.url, **FAST, **ALICE) as c:
        await asyncio.gather(*(c.put(f"a/{i}", "v") for i in range(8)))
        assert served.authentications == 1
        served.kv.auth.tokens.clear()  # the watch's open re-authenticates too
        async with c.watch("a/", prefix=True) as w:
            await c.put("a/w", "seen")
            event = await asyncio.wait_for(w.__anext__(), 10.0)
            assert event.kv.key == b"a/w"
        assert served.authentications == 2
        with pytest.raises(ClientError, match="permission denied"):
            async with c.watch("b/", prefix=True):
                pass
