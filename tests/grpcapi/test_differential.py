"""Differential test over gRPC: seeded random requests to a real etcd and to raftkv, the
answers compared field by field.

The requests are those of the gateway's differential test (``tests/support/etcd_requests``:
puts, deletes, ranges with every option, txns, compactions, lease calls), parsed from their
JSON into etcd's protobuf messages (the gateway's JSON is protobuf's JSON mapping). Requests
that only the JSON decoder can refuse (bad base64, wrong types) are not sent: gRPC has no
such input. Each goes to etcd over gRPC, then to a three-member raftkv over gRPC (any member;
keep-alive and time-to-live to any member too: raftkv forwards them to the leader as etcd
does). Answers are compared as protobuf's JSON of the message (int64 as strings, bytes
base64, defaults omitted), without the header's cluster/member ids and term; failures by
gRPC status code and, where the text is etcd's own (``etcdserver: ...``), by text.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc
from tests.etcd_process import etcd_process
from tests.support.etcd_requests import EXPECTED_OUTCOMES, STEPS, Generator, normalize, outcomes
from tests.support.grpc_members import dial
from tests.support.inprocess import configs, running, wait_leader
from tests.support.wait import async_wait_for

pytestmark = [pytest.mark.slow, pytest.mark.external]

CALL_TIMEOUT_S = 10.0
# gateway path -> (stub class, method, request message)
METHODS = {
    "/v3/kv/range": (rpc_pb2_grpc.KVStub, "Range", rpc_pb2.RangeRequest),
    "/v3/kv/put": (rpc_pb2_grpc.KVStub, "Put", rpc_pb2.PutRequest),
    "/v3/kv/deleterange": (rpc_pb2_grpc.KVStub, "DeleteRange", rpc_pb2.DeleteRangeRequest),
    "/v3/kv/txn": (rpc_pb2_grpc.KVStub, "Txn", rpc_pb2.TxnRequest),
    "/v3/kv/compaction": (rpc_pb2_grpc.KVStub, "Compact", rpc_pb2.CompactionRequest),
    "/v3/lease/grant": (rpc_pb2_grpc.LeaseStub, "LeaseGrant", rpc_pb2.LeaseGrantRequest),
    "/v3/lease/revoke": (rpc_pb2_grpc.LeaseStub, "LeaseRevoke", rpc_pb2.LeaseRevokeRequest),
    "/v3/lease/timetolive": (
        rpc_pb2_grpc.LeaseStub,
        "LeaseTimeToLive",
        rpc_pb2.LeaseTimeToLiveRequest,
    ),
    "/v3/lease/keepalive": (
        rpc_pb2_grpc.LeaseStub,
        "LeaseKeepAlive",
        rpc_pb2.LeaseKeepAliveRequest,
    ),
    "/v3/lease/leases": (rpc_pb2_grpc.LeaseStub, "LeaseLeases", rpc_pb2.LeaseLeasesRequest),
    "/v3/kv/lease/leases": (rpc_pb2_grpc.LeaseStub, "LeaseLeases", rpc_pb2.LeaseLeasesRequest),
}


def as_message(path: str, data: str) -> Any | None:
    """The protobuf request of a generated gateway request, or None if it is not one."""
    if path not in METHODS:
        return None
    try:
        return json_format.Parse(data, METHODS[path][2]())
    except (json_format.ParseError, ValueError):
        return None


async def call(channel: grpc.aio.Channel, path: str, request: Any) -> tuple[int, Any]:
    """``(status, body)`` as the gateway test's ``normalize`` takes them: 200 and the JSON of
    the answer, or the gRPC code (negative) and ``{"code", "error"}``."""
    stub_class, method, _ = METHODS[path]
    rpc = getattr(stub_class(channel), method)
    try:
        if method == "LeaseKeepAlive":
            stream = rpc(iter([request]), timeout=CALL_TIMEOUT_S)
            answer = await stream.read()
            stream.cancel()
        else:
            answer = await rpc(request, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as err:
        code = err.code().value[0]
        return -code, {"code": code, "error": err.details()}
    return 200, json_format.MessageToDict(answer, preserving_proto_field_name=True)


async def run_sequence(seed: int, etcd: grpc.aio.Channel, ours: list[grpc.aio.Channel]) -> None:
    gen = Generator(random.Random(seed))
    rng = random.Random(seed + 1000)
    seen: Counter[str] = Counter()
    sent = 0
    last_writer = ours[0]
    for step in range(STEPS):
        path, data = gen.next()
        request = as_message(path, data)
        if request is None:
            continue
        decoded = json.loads(data)
        gen.last_compaction = int(decoded.get("revision", 0) or 0) if "compaction" in path else 0
        gen.last_lease = int(decoded.get("ID", 0) or 0) if "lease" in path else 0
        theirs_raw = await call(etcd, path, request)
        # A serializable read goes to the member that answered the last write (it has
        # applied everything up to it; another member may lag, and its read would be
        # stale, correctly). Everything else goes to any member.
        if '"serializable": true' in data:
            target = last_writer
        else:
            target = rng.choice(ours)
            if not path.endswith("/range"):
                last_writer = target
        ours_raw = await call(target, path, request)
        gen.observe(path, *theirs_raw)
        theirs, mine = normalize(path, *theirs_raw), normalize(path, *ours_raw)
        assert mine == theirs, (
            f"seed {seed} step {step}: {path} {data}\n  etcd:   {theirs_raw}\n  raftkv: {ours_raw}"
        )
        seen.update(outcomes(path, *theirs_raw))
        sent += 1
    missing = [what for what in EXPECTED_OUTCOMES if not seen[what]]
    assert not missing, f"seed {seed}: never seen {missing} (seen: {dict(seen)})"
    assert sent > STEPS * 3 // 4, sent


@pytest.mark.parametrize("frontends", [0, 1], ids=["on-the-member", "through-frontends"])
async def test_random_sequences_over_grpc_match_etcd(tmp_path, frontends):
    """With ``frontends``, every member hands its gRPC connections to a front-end process."""
    with etcd_process(str(tmp_path)) as etcd:
        async with running(configs(tmp_path, grpc_frontends=frontends)) as members:
            await wait_leader(members)
            if frontends:
                await async_wait_for(
                    lambda: all(m.grpc.frontends.ready == frontends for m in members),
                    30.0,
                    "the front ends ready",
                )
            ours = [dial(m) for m in members]
            theirs = grpc.aio.insecure_channel(etcd.url.removeprefix("http://"))
            try:
                await run_sequence(21, theirs, ours)
            finally:
                for channel in (*ours, theirs):
                    await channel.close()
            if frontends:
                assert all(m.grpc.frontends.calls_served >= 1 for m in members)
                assert all(m.grpc.connections_accepted == 0 for m in members)
