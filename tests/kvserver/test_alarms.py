"""The space quota, the alarm set and the capped apply, on the state machine alone (proposals
apply at once: ``tests.support.apply_now``)."""

from __future__ import annotations

import asyncio

import pytest

from kvserver.kvpb.alarm import (
    AlarmAction,
    AlarmMember,
    AlarmRequest,
    AlarmType,
    CorruptError,
    NoSpaceError,
)
from kvserver.kvpb.errors import CodecError, SnapshotFormatError
from kvserver.kvpb.kv import (
    CompactionRequest,
    DeleteRangeRequest,
    PutRequest,
    RangeRequest,
    RequestOp,
    TxnRequest,
)
from kvserver.kvpb.lease import LeaseGrantRequest, LeaseRevokeRequest
from kvserver.mvcc.codec import encode_entry
from kvserver.server.alarms import (
    AlarmStore,
    decode_alarm_entry,
    encode_alarm_entry,
    is_alarm_entry,
    split_alarm_frame,
)
from kvserver.server.quota import (
    DEFAULT_QUOTA_BACKEND_BYTES,
    effective_quota,
    over_quota,
    refusal,
    request_cost,
)
from tests.support.apply_now import raftkv_without_raft

NOSPACE = AlarmRequest(AlarmAction.ACTIVATE, 7, AlarmType.NOSPACE)


def put(key: str, value: bytes = b"v") -> PutRequest:
    return PutRequest(key.encode(), value)


# --- quota ----------------------------------------------------------------------------------


def test_cost_is_etcds_estimate():
    assert request_cost(PutRequest(b"k", b"vv")) == 256 + 1 + 2
    txn = TxnRequest(
        success=(RequestOp.of(put("a")), RequestOp.of(RangeRequest(b"a"))),
        failure=(RequestOp.of(put("b")), RequestOp.of(put("c"))),
    )
    assert request_cost(txn) == 2 * (256 + 2)  # the larger branch
    nested = TxnRequest(success=(RequestOp.of(TxnRequest(success=(RequestOp.of(put("n")),))),))
    assert request_cost(nested) == 256 + 2  # nested puts count (etcd 3.4 misses them)
    assert request_cost(LeaseGrantRequest(10)) == 64
    for free in (
        DeleteRangeRequest(b"k"),
        CompactionRequest(3),
        LeaseRevokeRequest(1),
        RangeRequest(b"k"),
        TxnRequest(success=(RequestOp.of(DeleteRangeRequest(b"k")),)),
    ):
        assert request_cost(free) == 0


def test_over_quota_and_the_default():
    assert not over_quota(100, 50, 151)
    assert over_quota(100, 51, 151)  # etcd passes only while size + cost < quota
    assert not over_quota(10**12, 0, 1)  # a free request always passes
    assert effective_quota(0) == DEFAULT_QUOTA_BACKEND_BYTES == 2 * 1024**3
    assert effective_quota(65536) == 65536


def test_refusal_by_alarm():
    alarms = AlarmStore()
    assert refusal(alarms, put("k")) is None
    alarms.apply(NOSPACE)
    assert isinstance(refusal(alarms, put("k")), NoSpaceError)
    assert isinstance(refusal(alarms, LeaseGrantRequest(10, 5)), NoSpaceError)
    assert isinstance(refusal(alarms, TxnRequest(success=(RequestOp.of(put("k")),))), NoSpaceError)
    for allowed in (
        DeleteRangeRequest(b"k"),
        CompactionRequest(2),
        LeaseRevokeRequest(5),
        RangeRequest(b"k"),
        TxnRequest(success=(RequestOp.of(DeleteRangeRequest(b"k")),)),
        None,
    ):
        assert refusal(alarms, allowed) is None
    alarms.apply(AlarmRequest(AlarmAction.ACTIVATE, 9, AlarmType.CORRUPT))
    assert isinstance(refusal(alarms, DeleteRangeRequest(b"k")), CorruptError)
    assert isinstance(refusal(alarms, LeaseRevokeRequest(5)), CorruptError)
    assert refusal(alarms, RangeRequest(b"k")) is None


# --- the alarm set, its entries and its frame -------------------------------------------------


def test_alarm_store_activate_deactivate_get():
    alarms = AlarmStore()
    assert alarms.apply(NOSPACE) == (AlarmMember(7, AlarmType.NOSPACE),)
    assert alarms.apply(NOSPACE) == (AlarmMember(7, AlarmType.NOSPACE),)  # idempotent
    assert alarms.apply(AlarmRequest(AlarmAction.ACTIVATE, 7, AlarmType.NONE)) == ()
    alarms.apply(AlarmRequest(AlarmAction.ACTIVATE, 3, AlarmType.CORRUPT))
    assert alarms.get() == (AlarmMember(3, AlarmType.CORRUPT), AlarmMember(7, AlarmType.NOSPACE))
    assert alarms.get(AlarmType.NOSPACE) == (AlarmMember(7, AlarmType.NOSPACE),)
    deactivate = AlarmRequest(AlarmAction.DEACTIVATE, 7, AlarmType.NOSPACE)
    assert alarms.apply(deactivate) == (AlarmMember(7, AlarmType.NOSPACE),)
    assert alarms.apply(deactivate) == ()  # nothing left to clear
    assert not alarms.is_active(AlarmType.NOSPACE) and alarms.is_active(AlarmType.CORRUPT)


