"""Lease requests as raft log entries: the byte codec, and the checkpoint messages that exist
only in the log (members propose them; a client never sends or sees one).

Byte layout
-----------
``encode_lease_entry(request, client_id=0, request_id=0)`` gives the msgpack array
``[LEASE_ENTRY_FORMAT (= 76, "L"), client_id, request_id, body]`` where body is one of

- ``[1, lease_id, ttl_s]``                          grant (ID and TTL final: chosen at propose)
- ``[2, lease_id]``                                 revoke
- ``[3, [[lease_id, remaining_ttl_s], ...]]``       checkpoint

A lease entry starts with the bytes ``94 4c`` (fixarray of 4, then 76); an MVCC entry
(``kvserver.mvcc.codec.encode_entry``) starts with ``94 01``. ``is_lease_entry(payload)``
tells them apart. Never renumber; only add new ops. ``decode_lease_entry`` raises
``CodecError`` for anything else, so a damaged entry is an error result, never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from kvserver.kvpb.errors import CodecError
from kvserver.kvpb.kv import ResponseHeader
from kvserver.kvpb.lease import LeaseGrantRequest, LeaseRevokeRequest

__all__ = [
    "LEASE_ENTRY_FORMAT",
    "LeaseCheckpointRequest",
    "LeaseCheckpointResponse",
    "decode_lease_entry",
    "encode_lease_entry",
    "is_int64",
    "is_lease_entry",
]

LEASE_ENTRY_FORMAT = 76  # "L"; mvcc entries use 1 (kvserver.mvcc.codec.ENTRY_FORMAT_VERSION)
_LEASE_ENTRY_PREFIX = b"\x94\x4c"
_OP_GRANT = 1
_OP_REVOKE = 2
_OP_CHECKPOINT = 3

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)


@dataclass(frozen=True, slots=True)
class LeaseCheckpointRequest:
    """etcdserverpb.LeaseCheckpointRequest: ``(lease_id, remaining_ttl_s)`` pairs; a
    remaining TTL of 0 clears the checkpoint."""

    checkpoints: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class LeaseCheckpointResponse:
    header: ResponseHeader


def is_int64(v: Any) -> bool:
    return type(v) is int and INT64_MIN <= v <= INT64_MAX


def encode_lease_entry(request: Any, client_id: int = 0, request_id: int = 0) -> bytes:
    """A raft log entry for a lease request (byte layout in the module docstring)."""
    kind = type(request)
    if kind is LeaseGrantRequest:
        if request.lease_id == 0:
            raise CodecError("a grant entry needs its final lease ID (see prepare_grant)")
        body: list = [_OP_GRANT, request.lease_id, request.ttl_s]
    elif kind is LeaseRevokeRequest:
        body = [_OP_REVOKE, request.lease_id]
    elif kind is LeaseCheckpointRequest:
        body = [_OP_CHECKPOINT, [[lid, ttl] for lid, ttl in request.checkpoints]]
    else:
        raise CodecError(f"not a lease request: {kind.__name__}")
    return msgpack.packb([LEASE_ENTRY_FORMAT, client_id, request_id, body], use_bin_type=True)


def is_lease_entry(payload: bytes) -> bool:
    """Whether a committed payload is a lease entry (else an MVCC entry)."""
    return payload[:2] == _LEASE_ENTRY_PREFIX


def decode_lease_entry(data: bytes) -> tuple[int, int, Any]:
    """(client_id, request_id, request) of an ``encode_lease_entry`` entry; raises
    ``CodecError``."""
    try:
        plain = msgpack.unpackb(data, raw=False)
    except Exception as err:  # msgpack raises several types for garbage
        raise CodecError(f"lease entry is not msgpack: {err}") from err
    if type(plain) is not list or len(plain) != 4 or plain[0] != LEASE_ENTRY_FORMAT:
        raise CodecError("not a raftkv lease entry (or an unknown format)")
    _, client_id, request_id, body = plain
    if type(client_id) is not int or type(request_id) is not int:
        raise CodecError("entry ids must be integers")
    if type(body) is not list or not body:
        raise CodecError("malformed lease entry body")
    op = body[0]
    if op == _OP_GRANT and len(body) == 3 and is_int64(body[1]) and is_int64(body[2]):
        return client_id, request_id, LeaseGrantRequest(ttl_s=body[2], lease_id=body[1])
    if op == _OP_REVOKE and len(body) == 2 and is_int64(body[1]):
        return client_id, request_id, LeaseRevokeRequest(body[1])
    if op == _OP_CHECKPOINT and len(body) == 2 and type(body[1]) is list:
        pairs = []
        for pair in body[1]:
            if type(pair) is not list or len(pair) != 2 or not all(map(is_int64, pair)):
                raise CodecError("malformed lease checkpoint")
            pairs.append((pair[0], pair[1]))
        return client_id, request_id, LeaseCheckpointRequest(tuple(pairs))
    raise CodecError(f"unknown or malformed lease op {op!r}")
