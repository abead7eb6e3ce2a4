"""Alarm calls of the client: etcd's Maintenance.Alarm over the JSON gateway.

``alarm_list()`` -> ``AlarmResult`` (every raised alarm: which member raised which
``AlarmType``); ``alarm_disarm(member_id, alarm)`` clears one alarm, or, with neither given,
every raised alarm (etcd's clientv3 ``AlarmDisarm``: list, then clear each) and answers the
alarms it cleared. Both go to the leader (any member would do: a GET is linearizable there
too, and a DEACTIVATE goes through the log). A disarm is idempotent, so a retry after an
ambiguous failure is safe. A cluster refuses puts, txns with puts and lease grants with
``NoSpaceError`` while a NOSPACE alarm is raised: free space (delete, compact) first, then
disarm, or the next write raises the alarm again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvserver.client import codec
from kvserver.client.errors import ResponseFormatError
from kvserver.kvpb.alarm import AlarmAction, AlarmType
from kvserver.kvpb.kv import ResponseHeader

PATH = "/v3/maintenance/alarm"


@dataclass(frozen=True, slots=True)
class Alarm:
    member_id: int
    alarm: AlarmType


@dataclass(frozen=True, slots=True)
class AlarmResult:
    header: ResponseHeader
    alarms: tuple[Alarm, ...] = ()


def encode_request(
    action: AlarmAction, member_id: int = 0, alarm: AlarmType = AlarmType.NONE
) -> dict[str, Any]:
    if not 0 <= member_id < 1 << 64:
        raise ValueError(f"bad member id {member_id}")
    body: dict[str, Any] = {"action": AlarmAction(action).name}
    if member_id:
        body["memberID"] = str(member_id)
    if alarm:
        body["alarm"] = AlarmType(alarm).name
    return body


def _alarm_type(raw: Any) -> AlarmType:
    if raw is None:
        return AlarmType.NONE
    if isinstance(raw, str) and raw in AlarmType.__members__:
        return AlarmType[raw]
    if type(raw) is int and raw in AlarmType._value2member_map_:
        return AlarmType(raw)
    raise ResponseFormatError(f"alarm response: unknown alarm type {raw!r}")


def decode_result(raw: Any) -> AlarmResult:
    if not isinstance(raw, dict):
        raise ResponseFormatError("alarm response: expected a JSON object")
    items = raw.get("alarms") or []
    if not isinstance(items, list):
        raise ResponseFormatError("alarm response: alarms is not a list")
    alarms = []
    for item in items:
        if not isinstance(item, dict):
            raise ResponseFormatError("alarm response: an alarm is not a JSON object")
        member_id = codec.to_int(item.get("memberID", 0), "memberID")
        alarms.append(Alarm(member_id, _alarm_type(item.get("alarm"))))
    return AlarmResult(codec.decode_header(raw.get("header")), tuple(alarms))


def parse_alarm_type(text: str) -> AlarmType:
    """An alarm type as the CLI takes it: NOSPACE, CORRUPT (any case) or NONE (= all)."""
    name = text.strip().upper()
    if name not in AlarmType.__members__:
        raise ValueError(f"bad alarm {text!r}: want one of {', '.join(AlarmType.__members__)}")
    return AlarmType[name]
