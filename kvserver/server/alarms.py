"""The replicated alarm set (etcd's ``api/v3alarm``): which members raised which alarm, changed
only by applying log entries, so every member holds the same set at the same index.

Contract. ``AlarmStore.apply(request)`` is deterministic. ``ACTIVATE`` adds the pair (a pair
already raised stays as it is; ``NONE`` is never raised: the request changes nothing) and
answers it; ``DEACTIVATE`` removes the pair and answers it, or answers nothing when the pair
was not raised; ``GET`` is answered from the local set (``get``), never logged.

Log entry (byte layout): msgpack ``[ALARM_ENTRY_FORMAT (= 33, "!"), 0, 0, [action, member_id,
alarm]]``, so an alarm entry starts with ``94 21`` (auth entries ``94 41``, lease entries
``94 4c``, MVCC entries ``94 01``). ``is_alarm_entry`` tells them apart; ``decode_alarm_entry``
raises ``CodecError`` for anything malformed (an error result on every member, not a crash).
Alarm requests are not de-duplicated: they are idempotent.

Snapshot (byte layout): ``ALARM_FRAME_MAGIC | len (uint32 big-endian) | msgpack map``
``{"version": 1, "alarms": [[member_id, alarm], ...]}`` sorted, so equal sets give equal
bytes. The state machine writes the frame first, and only when an alarm is raised (a
snapshot without alarms is byte-for-byte what it was before alarms existed);
``split_alarm_frame`` answers ``(None, data)`` for a snapshot without it: no alarms.
"""

from __future__ import annotations

from typing import Any

import msgpack

from kvserver.kvpb.alarm import AlarmAction, AlarmMember, AlarmRequest, AlarmType
from kvserver.kvpb.errors import CodecError, SnapshotFormatError

ALARM_ENTRY_FORMAT = 33  # "!"
_ENTRY_PREFIX = b"\x94\x21"
ALARM_FRAME_MAGIC = b"RKVALRM1"
_FRAME_HEADER_BYTES = len(ALARM_FRAME_MAGIC) + 4
SNAPSHOT_VERSION = 1
_UINT64_MAX = (1 << 64) - 1

__all__ = [
    "ALARM_FRAME_MAGIC",
    "AlarmStore",
    "decode_alarm_entry",
    "encode_alarm_entry",
    "frame_alarms",
    "is_alarm_entry",
    "split_alarm_frame",
]


def encode_alarm_entry(req: AlarmRequest) -> bytes:
    if req.action not in (AlarmAction.ACTIVATE, AlarmAction.DEACTIVATE):
        raise CodecError("only ACTIVATE and DEACTIVATE go through the log")
    body = [int(req.action), req.member_id, int(req.alarm)]
    return msgpack.packb([ALARM_ENTRY_FORMAT, 0, 0, body], use_bin_type=True)


def is_alarm_entry(payload: bytes) -> bool:
    return payload[:2] == _ENTRY_PREFIX


def _is_uint64(v: Any) -> bool:
    return type(v) is int and 0 <= v <= _UINT64_MAX


def decode_alarm_entry(data: bytes) -> AlarmRequest:
    """The request of an ``encode_alarm_entry`` entry; raises ``CodecError``."""
    try:
        plain = msgpack.unpackb(data, raw=False)
    except Exception as err:  # msgpack raises several types for garbage
        raise CodecError(f"alarm entry is not msgpack: {err}") from err
    if type(plain) is not list or len(plain) != 4 or plain[0] != ALARM_ENTRY_FORMAT:
        raise CodecError("not a raftkv alarm entry")
    body = plain[3]
    if type(body) is not list or len(body) != 3 or not all(map(_is_uint64, body)):
        raise CodecError("malformed alarm entry")
    action, member_id, alarm = body
    if action not in (AlarmAction.ACTIVATE, AlarmAction.DEACTIVATE) or alarm not in (
        t.value for t in AlarmType
    ):
        raise CodecError(f"unknown alarm action {action!r} or type {alarm!r}")
    return AlarmRequest(AlarmAction(action), member_id, AlarmType(alarm))


