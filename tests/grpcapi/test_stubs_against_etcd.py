"""kvserver/etcdpb's stubs against a real etcd (Debian's 3.4): our descriptors speak its wire.

Over plain gRPC (``grpc.insecure_channel``), with nothing of raftkv's but the generated code:
Put, Range (sorted and limited), Txn (with a lease compare and a range compare, the fields
numbered 8 and 64), Watch (create, then one event), LeaseGrant/TimeToLive/Leases,
MemberList and Status. What etcd answers is checked field by field against what ``etcdctl
-w json`` prints for the same state, so a wrong field number or type shows up as a missing or
different value. Skipped without etcd and etcdctl, unless RAFTKV_REQUIRE_EXTERNAL=1.
"""

from __future__ import annotations

import base64
import threading
from urllib.parse import urlsplit

import grpc
import pytest

from kvserver.etcdpb import kv_pb2, rpc_pb2, rpc_pb2_grpc
from tests.etcd_process import etcd_process
from tests.support.etcdctl import Etcdctl

pytestmark = [pytest.mark.slow, pytest.mark.external]

CALL_TIMEOUT_S = 10.0


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kv_as_etcdctl_prints_it(kv: kv_pb2.KeyValue) -> dict:
    """etcdctl's JSON of a KeyValue: base64 bytes, zero fields (omitempty) left out."""
    fields = {
        "key": b64(kv.key),
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
        "value": b64(kv.value),
        "lease": kv.lease,
    }
    return {k: v for k, v in fields.items() if v}


def header_as_etcdctl_prints_it(h: rpc_pb2.ResponseHeader) -> dict:
    return {
        "cluster_id": h.cluster_id,
        "member_id": h.member_id,
        "revision": h.revision,
        "raft_term": h.raft_term,
    }


def test_stubs_against_a_real_etcd(tmp_path):
    with etcd_process(str(tmp_path)) as etcd:
        ctl = Etcdctl([etcd.url])
        parts = urlsplit(etcd.url)
        with grpc.insecure_channel(f"{parts.hostname}:{parts.port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
            check_kv(channel, ctl)
            check_watch(channel)
            check_lease(channel, ctl)
            check_cluster_and_status(channel, ctl, etcd.url)


def check_kv(channel, ctl):
    kv = rpc_pb2_grpc.KVStub(channel)
    t = CALL_TIMEOUT_S
    put = kv.Put(rpc_pb2.PutRequest(key=b"grpc/a", value=b"1"), timeout=t)
    assert put.header.revision == 2  # the first write (etcd_process's readiness read wrote none)
    assert put.header.cluster_id and put.header.member_id and put.header.raft_term
    put = kv.Put(rpc_pb2.PutRequest(key=b"grpc/a", value=b"2", prev_kv=True), timeout=t)
    assert (put.prev_kv.key, put.prev_kv.value, put.prev_kv.version) == (b"grpc/a", b"1", 1)
    kv.Put(rpc_pb2.PutRequest(key=b"grpc/b", value=b"x"), timeout=t)

    got = kv.Range(rpc_pb2.RangeRequest(key=b"grpc/a"), timeout=t)
    assert [(k.key, k.value, k.create_revision, k.mod_revision, k.version) for k in got.kvs] == [
        (b"grpc/a", b"2", 2, 3, 2)
    ]
    printed = ctl.json("get", "grpc/a")
    assert printed["header"] == header_as_etcdctl_prints_it(got.header)
    assert printed["kvs"] == [kv_as_etcdctl_prints_it(k) for k in got.kvs]
    assert printed["count"] == got.count == 1

    # Newest modification first, one of two: SortOrder DESCEND = 2, SortTarget MOD = 3.
    page = kv.Range(
        rpc_pb2.RangeRequest(
            key=b"grpc/",
            range_end=b"grpc0",
            limit=1,
            sort_order=rpc_pb2.RangeRequest.DESCEND,
            sort_target=rpc_pb2.RangeRequest.MOD,
        ),
        timeout=t,
    )
    assert ([k.key for k in page.kvs], page.more, page.count) == ([b"grpc/b"], True, 2)
    printed = ctl.json(
        "get", "grpc/", "--prefix", "--limit=1", "--sort-by=MODIFY", "--order=DESCEND"
    )
    assert printed["kvs"] == [kv_as_etcdctl_prints_it(k) for k in page.kvs]
    assert (printed["more"], printed["count"]) == (True, 2)

    # Both compares hold: no key under grpc/ has a lease (field 8), and some key under grpc/
    # has a version > 0 (range_end, field 64).
    no_lease = rpc_pb2.Compare(
        key=b"grpc/a", target=rpc_pb2.Compare.LEASE, result=rpc_pb2.Compare.EQUAL, lease=0
    )
    some_key = rpc_pb2.Compare(
        key=b"grpc/",
        range_end=b"grpc0",
        target=rpc_pb2.Compare.VERSION,
        result=rpc_pb2.Compare.GREATER,
        version=0,
    )
    txn = kv.Txn(
        rpc_pb2.TxnRequest(
            compare=[no_lease, some_key],
            success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"grpc/c", value=b"t"))],
            failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"grpc/a"))],
        ),
        timeout=t,
    )
    assert txn.succeeded and txn.header.revision == 5
    assert [r.WhichOneof("response") for r in txn.responses] == ["response_put"]
    # A stale mod_revision fails: the failure branch's range answers.
    txn = kv.Txn(
        rpc_pb2.TxnRequest(
            compare=[rpc_pb2.Compare(key=b"grpc/a", target=rpc_pb2.Compare.MOD, mod_revision=2)],
            failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"grpc/a"))],
        ),
        timeout=t,
    )
    assert not txn.succeeded
    assert [k.value for k in txn.responses[0].response_range.kvs] == [b"2"]
    printed = ctl.json("get", "grpc/c")
    assert printed["kvs"][0]["mod_revision"] == 5


