"""Alarms on the wire (etcd's ``etcdserverpb.AlarmRequest``/``AlarmResponse``) and the errors a
raised alarm makes writes fail with.

An alarm is a ``(member_id, AlarmType)`` pair, raised (``ACTIVATE``) and cleared
(``DEACTIVATE``) through the raft log, so every member holds the same set. ``GET`` lists the
raised alarms of one type (``NONE``: of every type); ``member_id`` is ignored then.

Errors (etcd's texts and codes):

- ``NoSpaceError``: ``etcdserver: mvcc: database space exceeded``, ResourceExhausted (HTTP 429
  through the gateway). A put, a txn with a put or a lease grant that would take the store over
  its quota, or any of them while a ``NOSPACE`` alarm is raised.
- ``CorruptError``: ``etcdserver: corrupt cluster``, DataLoss. Every write while a ``CORRUPT``
  alarm is raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from kvserver.kvpb.errors import EtcdError, GrpcCode
from kvserver.kvpb.kv import ResponseHeader

MSG_NO_SPACE = "etcdserver: mvcc: database space exceeded"
MSG_CORRUPT = "etcdserver: corrupt cluster"


class AlarmType(IntEnum):
    NONE = 0  # in a GET: every type; never raised
    NOSPACE = 1
    CORRUPT = 2


class AlarmAction(IntEnum):
    GET = 0
    ACTIVATE = 1
    DEACTIVATE = 2


@dataclass(frozen=True, slots=True, order=True)
class AlarmMember:
    member_id: int
    alarm: AlarmType


@dataclass(frozen=True, slots=True)
class AlarmRequest:
    action: AlarmAction = AlarmAction.GET
    member_id: int = 0
    alarm: AlarmType = AlarmType.NONE


@dataclass(frozen=True, slots=True)
class AlarmResponse:
    header: ResponseHeader
    alarms: tuple[AlarmMember, ...] = field(default=())


class NoSpaceError(EtcdError):
    """The store is over its space quota, or a NOSPACE alarm is raised."""

    grpc_code = GrpcCode.RESOURCE_EXHAUSTED
    default_message = MSG_NO_SPACE


class CorruptError(EtcdError):
    """A CORRUPT alarm is raised: the cluster refuses every write."""

    grpc_code = GrpcCode.DATA_LOSS
    default_message = MSG_CORRUPT
