"""gRPC front-end processes (``--grpc-frontends``): a member hands its clients' HTTP/2
connections to them and serves the calls they pass back.

Three in-process members, each with one front end (a real child process). Checks that:

- every kind of call works through a front end as on the member itself (unary, a server
  stream, bidirectional streams with several watchers, etcd's errors, auth's token), and the
  member's own HTTP/2 server accepts none of those connections, while HTTP/1.1 on the same
  URL still reaches the JSON gateway;
- a watcher that reads slowly still gets every event, in order (the front end pauses the
  member's writes and resumes them);
- a client's cancel and its deadline end the call on the member too;
- a front end killed with SIGKILL is replaced, and clients get through again;
- TLS connections stay on the member;
- stopping the member stops its front ends;
- etcdctl works through a front end;
- the member's end of a link closes on malformed events and nothing raises.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import ssl
import subprocess
import sys
from typing import Any

import aiohttp
import grpc
import msgpack
import pytest

from kvserver.api.grpc import frontend_wire as wire
from kvserver.api.grpc.budgets import BudgetCounts
from kvserver.api.grpc.frontend_link import FrontendLink
from kvserver.api.grpc.metrics import CallCounts
from kvserver.api.grpc.rpc import UNARY_UNARY, Method
from kvserver.assembly.member import Member
from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc
from tests.support.auth_setup import caught_up, enable_auth
from tests.support.etcdctl import AsyncEtcdctl
from tests.support.grpc_members import dial, frontends_ready, refused, target, token
from tests.support.inprocess import configs, running, wait_leader
from tests.support.wait import async_wait_for
from tests.tls.conftest import PKI, cluster_configs

WAIT_S = 20.0


def pool(member: Member) -> Any:
    assert member.grpc is not None and member.grpc.frontends is not None
    return member.grpc.frontends


def frontend_pids(member: Member) -> list[int]:
    return [f.process.pid for f in pool(member).frontends]


def create(**fields: Any) -> rpc_pb2.WatchRequest:
    return rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(**fields))


async def read(call: Any) -> rpc_pb2.WatchResponse:
    resp = await asyncio.wait_for(call.read(), WAIT_S)
    assert resp is not grpc.aio.EOF
    return resp


async def test_calls_through_a_frontend(tmp_path):
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        follower = next(m for m in members if m is not leader)
        async with dial(follower) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            put = await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"1"))
            assert put.header.member_id == follower.member_id
            put = await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"2", prev_kv=True))
            assert put.prev_kv.value == b"1"
            got = await kv.Range(rpc_pb2.RangeRequest(key=b"a", range_end=b"c"))
            assert [(x.key, x.value) for x in got.kvs] == [(b"a", b"2")]
            assert await refused(kv.Put(rpc_pb2.PutRequest(key=b"", value=b"x"))) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "etcdserver: key is not provided",
            )
            await kv.Compact(rpc_pb2.CompactionRequest(revision=put.header.revision))
            assert await refused(kv.Range(rpc_pb2.RangeRequest(key=b"a", revision=2))) == (
                grpc.StatusCode.OUT_OF_RANGE,
                "etcdserver: mvcc: required revision has been compacted",
            )

            # an answer of 3 MiB: many frames, through the front end's flow control
            big = b"b" * (1024 * 1024)
            for name in (b"big1", b"big2", b"big3"):
                await kv.Put(rpc_pb2.PutRequest(key=name, value=big))
            got = await kv.Range(rpc_pb2.RangeRequest(key=b"big", range_end=b"bih"))
            assert [(x.key, x.value == big) for x in got.kvs] == [
                (b"big1", True),
                (b"big2", True),
                (b"big3", True),
            ]

            # a bidirectional stream with two watchers, one with prev_kv
            watch = rpc_pb2_grpc.WatchStub(channel).Watch()
            await watch.write(create(key=b"a", watch_id=7, prev_kv=True))
            await watch.write(create(key=b"b", range_end=b"c", watch_id=8))
            assert {(await read(watch)).watch_id for _ in range(2)} == {7, 8}
            await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"3"))
            await kv.Put(rpc_pb2.PutRequest(key=b"b1", value=b"4"))
            events = [await read(watch) for _ in range(2)]
            assert [(e.watch_id, e.events[0].kv.value) for e in events] == [(7, b"3"), (8, b"4")]
            assert events[0].events[0].prev_kv.value == b"2"
            watch.cancel()

            # a lease and its keep-alive stream
            lease = rpc_pb2_grpc.LeaseStub(channel)
            granted = await lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=30))
            keepalive = lease.LeaseKeepAlive()
            await keepalive.write(rpc_pb2.LeaseKeepAliveRequest(ID=granted.ID))
            answer = await asyncio.wait_for(keepalive.read(), WAIT_S)
            assert answer.ID == granted.ID and answer.TTL == 30
            await keepalive.done_writing()
            assert await asyncio.wait_for(keepalive.read(), WAIT_S) is grpc.aio.EOF

            # a server stream: the snapshot of the member's store
            maintenance = rpc_pb2_grpc.MaintenanceStub(channel)
            chunks = [c async for c in maintenance.Snapshot(rpc_pb2.SnapshotRequest())]
            assert chunks and chunks[-1].remaining_bytes == 0

        url = follower.cfg.advertise_client_urls[0] + "/v3/kv/range"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={"key": "YQ=="}) as resp:  # "a"
                assert (await resp.json())["count"] == "1"
        assert pool(follower).calls_served >= 1
        assert follower.grpc is not None and follower.grpc.connections_accepted == 0
        link = pool(follower).frontends[0].link
        assert link.calls_served >= 10 and not link.calls


async def test_a_slow_watcher_gets_every_event(tmp_path):
    value = b"v" * (256 * 1024)
    puts = 24  # 6 MiB of events: several times what a stream may have unsent
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        async with dial(leader, [("grpc.http2.bdp_probe", 0)]) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            watch = rpc_pb2_grpc.WatchStub(channel).Watch()
            await watch.write(create(key=b"big", watch_id=1))
            assert (await read(watch)).created
            revisions = []
            for i in range(puts):
                put = await kv.Put(rpc_pb2.PutRequest(key=b"big", value=value + str(i).encode()))
                revisions.append(put.header.revision)
            seen = []
            while len(seen) < puts:
                resp = await read(watch)
                seen.extend((e.kv.mod_revision, e.kv.value[-2:]) for e in resp.events)
            assert seen == [(r, (value + str(i).encode())[-2:]) for i, r in enumerate(revisions)]
            watch.cancel()


async def test_a_slow_reader_of_a_stream_pauses_the_member(tmp_path):
    """A server stream the client reads slowly (a snapshot over a window that stays 64 KiB)
    makes the front end ask its member to wait (PAUSE), and every byte still arrives."""
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        async with dial(leader, [("grpc.http2.bdp_probe", 0)]) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            for i in range(24):  # 6 MiB: several times what a stream may have unsent
                await kv.Put(rpc_pb2.PutRequest(key=b"big%d" % i, value=b"v" * (256 * 1024)))
            chunks = rpc_pb2_grpc.MaintenanceStub(channel).Snapshot(rpc_pb2.SnapshotRequest())
            size = 0
            async for chunk in chunks:
                size += len(chunk.blob)
                await asyncio.sleep(0.001)  # a slow reader
            assert size > 6 * 1024 * 1024
        assert pool(leader).frontends[0].link.pauses >= 1


async def test_watchers_of_one_prefix_are_one_watcher_at_the_member(tmp_path):
    """100 watchers on one prefix, over 4 connections through a front end, are one watcher
    in the member's hub; each gets the event."""
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        channels = [dial(leader) for _ in range(4)]
        try:
            calls = [rpc_pb2_grpc.WatchStub(channel).Watch() for channel in channels]
            for call in calls:
                for _ in range(25):
                    await call.write(create(key=b"p/", range_end=b"p0"))
            for call in calls:
                assert all([(await read(call)).created for _ in range(25)])
            assert leader.kv.watch_hub.watcher_count == 1
            put = await rpc_pb2_grpc.KVStub(channels[0]).Put(
                rpc_pb2.PutRequest(key=b"p/1", value=b"v")
            )
            for call in calls:
                got = [await read(call) for _ in range(25)]
                assert sorted(r.watch_id for r in got) == list(range(25))
                assert {(r.events[0].kv.key, r.header.revision) for r in got} == {
                    (b"p/1", put.header.revision)
                }
        finally:
            for channel in channels:
                await channel.close()
        await async_wait_for(lambda: leader.kv.watch_hub.watcher_count == 0, WAIT_S, "gone")


