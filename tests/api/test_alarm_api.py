"""``POST /v3/maintenance/alarm`` and the space quota over the etcd JSON gateway, against the
replicated state machine with proposals applied at once (``tests.support.apply_now``)."""

from __future__ import annotations

from kvserver.api.http import gateway_json
from kvserver.kvpb.alarm import AlarmResponse, AlarmType
from kvserver.kvpb.kv import ResponseHeader
from tests.support.apply_now import raftkv_without_raft

from .helpers import b64, serve

MEMBER = 13668033151171901709  # above int64: memberID is a uint64


def kv(quota: int = 1 << 31):
    return raftkv_without_raft(
        cluster_id=11, member_id=MEMBER, name="m", members=(), quota_backend_bytes=quota
    )


async def test_get_with_no_alarm_answers_only_the_header():
    async with serve(kv()) as api:
        status, body = await api.post("/v3/maintenance/alarm", {})
        assert status == 200
        assert body == {
            "header": {
                "cluster_id": "11",
                "member_id": str(MEMBER),
                "revision": "1",
                "raft_term": "3",
            }
        }
        assert await api.post("/v3/maintenance/alarm", raw=b"") == (200, body)
        assert await api.post("/v3/maintenance/alarm", {"action": "GET", "alarm": 2}) == (200, body)


async def test_activate_get_deactivate_shapes():
    async with serve(kv()) as api:
        raise_ = {"action": "ACTIVATE", "memberID": "5", "alarm": "CORRUPT"}
        status, body = await api.post("/v3/maintenance/alarm", raise_)
        assert status == 200 and body["alarms"] == [{"memberID": "5", "alarm": "CORRUPT"}]
        by_number = {"action": 1, "memberID": MEMBER, "alarm": 1}
        status, body = await api.post("/v3/maintenance/alarm", by_number)
        assert body["alarms"] == [{"memberID": str(MEMBER), "alarm": "NOSPACE"}]
        status, body = await api.post("/v3/maintenance/alarm", {"action": "GET"})
        assert body["alarms"] == [
            {"memberID": "5", "alarm": "CORRUPT"},
            {"memberID": str(MEMBER), "alarm": "NOSPACE"},
        ]
        status, body = await api.post("/v3/maintenance/alarm", {"alarm": "NOSPACE"})
        assert body["alarms"] == [{"memberID": str(MEMBER), "alarm": "NOSPACE"}]
        clear = {"action": "DEACTIVATE", "memberID": "5", "alarm": "CORRUPT"}
        status, body = await api.post("/v3/maintenance/alarm", clear)
        assert status == 200 and body["alarms"] == [{"memberID": "5", "alarm": "CORRUPT"}]
        status, body = await api.post("/v3/maintenance/alarm", clear)  # nothing left to clear
        assert status == 200 and "alarms" not in body and body["header"]["member_id"] == str(MEMBER)


async def test_bad_alarm_requests_are_400():
    async with serve(kv()) as api:
        for bad in (
            {"action": "FOO"},
            {"action": 7},  # etcd 3.4 crashes on this one
            {"alarm": 9},
            {"memberID": "-1"},
            {"memberID": str(1 << 64)},
            {"memberID": True},
            [],
        ):
            status, body = await api.post("/v3/maintenance/alarm", bad)
            assert status == 400 and body["code"] == 3, bad
        status, _ = await api.post("/v3/maintenance/alarm", raw=b"{")
        assert status == 400


async def test_over_quota_put_is_429_and_status_lists_the_alarm():
    async with serve(kv(quota=1500)) as api:
        put = {"key": b64("k"), "value": b64("x" * 1000)}
        assert (await api.post("/v3/kv/put", put))[0] == 200
        status, body = await api.post("/v3/kv/put", put)
        assert status == 429
        assert body == {
            "error": "etcdserver: mvcc: database space exceeded",
            "message": "etcdserver: mvcc: database space exceeded",
            "code": 8,
        }
        status, body = await api.post("/v3/maintenance/alarm", {})
        assert body["alarms"] == [{"memberID": str(MEMBER), "alarm": "NOSPACE"}]
        small = {"key": b64("s"), "value": b64("v")}
        assert (await api.post("/v3/kv/put", small))[0] == 429  # capped while raised
        assert (await api.post("/v3/lease/grant", {"TTL": "60"}))[0] == 429
        assert (await api.post("/v3/kv/deleterange", {"key": b64("k")}))[0] == 200
        assert (await api.post("/v3/kv/compaction", {"revision": "3"}))[0] == 200
        disarm = {"action": "DEACTIVATE", "memberID": str(MEMBER), "alarm": "NOSPACE"}
        assert (await api.post("/v3/maintenance/alarm", disarm))[0] == 200
        assert (await api.post("/v3/kv/put", small))[0] == 200


def test_status_and_alarm_encoding():
    resp = AlarmResponse(ResponseHeader(1, 2, 3, 4), ())
    assert gateway_json.alarm_response(resp) == {
        "header": {"cluster_id": "1", "member_id": "2", "revision": "3", "raft_term": "4"}
    }
    assert gateway_json.decode_alarm(b'{"action": null, "memberID": 0, "alarm": "NONE"}') == (
        gateway_json.decode_alarm(b"")
    )
    assert gateway_json.decode_alarm(b'{"alarm": "NOSPACE"}').alarm == AlarmType.NOSPACE
