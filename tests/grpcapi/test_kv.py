"""etcd's KV service over gRPC on a member's client URL, beside the HTTP API on the same port.

Three in-process members; the client is grpc.aio with our generated stubs. Checks that the
answers carry etcd's fields, that failures carry etcd's status codes and texts, and that
HTTP/1.1 on the same URL still works.
"""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest

from kvserver.api.grpc import convert
from kvserver.api.grpc.kv import encode_range_in_steps
from kvserver.etcdpb import kv_pb2, rpc_pb2, rpc_pb2_grpc
from kvserver.kvpb import kv as K
from tests.support.grpc_members import dial, refused
from tests.support.inprocess import configs, running, wait_leader


async def test_kv_calls_over_grpc(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        async with dial(follower) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            put = await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"1"))
            assert put.header.revision == 2
            assert put.header.cluster_id == leader.cluster_id
            assert put.header.member_id == follower.member_id
            put = await kv.Put(rpc_pb2.PutRequest(key=b"a", value=b"2", prev_kv=True))
            assert put.prev_kv.value == b"1" and put.prev_kv.version == 1
            await kv.Put(rpc_pb2.PutRequest(key=b"b", value=b"3"))

            got = await kv.Range(rpc_pb2.RangeRequest(key=b"a", range_end=b"c", limit=1))
            assert [(x.key, x.value, x.version) for x in got.kvs] == [(b"a", b"2", 2)]
            assert got.count == 2 and got.more
            old = await kv.Range(rpc_pb2.RangeRequest(key=b"a", revision=2))
            assert old.kvs[0].value == b"1"

            txn = await kv.Txn(
                rpc_pb2.TxnRequest(
                    compare=[
                        rpc_pb2.Compare(
                            key=b"a",
                            target=rpc_pb2.Compare.VALUE,
                            result=rpc_pb2.Compare.EQUAL,
                            value=b"2",
                        )
                    ],
                    success=[
                        rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"c", value=b"4")),
                        rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"b")),
                    ],
                )
            )
            assert txn.succeeded
            assert txn.responses[1].response_range.kvs[0].value == b"3"

            deleted = await kv.DeleteRange(
                rpc_pb2.DeleteRangeRequest(key=b"a", range_end=b"\0", prev_kv=True)
            )
            assert deleted.deleted == 3 and len(deleted.prev_kvs) == 3
            rev = deleted.header.revision
            await kv.Compact(rpc_pb2.CompactionRequest(revision=rev))

            assert await refused(kv.Range(rpc_pb2.RangeRequest(key=b"a", revision=2))) == (
                grpc.StatusCode.OUT_OF_RANGE,
                "etcdserver: mvcc: required revision has been compacted",
            )
            assert await refused(kv.Put(rpc_pb2.PutRequest(key=b"", value=b"x"))) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "etcdserver: key is not provided",
            )
            code, _ = await refused(kv.Range(rpc_pb2.RangeRequest(key=b"a", sort_order=7)))
            assert code is grpc.StatusCode.INVALID_ARGUMENT

        # HTTP/1.1 on the same client URL still reaches the JSON gateway.
        url = follower.cfg.advertise_client_urls[0] + "/v3/kv/range"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={"key": "Yw=="}) as resp:  # "c": deleted above
                assert (await resp.json())["header"]["revision"] == str(rev)
        assert follower.grpc is not None and follower.grpc.connections_accepted >= 1


def test_a_txn_of_one_shared_response_converts_as_one_per_op():
    """The store answers a txn's bare puts with one shared ResponseOp, converted once."""
    h = K.ResponseHeader(1, 2, 300, 4)
    put = K.ResponseOp(response_put=K.PutResponse(K.ResponseHeader(0, 0, 300, 0)))
    prev = K.KeyValue(b"k", b"v", 2, 3, 1)
    with_prev = K.ResponseOp(response_put=K.PutResponse(K.ResponseHeader(0, 0, 300, 0), prev))
    for ops in ((put,) * 100, (with_prev,) * 3, (put, with_prev, put), (put,)):
        r = K.TxnResponse(h, True, ops)
        expected = rpc_pb2.TxnResponse(
            header=convert.header_to_pb(h),
            succeeded=True,
            responses=[
                rpc_pb2.ResponseOp(
                    response_put=rpc_pb2.PutResponse(
                        header=convert.header_to_pb(op.response_put.header),
                        prev_kv=None if op.response_put.prev_kv is None else convert.kv_to_pb(prev),
                    )
                )
                for op in ops
            ],
        )
        assert convert.txn_to_pb(r) == expected


def test_big_range_answer_in_pieces_equals_one_message():
    kvs = tuple(
        K.KeyValue(b"k%05d" % i, b"v" * (i % 7), i + 2, i + 2, 1 + i % 3, i % 2)
        for i in range(5000)
    )
    resp = K.RangeResponse(K.ResponseHeader(1, 2, 5001, 3), kvs, more=True, count=9000)
    pieces = encode_range_in_steps(resp, step=777)
    assert pieces == convert.range_to_pb(resp).SerializeToString()
    decoded = rpc_pb2.RangeResponse.FromString(pieces)
    assert decoded.count == 9000 and decoded.more and len(decoded.kvs) == 5000
    assert decoded.kvs[4999] == kv_pb2.KeyValue(
        key=b"k04999",
        value=b"v" * (4999 % 7),
        create_revision=5001,
        mod_revision=5001,
        version=1 + 4999 % 3,
        lease=1,
    )


async def test_request_size_limits_follow_max_request_bytes(tmp_path):
    limit = 64 * 1024
    async with running(configs(tmp_path, max_request_bytes=limit)) as members:
        await wait_leader(members)
        async with dial(members[0]) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            await kv.Put(rpc_pb2.PutRequest(key=b"fits", value=b"x" * (limit - 100)))
            # over --max-request-bytes but under gRPC's receive limit: etcd's own refusal
            assert await refused(
                kv.Put(rpc_pb2.PutRequest(key=b"big", value=b"x" * (limit + 1)))
            ) == (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large")
            # over --max-request-bytes + 512 KiB: gRPC itself refuses to receive it
            huge = rpc_pb2.PutRequest(key=b"huge", value=b"x" * (limit + 600 * 1024))
            code, _ = await refused(kv.Put(huge))
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
            got = await kv.Range(rpc_pb2.RangeRequest(key=b"\0", range_end=b"\0"))
            assert [x.key for x in got.kvs] == [b"fits"]


@pytest.mark.slow
async def test_an_idle_connection_that_pings_every_six_seconds_is_kept(tmp_path):
    # etcdctl pings every 10 s with no call in flight; gRPC's default server policy (pings
    # no more often than every 5 minutes, GOAWAY after two strikes) would drop it. Six
    # seconds apart, over 20 s, is three pings: enough strikes to be dropped by the default.
    options = [
        ("grpc.keepalive_time_ms", 6000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    async with running(configs(tmp_path)) as members:
        await wait_leader(members)
        async with dial(members[0], options=options) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            await kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v"))
            accepted = members[0].grpc.connections_accepted
            await asyncio.sleep(20)  # idle on purpose: the pings are what is tested
            await kv.Range(rpc_pb2.RangeRequest(key=b"k"))
            assert members[0].grpc.connections_accepted == accepted  # the same connection