async def test_cancel_and_deadline_end_the_call_on_the_member(tmp_path):
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        hub = leader.kv.watch_hub
        link = pool(leader).frontends[0].link
        async with dial(leader) as channel:
            stub = rpc_pb2_grpc.WatchStub(channel)
            watch = stub.Watch()
            await watch.write(create(key=b"x"))
            assert (await read(watch)).created
            assert link.watches is not None
            assert len(link.watches.clients) == 1 and hub.watcher_count == 1
            watch.cancel()
            await async_wait_for(lambda: not link.watches.clients, WAIT_S, "the call gone")
            await async_wait_for(lambda: hub.watcher_count == 0, WAIT_S, "the watcher gone")

            timed = stub.Watch(timeout=0.5)
            await timed.write(create(key=b"y"))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while True:
                    assert await asyncio.wait_for(timed.read(), WAIT_S) is not grpc.aio.EOF
            assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            await async_wait_for(lambda: not link.watches.clients, WAIT_S, "the expired one gone")
            await async_wait_for(lambda: hub.watcher_count == 0, WAIT_S, "its watcher gone")


async def test_auth_token_through_a_frontend(tmp_path):
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        tokens = await enable_auth(leader)
        await caught_up(leader, leader)
        async with dial(leader) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            code, details = await refused(kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v")))
            assert code is grpc.StatusCode.INVALID_ARGUMENT
            assert details == "etcdserver: user name is empty"
            await kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v"), metadata=token(tokens.root))
            got = await kv.Range(rpc_pb2.RangeRequest(key=b"k"), metadata=token(tokens.root))
            assert got.kvs[0].value == b"v"
        assert pool(leader).calls_served >= 1


async def test_a_killed_frontend_is_replaced(tmp_path):
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        (pid,) = frontend_pids(leader)
        async with dial(leader) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"1"))
            os.kill(pid, signal.SIGKILL)
            await async_wait_for(
                lambda: pool(leader).started == 2 and pool(leader).ready == 1,
                WAIT_S,
                "a new front end",
            )
            assert frontend_pids(leader) != [pid]

            async def put_again() -> bool:
                try:
                    await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"2"), timeout=2.0)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    )
                    return False
                return True

            deadline = asyncio.get_running_loop().time() + WAIT_S
            while not await put_again():
                assert asyncio.get_running_loop().time() < deadline, "no put got through"
                await asyncio.sleep(0.1)
        assert pool(leader).calls_served >= 1


