"""Peer TLS: members in one event loop, real transport over https.

Pinned here: three members with https peer URLs and --peer-client-cert-auth elect a leader
and replicate; a member whose certificate comes from another CA is refused at the handshake
by the others (it cannot stream, never learns a write) while the two good members keep
committing; a bare TLS connection to a peer port without a certificate, or with one from
another CA, gets no answer from the peer API.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest

from kvserver.kvpb.kv import PutRequest, RangeRequest
from tests.support.inprocess import running, wait_leader
from tests.support.wait import async_wait_for
from tests.tls.conftest import cluster_configs


def _peer_flags(pki, pair) -> dict:
    return {
        "peer_cert_file": pair.cert,
        "peer_key_file": pair.key,
        "peer_trusted_ca_file": pki.ca_file,
        "peer_client_cert_auth": True,
    }


async def test_three_members_with_peer_client_cert_auth_form_and_replicate(tmp_path, pki):
    pair = pki.pair("member")
    cfgs = cluster_configs(tmp_path, size=3, peer="https", **_peer_flags(pki, pair))

    async with running(cfgs) as members:
        leader = await wait_leader(members, 30)
        follower = next(m for m in members if m is not leader)
        for i in range(20):
            await follower.node.sm.put(PutRequest(b"k%d" % i, b"v"))
        target = leader.node.sm.store.revision
        await async_wait_for(
            lambda: all(m.node.sm.store.revision == target for m in members),
            30,
            "every member at the leader's revision",
        )
        got = await members[2].node.sm.range(RangeRequest(b"k0"))
        assert got.kvs[0].value == b"v"


def _peer_request(url: str, ctx: ssl.SSLContext) -> bytes:
    host, port = url.removeprefix("https://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        tls.sendall(b"GET /raft/members HTTP/1.1\r\nHost: x\r\n\r\n")
        return tls.recv(100)


async def test_a_member_with_a_certificate_from_another_ca_is_refused(tmp_path, pki, other_pki):
    good = pki.pair("member")
    rogue = other_pki.pair("rogue")
    per_member = [{}, {}, {"peer_cert_file": rogue.cert, "peer_key_file": rogue.key}]
    cfgs = cluster_configs(
        tmp_path, size=3, peer="https", per_member=per_member, **_peer_flags(pki, good)
    )

    async with running(cfgs) as members:
        good_members, bad = members[:2], members[2]
        leader = await wait_leader(good_members, 30)
        for i in range(10):
            await leader.node.sm.put(PutRequest(b"k%d" % i, b"v"))
        target = leader.node.sm.store.revision
        await async_wait_for(
            lambda: all(m.node.sm.store.revision == target for m in good_members),
            30,
            "both good members at the leader's revision",
        )
        # The rogue member tried all along (reconnecting with backoff) and got nothing.
        await async_wait_for(
            lambda: bad.transport.failures_by_peer or bad.node.term > 0,
            10,
            "the rogue member to try",
        )
        assert bad.node.sm.store.revision == 1
        assert not any(bad.transport.is_connected(m.member_id) for m in good_members)
        assert not any(m.transport.is_connected(bad.member_id) for m in good_members)
        assert leader.node.leader == leader.member_id  # the cluster kept its leader

        # At the socket: the peer API answers nothing without a certificate of the CA.
        url = leader.cfg.listen_peer_urls[0]
        for pair in (None, rogue):
            ctx = ssl.create_default_context(cafile=pki.ca_file)
            if pair is not None:
                ctx.load_cert_chain(pair.cert, pair.key)
            with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
                got = await asyncio.to_thread(_peer_request, url, ctx)
                assert got == b"", got
                raise ssl.SSLError("closed without an answer")
        ctx = ssl.create_default_context(cafile=pki.ca_file)
        ctx.load_cert_chain(good.cert, good.key)
        assert (await asyncio.to_thread(_peer_request, url, ctx)).startswith(b"HTTP/1.1 200")


async def test_a_follower_forwards_to_the_leaders_https_client_url(tmp_path, pki):
    """Leader-only requests (lease time-to-live here) reach the leader's https client URL
    with the follower's certificate, under --client-cert-auth."""
    import aiohttp

    member = pki.pair("member")
    client = pki.pair("client")
    cfgs = cluster_configs(
        tmp_path,
        size=3,
        client="https",
        cert_file=member.cert,
        key_file=member.key,
        trusted_ca_file=pki.ca_file,
        client_cert_auth=True,
    )

    async with running(cfgs) as members:
        leader = await wait_leader(members, 30)
        follower = next(m for m in members if m is not leader)
        await async_wait_for(
            lambda: all(m.client_urls for m in follower.members),
            30,
            "the follower to know every member's client URL",
        )
        ctx = ssl.create_default_context(cafile=pki.ca_file)
        ctx.load_cert_chain(client.cert, client.key)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
            async with http.post(
                leader.cfg.advertise_client_urls[0] + "/v3/lease/grant", json={"TTL": 60}
            ) as resp:
                assert resp.status == 200, await resp.text()
                lease = (await resp.json())["ID"]
            async with http.post(
                follower.cfg.advertise_client_urls[0] + "/v3/lease/timetolive", json={"ID": lease}
            ) as resp:
                body = await resp.json()
                assert resp.status == 200, body
        assert int(body["TTL"]) > 0
        assert body["header"]["member_id"] == str(leader.member_id)  # the leader answered