def test_alarm_entry_round_trip_and_refusals():
    data = encode_alarm_entry(NOSPACE)
    assert data[:2] == b"\x94\x21" and is_alarm_entry(data)
    assert not is_alarm_entry(encode_entry(put("k")))
    assert decode_alarm_entry(data) == NOSPACE
    with pytest.raises(CodecError):
        encode_alarm_entry(AlarmRequest(AlarmAction.GET))
    for bad in (b"", b"\x94\x21", data[:-1], b"\x94\x21\x00\x00\x93\x09\x01\x01"):
        with pytest.raises(CodecError):
            decode_alarm_entry(bad)


def test_alarm_frame_round_trip():
    alarms = AlarmStore()
    assert alarms.snapshot_frame() == b""  # no alarm: no frame at all
    alarms.apply(NOSPACE)
    alarms.apply(AlarmRequest(AlarmAction.ACTIVATE, 1 << 63, AlarmType.CORRUPT))
    frame = alarms.snapshot_frame()
    blob, rest = split_alarm_frame(frame + b"rest")
    assert bytes(rest) == b"rest"
    assert AlarmStore.restore(blob).get() == alarms.get()
    assert split_alarm_frame(b"\x85older")[0] is None
    assert len(AlarmStore.restore(None)) == 0
    with pytest.raises(SnapshotFormatError):
        split_alarm_frame(frame[:-1])
    with pytest.raises(SnapshotFormatError):
        AlarmStore.restore(b"\x81\xa1x\x01")


# --- the state machine ------------------------------------------------------------------------


async def test_quota_check_raises_nospace_and_the_apply_is_capped():
    kv = raftkv_without_raft(
        cluster_id=1, member_id=7, name="m", members=(), quota_backend_bytes=2000
    )
    await kv.put(put("a", b"x" * 500))
    await kv.put(put("a", b"x" * 500))
    lease = await kv.lease_grant(60)
    with pytest.raises(NoSpaceError) as err:
        await kv.put(put("b", b"x" * 900))
    assert str(err.value) == "etcdserver: mvcc: database space exceeded"
    assert err.value.grpc_code == 8 and err.value.http_status == 429
    assert kv.alarms.get() == (AlarmMember(7, AlarmType.NOSPACE),)  # raised before answering
    revision = kv.store.revision
    # A small put passes the quota check but not the capped apply (it is logged, refused).
    for refused in (
        kv.put(put("tiny")),
        kv.txn(TxnRequest(success=(RequestOp.of(put("t")),))),
        kv.lease_grant(60),
    ):
        with pytest.raises(NoSpaceError):
            await refused
    assert kv.store.revision == revision
    # Reads, deletes, txns without puts, compaction and lease revoke still work.
    assert (await kv.range(RangeRequest(b"a"))).kvs[0].value == b"x" * 500
    assert (await kv.delete_range(DeleteRangeRequest(b"a"))).deleted == 1
    await kv.txn(TxnRequest(success=(RequestOp.of(RangeRequest(b"a")),)))
    await kv.compact(CompactionRequest(kv.store.revision))
    await kv.lease_revoke(lease.lease_id)
    for _ in range(10):  # the old versions go in the background, a batch per loop turn
        if not kv.store.compaction_pending:
            break
        await asyncio.sleep(0)
    assert kv.store.db_size_bytes < 1000
    with pytest.raises(NoSpaceError):  # space is free, but the alarm is still raised
        await kv.put(put("tiny"))
    resp = await kv.alarm(AlarmRequest(AlarmAction.DEACTIVATE, 7, AlarmType.NOSPACE))
    assert resp.alarms == (AlarmMember(7, AlarmType.NOSPACE),) and resp.header.member_id == 7
    assert (await kv.alarm(AlarmRequest())).alarms == ()
    await kv.put(put("tiny"))


async def test_anyone_may_raise_an_alarm_and_the_default_quota_is_2_gib():
    kv = raftkv_without_raft(cluster_id=1, member_id=7, name="m", members=())
    await kv.alarm(NOSPACE)
    assert kv.alarms.get() == (AlarmMember(7, AlarmType.NOSPACE),)
    assert kv.quota_backend_bytes == DEFAULT_QUOTA_BACKEND_BYTES


async def test_snapshot_carries_alarms_and_older_snapshots_restore_none():
    kv = raftkv_without_raft(cluster_id=1, member_id=7, name="m", members=())
    await kv.put(put("k"))
    plain = b"".join(kv.snapshot_chunks())  # no alarm: no frame, the layout of before
    assert not plain.startswith(b"RKVALRM1")
    await kv.alarm(NOSPACE)
    framed = b"".join(kv.snapshot_chunks())
    assert framed.startswith(b"RKVALRM1")
    other = raftkv_without_raft(cluster_id=1, member_id=8, name="n", members=())
    other.restore(framed)
    assert other.alarms.get() == (AlarmMember(7, AlarmType.NOSPACE),)
    assert other.store.revision == kv.store.revision
    with pytest.raises(NoSpaceError):
        await other.put(put("x"))
    other.restore(plain)
    assert other.alarms.get() == () and other.store.revision == 2
    await other.put(put("x"))
