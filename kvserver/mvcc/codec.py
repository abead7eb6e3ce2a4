"""msgpack encoding of the store's requests, responses and errors (log entries, dedup table).

Byte layout
-----------
An object of one of the types in ``TAGS`` is a msgpack array ``[tag, field1, field2, ...]``
with the dataclass fields in declaration order; nested objects are encoded the same way,
tuples as arrays, enums as their integer values, bytes as msgpack ``bin``, ``None`` as nil.
An ``EtcdError`` is ``[ERROR_TAG, error_tag, message, compact_revision]``.

A raft log entry made by ``encode_entry`` is the msgpack array
``[ENTRY_FORMAT_VERSION, client_id, request_id, <request object>]``; ``client_id == 0``
means "no deduplication".

Tags are part of the on-disk format (WAL entries and snapshots): never renumber them, only
add new ones. Decoding is strict about shapes and raises ``CodecError``; field values are
checked by the store's validation when the request is applied.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import msgpack

from kvserver.kvpb.errors import (
    CodecError,
    CompactedError,
    EtcdError,
    FutureRevisionError,
    InvalidArgumentError,
    KeyNotFoundError,
    LeaseNotFoundError,
)
from kvserver.kvpb.kv import (
    CompactionRequest,
    CompactionResponse,
    Compare,
    DeleteRangeRequest,
    DeleteRangeResponse,
    Event,
    KeyValue,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    RequestOp,
    ResponseHeader,
    ResponseOp,
    TxnRequest,
    TxnResponse,
)
from kvserver.kvpb.quick import quick_constructor

ENTRY_FORMAT_VERSION = 1
ERROR_TAG = 99

TAGS: dict[type, int] = {
    KeyValue: 1,
    Event: 2,
    ResponseHeader: 3,
    RangeRequest: 10,
    PutRequest: 11,
    DeleteRangeRequest: 12,
    Compare: 13,
    RequestOp: 14,
    TxnRequest: 15,
    CompactionRequest: 16,
    RangeResponse: 20,
    PutResponse: 21,
    DeleteRangeResponse: 22,
    ResponseOp: 23,
    TxnResponse: 24,
    CompactionResponse: 25,
}
ERROR_TAGS: dict[type, int] = {
    InvalidArgumentError: 1,
    KeyNotFoundError: 2,
    CompactedError: 3,
    FutureRevisionError: 4,
    LeaseNotFoundError: 5,
}

_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in TAGS
}
_CLASS_BY_TAG: dict[int, type] = {tag: cls for cls, tag in TAGS.items()}
_ERROR_BY_TAG: dict[int, type] = {tag: cls for cls, tag in ERROR_TAGS.items()}

# ---------------------------------------------------------------------------------------------
# Encoding


def to_plain(obj: Any) -> Any:
    """The msgpack-ready form of ``obj`` (see the module docstring)."""
    kind = type(obj)
    tag = TAGS.get(kind)
    if tag is not None:
        out = [tag]
        for name in _FIELDS[kind]:
            v = getattr(obj, name)
            t = type(v)
            if t is bytes or t is int or t is bool or v is None:
                out.append(v)
            else:
                out.append(to_plain(v))
        return out
    if kind is tuple or kind is list:
        return [to_plain(v) for v in obj]
    if isinstance(obj, IntEnum):
        return int(obj)
    if isinstance(obj, EtcdError):
        etag = ERROR_TAGS.get(kind)
        if etag is None:
            raise CodecError(f"cannot encode error type {kind.__name__}")
        return [ERROR_TAG, etag, obj.message, getattr(obj, "compact_revision", 0)]
    if kind in (bytes, int, bool, str) or obj is None:
        return obj
    raise CodecError(f"cannot encode {kind.__name__}")


def encode(obj: Any) -> bytes:
    return msgpack.packb(to_plain(obj), use_bin_type=True)


def encode_entry(request: Any, client_id: int = 0, request_id: int = 0) -> bytes:
    """A raft log entry for ``request``; ``client_id``/``request_id`` drive deduplication."""
    if type(request) not in TAGS:
        raise CodecError(f"not a request: {type(request).__name__}")
    return msgpack.packb(
        [ENTRY_FORMAT_VERSION, client_id, request_id, to_plain(request)], use_bin_type=True
    )


# ---------------------------------------------------------------------------------------------
# Decoding (schema derived from the dataclass annotations)

_Decoder = Callable[[Any], Any]


def _field_decoder(hint: Any) -> _Decoder | None:
    """None when the msgpack value is already the field value (bytes, int, bool)."""
    if hint in (bytes, int, bool, str):
        return None
    if isinstance(hint, type) and issubclass(hint, IntEnum):
        enum_cls = hint

        def dec_enum(v: Any) -> Any:
            try:
                return enum_cls(v)
            except ValueError:
                return v  # unknown value: left for validation to reject with etcd's error

        return dec_enum
    if hint in TAGS:
        return from_plain
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            optional = _field_decoder(inner[0])
            if optional is None:
                return None
            present = optional  # narrowed: the lambda keeps it
            return lambda v: None if v is None else present(v)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        sub = _field_decoder(args[0])

        def dec_tuple(v: Any) -> tuple:
            if type(v) is not list:
                raise CodecError("expected an array")
            return tuple(v) if sub is None else tuple(map(sub, v))

        return dec_tuple
    raise TypeError(f"codec: unsupported field type {hint!r}")


def _class_decoder(cls: type) -> _Decoder:
    hints = typing.get_type_hints(cls)
    names = _FIELDS[cls]
    decs = [_field_decoder(hints[n]) for n in names]
    n = len(names) + 1
    new: Callable[..., Any] = quick_constructor(cls)  # every replayed entry: see kvpb.quick
    if all(d is None for d in decs):

        def dec_flat(v: list) -> Any:
            if len(v) != n:
                raise CodecError(f"{cls.__name__}: expected {n - 1} fields")
            return new(*v[1:])

        return dec_flat

    def dec(v: list) -> Any:
        if len(v) != n:
            raise CodecError(f"{cls.__name__}: expected {n - 1} fields")
        return new(*[x if d is None else d(x) for d, x in zip(decs, v[1:], strict=True)])

    return dec


_DECODERS: dict[int, _Decoder] = {}


def from_plain(v: Any) -> Any:
    """Inverse of ``to_plain`` for tagged objects and errors."""
    if type(v) is not list or not v or type(v[0]) is not int:
        raise CodecError("expected a tagged array")
    tag = v[0]
    if tag == ERROR_TAG:
        if len(v) != 4 or v[1] not in _ERROR_BY_TAG or type(v[2]) is not str:
            raise CodecError("malformed error")
        cls = _ERROR_BY_TAG[v[1]]
        if cls is CompactedError:
            return CompactedError(v[2], compact_revision=v[3])
        return cls(v[2])
    dec = _DECODERS.get(tag)
    if dec is None:
        raise CodecError(f"unknown tag {tag}")
    try:
        return dec(v)
    except CodecError:
        raise
    except (TypeError, ValueError) as err:
        raise CodecError(f"malformed {_CLASS_BY_TAG[tag].__name__}: {err}") from err


for _cls, _tag in TAGS.items():
    _DECODERS[_tag] = _class_decoder(_cls)


def _put_op_decoder(generic: _Decoder) -> _Decoder:
    """``RequestOp``'s decoder with its most common shape first: an op holding only a put
    (a loaded store's log is mostly txns of puts, decoded by every follower and every
    replay). The same result as ``generic``, a third of the calls; any other shape goes to
    ``generic``."""
    put_tag = TAGS[PutRequest]
    put_fields = len(_FIELDS[PutRequest]) + 1
    new_op = quick_constructor(RequestOp)
    new_put = quick_constructor(PutRequest)

    def dec_op(v: list) -> Any:
        if len(v) == 5 and v[1] is None and v[3] is None and v[4] is None:
            put = v[2]
            if type(put) is list and len(put) == put_fields and put[0] == put_tag:
                return new_op(None, new_put(*put[1:]), None, None)
        return generic(v)

    return dec_op


_DECODERS[TAGS[RequestOp]] = _put_op_decoder(_DECODERS[TAGS[RequestOp]])


def decode(data: bytes) -> Any:
    try:
        plain = msgpack.unpackb(data, raw=False)
    except Exception as err:  # msgpack raises several types for garbage
        raise CodecError(f"not msgpack: {err}") from err
    return from_plain(plain)


def decode_entry(data: bytes) -> tuple[int, int, Any]:
    """(client_id, request_id, request) of a log entry made by ``encode_entry``."""
    try:
        plain = msgpack.unpackb(data, raw=False)
    except Exception as err:
        raise CodecError(f"entry is not msgpack: {err}") from err
    if type(plain) is not list or len(plain) != 4 or plain[0] != ENTRY_FORMAT_VERSION:
        raise CodecError("not a raftkv mvcc entry (or an unknown format version)")
    _, client_id, request_id, body = plain
    if type(client_id) is not int or type(request_id) is not int:
        raise CodecError("entry ids must be integers")
    request = from_plain(body)
    if isinstance(request, EtcdError):
        raise CodecError("entry holds an error, not a request")
    return client_id, request_id, request