class AlarmStore:
    """The raised alarms: a set of ``AlarmMember``."""

    def __init__(self, alarms: tuple[AlarmMember, ...] = ()) -> None:
        self._alarms: set[AlarmMember] = set(alarms)

    def __len__(self) -> int:
        return len(self._alarms)

    def is_active(self, alarm: AlarmType) -> bool:
        """Whether some member raised ``alarm``."""
        return any(a.alarm == alarm for a in self._alarms)

    def get(self, alarm: AlarmType = AlarmType.NONE) -> tuple[AlarmMember, ...]:
        """The raised alarms of type ``alarm`` (``NONE``: all), sorted by member then type."""
        return tuple(sorted(a for a in self._alarms if alarm in (AlarmType.NONE, a.alarm)))

    def apply(self, req: AlarmRequest) -> tuple[AlarmMember, ...]:
        """Apply a logged request; the pairs it answers (see the module docstring)."""
        pair = AlarmMember(req.member_id, req.alarm)
        if req.action == AlarmAction.ACTIVATE:
            if req.alarm == AlarmType.NONE:
                return ()
            self._alarms.add(pair)
            return (pair,)
        if req.action == AlarmAction.DEACTIVATE:
            if pair not in self._alarms:
                return ()
            self._alarms.discard(pair)
            return (pair,)
        return self.get(req.alarm)

    # --- snapshot ---------------------------------------------------------------------------

    def snapshot_frame(self) -> bytes:
        """The framed set, or ``b""`` when no alarm is raised."""
        if not self._alarms:
            return b""
        obj = {
            "version": SNAPSHOT_VERSION,
            "alarms": [[a.member_id, int(a.alarm)] for a in self.get()],
        }
        return frame_alarms(msgpack.packb(obj, use_bin_type=True))

    @classmethod
    def restore(cls, blob: bytes | None) -> AlarmStore:
        """A set from a frame's blob (``None``: no alarms). Raises ``SnapshotFormatError``."""
        if blob is None:
            return cls()
        try:
            obj = msgpack.unpackb(blob, raw=False)
        except Exception as err:  # msgpack's own errors
            raise SnapshotFormatError(f"alarm snapshot is not msgpack: {err}") from None
        if (
            type(obj) is not dict
            or obj.get("version") != SNAPSHOT_VERSION
            or type(obj.get("alarms")) is not list
        ):
            raise SnapshotFormatError("not a raftkv alarm snapshot (or an unknown version)")
        alarms = []
        for row in obj["alarms"]:
            if (
                type(row) is not list
                or len(row) != 2
                or not all(map(_is_uint64, row))
                or row[1] not in (AlarmType.NOSPACE, AlarmType.CORRUPT)
            ):
                raise SnapshotFormatError(f"malformed alarm record {row!r}")
            alarms.append(AlarmMember(row[0], AlarmType(row[1])))
        return cls(tuple(alarms))


def frame_alarms(blob: bytes) -> bytes:
    return ALARM_FRAME_MAGIC + len(blob).to_bytes(4, "big") + blob


def split_alarm_frame(data: bytes | memoryview) -> tuple[bytes | None, memoryview]:
    """``(alarm blob, rest)``; ``(None, data)`` for a snapshot without the frame. ``rest`` is
    a view, not a copy. Raises ``SnapshotFormatError`` on a truncated frame."""
    view = memoryview(data)
    if view[: len(ALARM_FRAME_MAGIC)] != ALARM_FRAME_MAGIC:
        return None, view
    if len(view) < _FRAME_HEADER_BYTES:
        raise SnapshotFormatError("truncated alarm frame")
    n = int.from_bytes(view[len(ALARM_FRAME_MAGIC) : _FRAME_HEADER_BYTES], "big")
    end = _FRAME_HEADER_BYTES + n
    if len(view) < end:
        raise SnapshotFormatError("truncated alarm frame")
    return bytes(view[_FRAME_HEADER_BYTES:end]), view[end:]