def check_watch(channel):
    kv, watch = rpc_pb2_grpc.KVStub(channel), rpc_pb2_grpc.WatchStub(channel)
    finished = threading.Event()

    def requests():
        create = rpc_pb2.WatchCreateRequest(key=b"grpc/w", prev_kv=True, progress_notify=False)
        yield rpc_pb2.WatchRequest(create_request=create)
        finished.wait(CALL_TIMEOUT_S)  # keep the stream open until the event is read

    responses = watch.Watch(requests(), timeout=CALL_TIMEOUT_S)
    try:
        created = next(responses)
        assert created.created and not created.events
        kv.Put(rpc_pb2.PutRequest(key=b"grpc/w", value=b"v1"), timeout=CALL_TIMEOUT_S)
        put = kv.Put(rpc_pb2.PutRequest(key=b"grpc/w", value=b"v2"), timeout=CALL_TIMEOUT_S)
        events = []
        while len(events) < 2:
            got = next(responses)
            assert got.watch_id == created.watch_id
            events.extend(got.events)
        assert [(e.type, e.kv.value, e.prev_kv.value) for e in events] == [
            (kv_pb2.Event.PUT, b"v1", b""),
            (kv_pb2.Event.PUT, b"v2", b"v1"),
        ]
        assert events[1].kv.mod_revision == put.header.revision
    finally:
        finished.set()
        responses.cancel()


def check_lease(channel, ctl):
    kv, lease = rpc_pb2_grpc.KVStub(channel), rpc_pb2_grpc.LeaseStub(channel)
    t = CALL_TIMEOUT_S
    granted = lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), timeout=t)
    assert granted.ID and granted.TTL == 60 and not granted.error
    kv.Put(rpc_pb2.PutRequest(key=b"grpc/l", value=b"x", lease=granted.ID), timeout=t)
    ttl = lease.LeaseTimeToLive(rpc_pb2.LeaseTimeToLiveRequest(ID=granted.ID, keys=True), timeout=t)
    assert (ttl.ID, ttl.grantedTTL, list(ttl.keys)) == (granted.ID, 60, [b"grpc/l"])
    assert 0 < ttl.TTL <= 60
    leases = lease.LeaseLeases(rpc_pb2.LeaseLeasesRequest(), timeout=t)
    assert [s.ID for s in leases.leases] == [granted.ID]
    got = kv.Range(rpc_pb2.RangeRequest(key=b"grpc/l"), timeout=t)
    assert got.kvs[0].lease == granted.ID
    printed = ctl.json("get", "grpc/l")
    assert printed["kvs"] == [kv_as_etcdctl_prints_it(k) for k in got.kvs]
    lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=granted.ID), timeout=t)
    gone = kv.Range(rpc_pb2.RangeRequest(key=b"grpc/l", count_only=True), timeout=t)
    assert gone.count == 0 and not gone.kvs


def check_cluster_and_status(channel, ctl, url):
    cluster = rpc_pb2_grpc.ClusterStub(channel)
    maintenance = rpc_pb2_grpc.MaintenanceStub(channel)
    members = cluster.MemberList(rpc_pb2.MemberListRequest(), timeout=CALL_TIMEOUT_S)
    (member,) = members.members
    assert (member.name, list(member.clientURLs), member.isLearner) == ("compat", [url], False)
    assert member.ID == members.header.member_id
    printed = ctl.json("member", "list")
    assert printed["members"] == [
        {
            "ID": member.ID,
            "name": member.name,
            "peerURLs": list(member.peerURLs),
            "clientURLs": list(member.clientURLs),
        }
    ]
    assert printed["header"]["cluster_id"] == members.header.cluster_id

    status = maintenance.Status(rpc_pb2.StatusRequest(), timeout=CALL_TIMEOUT_S)
    assert status.leader == member.ID and status.dbSize > 0 and status.dbSizeInUse > 0
    assert status.raftIndex >= status.raftAppliedIndex > 0 and not status.errors
    (printed,) = ctl.json("endpoint", "status")
    assert printed["Status"]["version"] == status.version
    assert status.version.startswith("3.")
    for name in ("leader", "raftTerm", "dbSize"):
        assert printed["Status"][name] == getattr(status, name), name
    assert printed["Status"]["header"]["member_id"] == status.header.member_id