async def test_clients_the_member_accepted_meanwhile_move_to_the_new_frontend(tmp_path):
    """While no front end is ready the member accepts its clients itself; once one is, the
    connections it accepted meanwhile are sent away (GOAWAY; HTTP/1.1 closed), so no client
    keeps its calls on the raft loop for the life of its connection."""
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        assert leader.grpc is not None
        (pid,) = frontend_pids(leader)
        os.kill(pid, signal.SIGKILL)
        await async_wait_for(lambda: pool(leader).ready == 0, WAIT_S, "the front end gone")
        host, port = target(leader).rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive
        assert b" 200 " in await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT_S)
        async with dial(leader) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"1"))
            assert leader.grpc.open_connections == 1  # the member serves it
            served = pool(leader).calls_served
            await async_wait_for(lambda: pool(leader).ready == 1, WAIT_S, "a new front end")
            await async_wait_for(
                lambda: leader.grpc is not None and leader.grpc.open_connections == 0,
                WAIT_S,
                "the member's gRPC connection sent away",
            )
            await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"2"), timeout=WAIT_S)
            assert pool(leader).calls_served == served + 1  # through the new front end
        await asyncio.wait_for(reader.read(), WAIT_S)  # the rest of the answer, then EOF
        assert reader.at_eof()  # the member closed its HTTP/1.1 connection too
        writer.close()


