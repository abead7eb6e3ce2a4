"""In-process members (tests/support/inprocess.py) as a gRPC client reaches them.

- ``target(member)``: host:port of the member's first advertised client URL, the address
  gRPC dials (etcdctl's ``--endpoints`` takes it too).
- ``dial(member, options)``: a new insecure grpc.aio channel to that address; the caller
  closes it (``async with dial(m) as channel``).
- ``published(members)``: waits, bounded, until every member knows every member of
  ``members`` with its client URLs (each member publishes its own through raft once
  started). A follower forwards leader-only calls to the leader's client URL, and etcdctl's
  ``--cluster`` finds the members' URLs in MemberList, so both need this first.
- ``rpc_error(call)``: awaits a call that must fail (the test fails if it succeeds) and
  returns its ``AioRpcError``; ``refused(call)`` returns that error's (status code, details).
- ``token(value)``: the metadata etcd's clients send an auth token in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest

from kvserver.assembly.member import Member
from tests.support.wait import async_wait_for

PUBLISH_WAIT_S = 15.0


def target(member: Member) -> str:
    return urlsplit(member.cfg.advertise_client_urls[0]).netloc


def dial(member: Member, options: Sequence[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target(member), options=options)


async def published(members: Sequence[Member], timeout_s: float = PUBLISH_WAIT_S) -> None:
    def known() -> bool:
        kvs = [m.kv for m in members]
        return all(
            kv is not None
            and len(kv.members) == len(members)
            and all(info.client_urls for info in kv.members)
            for kv in kvs
        )

    await async_wait_for(known, timeout_s, "every member's client URLs, everywhere")


async def rpc_error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


async def refused(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str | None]:
    err = await rpc_error(call)
    return err.code(), err.details()


def token(value: str) -> tuple[tuple[str, str], ...]:
    return (("token", value),)


async def frontends_ready(
    members: Sequence[Member], count: int = 1, timeout_s: float = 20.0
) -> None:
    """Waits until every member's ``count`` front ends serve (until then the member accepts
    its clients itself, and a test of the front ends would not test them)."""

    def ready() -> bool:
        return all(
            m.grpc is not None and m.grpc.frontends is not None and m.grpc.frontends.ready == count
            for m in members
        )

    await async_wait_for(ready, timeout_s, "every member's front ends ready")