async def test_tls_terminates_in_the_frontends(tmp_path):
    """On an https client URL the front ends accept and terminate TLS: gRPC is served there,
    and HTTP/1.1 is relayed to the member, which still sees the client's verified
    certificate (auth by certificate works through the relay)."""
    pki = PKI(tmp_path / "pki")
    server = pki.pair("member")
    client = pki.pair("root")
    cfgs = cluster_configs(
        tmp_path,
        client="https",
        cert_file=server.cert,
        key_file=server.key,
        trusted_ca_file=pki.ca_file,
        client_cert_auth=True,
        grpc_frontends=1,
    )
    url = cfgs[0].advertise_client_urls[0]
    async with running(cfgs) as members:
        await wait_leader(members)
        await frontends_ready(members)
        member = next(m for m in members if m.cfg.advertise_client_urls[0] == url)
        with (
            open(pki.ca_file, "rb") as ca,
            open(client.key, "rb") as k,
            open(client.cert, "rb") as c,
        ):
            creds = grpc.ssl_channel_credentials(ca.read(), k.read(), c.read())
        async with grpc.aio.secure_channel(url.removeprefix("https://"), creds) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            await kv.Put(rpc_pb2.PutRequest(key=b"t", value=b"1"))
            assert (await kv.Range(rpc_pb2.RangeRequest(key=b"t"))).kvs[0].value == b"1"
        assert member.grpc is not None and member.grpc.connections_accepted == 0
        assert pool(member).calls_served >= 2
        ssl_ctx = ssl.create_default_context(cafile=pki.ca_file)
        ssl_ctx.load_cert_chain(client.cert, client.key)
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/health", ssl=ssl_ctx) as resp:
                assert resp.status == 200
            body = {"key": "dA=="}  # "t"
            async with http.post(url + "/v3/kv/range", json=body, ssl=ssl_ctx) as resp:
                assert resp.status == 200
                assert (await resp.json())["kvs"][0]["value"] == "MQ=="
        assert pool(member).handed_off >= 1  # relayed


async def test_plain_http_goes_to_the_member_whole(tmp_path):
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        url = leader.cfg.advertise_client_urls[0]
        async with aiohttp.ClientSession() as http:
            for _ in range(3):
                async with http.get(url + "/health") as resp:
                    assert resp.status == 200
        assert pool(leader).handed_off >= 1
        assert leader.grpc is not None and leader.grpc.connections_accepted == 0


async def test_stopping_the_member_stops_its_frontends(tmp_path):
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        await wait_leader(members)
        await frontends_ready(members)
        processes = [f.process for m in members for f in pool(m).frontends]
        assert len(processes) == 3 and all(p.poll() is None for p in processes)
    assert all(p.poll() is not None for p in processes)


async def test_etcdctl_through_a_frontend(tmp_path):
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        ctl = AsyncEtcdctl([target(leader)])
        assert (await ctl.run("put", "foo", "bar")).strip() == "OK"
        assert (await ctl.run("get", "foo")).split() == ["foo", "bar"]
        status = await ctl.json("endpoint", "status")
        assert status[0]["Status"]["header"]["member_id"] == leader.member_id
        assert pool(leader).calls_served >= 3


# --- the member's end of a link, fed bytes directly ----------------------------------------------


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def echo(request: Any, context: Any) -> bytes:
    return bytes(request)


class Raw:
    @staticmethod
    def FromString(data: bytes) -> bytes:  # noqa: N802
        return data


def new_link() -> tuple[FrontendLink, FakeTransport]:
    methods = {"/t.T/Echo": Method(echo, Raw, UNARY_UNARY)}
    link = FrontendLink(methods, CallCounts(), ({"/t.T/Echo": UNARY_UNARY}, 1 << 20, 5, 7200, 20))
    transport = FakeTransport()
    link.connection_made(transport)
    return link, transport


def events(transport: FakeTransport) -> list[tuple[Any, ...]]:
    unpacker = wire.unpacker()
    unpacker.feed(bytes(transport.written))
    return list(unpacker)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xc1",  # never used in msgpack
        msgpack.packb((99, 1)),  # an unknown event
        msgpack.packb((wire.CALL, 1, "/t.T/Nope", [], None, "", b"")),  # an unknown method
        msgpack.packb((wire.CALL, 1, "/t.T/Echo")),  # too short
        msgpack.packb("not an event"),
    ],
)
async def test_a_link_closes_on_malformed_events(garbage):
    link, transport = new_link()
    link.data_received(garbage)
    assert transport.closed


async def test_a_link_serves_calls_and_ignores_events_of_ended_ones():
    link, transport = new_link()
    call = (wire.CALL, 1, "/t.T/Echo", [["k", "v"]], 5.0, "127.0.0.1:1", b"hi")
    link.data_received(msgpack.packb(call) + msgpack.packb((wire.CANCEL, 42)))
    await async_wait_for(lambda: len(events(transport)) == 2, WAIT_S, "HELLO and the reply")
    assert events(transport)[1] == (wire.REPLY, 1, b"hi")
    assert not transport.closed and not link.calls
    link.data_received(msgpack.packb((wire.MSG, 1, b"late")))  # the call has ended
    assert not transport.closed


async def test_a_frontend_has_a_budget_of_calls_in_flight_at_its_member():
    """Calls past ``max_calls`` end at once with RESOURCE_EXHAUSTED; a canceled call keeps
    its place until its handler has ended."""
    release = asyncio.Event()

    async def hold(request: Any, context: Any) -> bytes:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()  # ends a while after the front end canceled it
            raise
        return b""

    methods = {"/t.T/Hold": Method(hold, Raw, UNARY_UNARY)}
    budgets = BudgetCounts()
    link = FrontendLink(
        methods, CallCounts(), ({}, 1 << 20, 5, 7200, 20), max_calls=2, budgets=budgets
    )
    transport = FakeTransport()
    link.connection_made(transport)
    for call_id in (1, 2):
        link.data_received(msgpack.packb((wire.CALL, call_id, "/t.T/Hold", [], None, "a:1", b"")))
    await asyncio.sleep(0)
    link.data_received(msgpack.packb((wire.CANCEL, 1)) + msgpack.packb((wire.CANCEL, 2)))
    link.data_received(msgpack.packb((wire.CALL, 3, "/t.T/Hold", [], None, "a:1", b"")))
    exhausted = int(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
    await async_wait_for(lambda: len(events(transport)) == 2, WAIT_S, "the refusal")
    assert events(transport)[1][:3] == (wire.END, 3, exhausted)
    assert budgets["calls_in_flight"] == 1
    release.set()
    await async_wait_for(lambda: link.running == 0, WAIT_S, "the canceled handlers end")
    link.data_received(msgpack.packb((wire.CALL, 4, "/t.T/Hold", [], None, "a:1", b"")))
    await asyncio.sleep(0)
    assert link.running == 1 and budgets["calls_in_flight"] == 1
    link.connection_lost(None)


async def test_health_says_how_many_frontends_serve(tmp_path):
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        async with aiohttp.ClientSession() as http:
            async with http.get(leader.cfg.advertise_client_urls[0] + "/health") as resp:
                assert await resp.json() == {"health": "true", "frontends": "1/1"}


async def test_a_big_http_request_goes_through_a_frontend(tmp_path):
    """A request whose first read is big (here a 1 MiB value) is passed whole, or relayed
    when it does not fit one hand-off message: either way the member serves it."""
    async with running(configs(tmp_path, grpc_frontends=1)) as members:
        leader = await wait_leader(members)
        await frontends_ready(members)
        url = leader.cfg.advertise_client_urls[0]
        value = base64.b64encode(b"v" * (1 << 20)).decode()
        async with aiohttp.ClientSession() as http:
            body = {"key": "Yg==", "value": value}
            async with http.post(url + "/v3/kv/put", json=body) as resp:
                assert resp.status == 200, await resp.text()
            async with http.post(url + "/v3/kv/range", json={"key": "Yg=="}) as resp:
                assert (await resp.json())["kvs"][0]["value"] == value
        assert pool(leader).handed_off >= 1


def test_a_frontend_of_other_code_than_its_member_exits():
    """A front end restarted from files that changed under its running member reads another
    link version in the member's HELLO and exits (the member serves its clients meanwhile)."""
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    handoff_here, handoff_there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with here, handoff_here:
        with there, handoff_there:
            fds = (there.fileno(), handoff_there.fileno())
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvserver.api.grpc.frontend", "--link-fd", str(fds[0]),
                 "--handoff-fd", str(fds[1])],
                pass_fds=fds,
                stderr=subprocess.PIPE,
            )  # fmt: skip
        hello = (wire.HELLO, {}, 1 << 20, 5.0, 2.0, 20.0, {}, None, None, wire.LINK_VERSION - 1)
        here.sendall(msgpack.packb(hello, use_bin_type=True))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert b"another version of the link" in err
