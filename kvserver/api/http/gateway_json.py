"""etcd v3 JSON gateway conventions: JSON bodies <-> the MVCC request/response dataclasses.

What etcd 3.4/3.5 serve through grpc-gateway v1 (jsonpb with ``OrigName: true`` and
``EmitDefaults: false``), checked against a real etcd 3.4.23:

Requests (``decode_*``)
- Field names are the proto names (``range_end``, ``prev_kv``); the lowerCamel JSON names
  (``rangeEnd``, ``prevKv``) are accepted too, as jsonpb does. A field given twice: the last
  one wins. Unknown fields are ignored (grpc-gateway v1 ignores them; etcd answers 200).
- ``null`` for any field means "absent" (the proto default). An empty body, or a body that is
  JSON ``null``, is the empty request (etcd then says ``etcdserver: key is not provided``).
- bytes: base64 strings. The standard alphabet with padding is what etcd writes; we also accept
  the URL-safe alphabet, missing padding and embedded CR/LF (the proto3 JSON mapping allows
  all of these; etcd 3.4's gateway accepts only CR/LF of them).
- int64: a JSON number without fraction or exponent, or a string of decimal digits with an
  optional ``-`` (``"42"``, ``"-1"``), within int64. etcd also tolerates whitespace around the
  digits inside the string; we do not.
- bool: ``true``/``false`` only (strings and numbers are refused, as by etcd).
- enums: the value name (``"DESCEND"``, ``"MOD"``, ``"NOT_EQUAL"``) or its number. An unknown
  name is refused here; an unknown number passes through to ``validate_request``, which refuses
  it (etcd >= 3.6's check; 3.4 accepted any number).
- ``RequestOp`` (``success``/``failure`` items) must set exactly one of ``request_range``,
  ``request_put``, ``request_delete_range``, ``request_txn``; none set (also ``null``) is
  etcd's ``etcdserver: key not found``. Nesting is bounded by ``MAX_TXN_DEPTH``.
- ``Compare``: ``target``/``result`` enums, ``key``, ``range_end`` and the union member the
  target names (``version``, ``create_revision``, ``mod_revision``, ``value``, ``lease``).

Any violation raises ``ServiceError`` InvalidArgument (HTTP 400) whose message names the
field path (``success[0].request_put.key``); nothing is proposed.

Responses (``*_response`` return dicts; ``encode`` turns one into body bytes)
- Proto names; int64/uint64 as decimal strings; bytes as standard base64; default values
  omitted (a false ``succeeded``/``more``, an empty ``kvs``, a zero ``count``/``deleted``, an
  empty ``value``, a zero ``lease``); ``header`` is always present, holding only its non-zero
  fields: ``{"cluster_id", "member_id", "revision", "raft_term"}`` at the top level, just
  ``{"revision"}`` in txn sub-responses and ``{}`` for a nested txn, as etcd.
- ``KeyValue`` key order as etcd: key, create_revision, mod_revision, version, value, lease.
- Leases (``/v3/lease/*``): requests use etcd's proto names ``ID``, ``TTL``, ``keys`` (int64 as
  above, ``keys`` a bool); responses ``{"header", "ID", "TTL"}`` (grant, one keep-alive
  ``result``), ``{"header"}`` (revoke), ``{"header", "ID", "TTL", "grantedTTL", "keys"}``
  (time-to-live; ``TTL`` is ``"-1"`` for an unknown lease) and ``{"header", "leases":
  [{"ID"}...]}`` — int64 as strings, zero fields omitted. A keep-alive body may hold several
  JSON objects one after another (the gateway's request stream); each gets one answer line.
- ``/v3/maintenance/status`` uses that message's own (camelCase) proto names: ``version``,
  ``dbSize``, ``leader``, ``raftIndex``, ``raftTerm``, ``raftAppliedIndex``, ``errors`` (the
  raised alarms, ``"memberID:<id> alarm:<TYPE> "`` as etcd prints them), ``dbSizeInUse``,
  ``isLearner``, and etcd 3.6's ``dbSizeQuota``.
- ``/v3/maintenance/alarm``: request ``{"action", "memberID", "alarm"}`` (``action`` GET,
  ACTIVATE or DEACTIVATE, ``alarm`` NONE, NOSPACE or CORRUPT: names or numbers; ``memberID`` a
  uint64, number or decimal string); an unknown action or alarm number is refused (etcd 3.4
  crashes on one). Response ``{"header", "alarms": [{"memberID", "alarm"}...]}`` with the
  usual omissions (no ``alarms`` when empty, no ``alarm`` for NONE). etcd 3.5 sends the
  header; etcd 3.4 leaves it out.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from operator import attrgetter
from typing import Any

from kvserver.kvpb.alarm import AlarmAction, AlarmRequest, AlarmResponse, AlarmType
from kvserver.kvpb.headers import ETCD_VERSION
from kvserver.kvpb.kv import (
    CompactionRequest,
    CompactionResponse,
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    DeleteRangeResponse,
    KeyValue,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    RequestOp,
    ResponseHeader,
    ResponseOp,
    SortOrder,
    SortTarget,
    TxnRequest,
    TxnResponse,
)
from kvserver.kvpb.lease import (
    LeaseGrantResponse,
    LeaseKeepAliveResponse,
    LeaseLeasesResponse,
    LeaseRevokeResponse,
    LeaseTimeToLiveResponse,
)
from kvserver.kvpb.quick import quick_constructor
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.server.service import NodeStatus

from .common import dumps

MAX_TXN_DEPTH = 128  # nested request_txn levels (etcd bounds them only by --max-txn-ops)

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
_INT_TEXT = re.compile(r"-?[0-9]{1,19}", re.ASCII)
_UINT_TEXT = re.compile(r"[0-9]{1,20}", re.ASCII)
_UINT64_MAX = (1 << 64) - 1
_URLSAFE_TO_STD = str.maketrans("-_", "+/", "\r\n")
_a2b = binascii.a2b_base64
_b2a = binascii.b2a_base64


# ---------------------------------------------------------------------------------------------
# Decoding


class _Kind(IntEnum):
    BYTES = 0
    INT64 = 1
    BOOL = 2
    ENUM = 3
    MESSAGE = 4
    REPEATED = 5  # a list of messages


@dataclass(frozen=True, slots=True)
class _Field:
    attr: str
    kind: _Kind
    enum: type[IntEnum] | None = None
    message: str = ""  # name of the message spec for MESSAGE / REPEATED


@dataclass(frozen=True, slots=True)
class _Message:
    cls: type
    required: dict[str, Any]  # constructor arguments without a dataclass default
    fields: dict[str, _Field] = field(default_factory=dict)  # JSON name -> field


def _lower_camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _message(cls: type, required: dict[str, Any], *specs: _Field) -> _Message:
    fields: dict[str, _Field] = {}
    for f in specs:
        fields[f.attr] = f
        fields[_lower_camel(f.attr)] = f
    return _Message(cls, required, fields)


_BY, _INT, _BOOL, _ENUM = _Kind.BYTES, _Kind.INT64, _Kind.BOOL, _Kind.ENUM
_MSG, _REP = _Kind.MESSAGE, _Kind.REPEATED

_MESSAGES: dict[str, _Message] = {
    "RangeRequest": _message(
        RangeRequest,
        {"key": b""},
        _Field("key", _BY),
        _Field("range_end", _BY),
        _Field("limit", _INT),
        _Field("revision", _INT),
        _Field("sort_order", _ENUM, SortOrder),
        _Field("sort_target", _ENUM, SortTarget),
        _Field("serializable", _BOOL),
        _Field("keys_only", _BOOL),
        _Field("count_only", _BOOL),
        _Field("min_mod_revision", _INT),
        _Field("max_mod_revision", _INT),
        _Field("min_create_revision", _INT),
        _Field("max_create_revision", _INT),
    ),
    "PutRequest": _message(
        PutRequest,
        {"key": b""},
        _Field("key", _BY),
        _Field("value", _BY),
        _Field("lease", _INT),
        _Field("prev_kv", _BOOL),
        _Field("ignore_value", _BOOL),
        _Field("ignore_lease", _BOOL),
    ),
    "DeleteRangeRequest": _message(
        DeleteRangeRequest,
        {"key": b""},
        _Field("key", _BY),
        _Field("range_end", _BY),
        _Field("prev_kv", _BOOL),
    ),
    "Compare": _message(
        Compare,
        {"result": CompareResult.EQUAL, "target": CompareTarget.VERSION, "key": b""},
        _Field("result", _ENUM, CompareResult),
        _Field("target", _ENUM, CompareTarget),
        _Field("key", _BY),
        _Field("version", _INT),
        _Field("create_revision", _INT),
        _Field("mod_revision", _INT),
        _Field("value", _BY),
        _Field("lease", _INT),
        _Field("range_end", _BY),
    ),
    "RequestOp": _message(
        RequestOp,
        {},
        _Field("request_range", _MSG, message="RangeRequest"),
        _Field("request_put", _MSG, message="PutRequest"),
        _Field("request_delete_range", _MSG, message="DeleteRangeRequest"),
        _Field("request_txn", _MSG, message="TxnRequest"),
    ),
    "TxnRequest": _message(
        TxnRequest,
        {},
        _Field("compare", _REP, message="Compare"),
        _Field("success", _REP, message="RequestOp"),
        _Field("failure", _REP, message="RequestOp"),
    ),
    "CompactionRequest": _message(
        CompactionRequest,
        {"revision": 0},
        _Field("revision", _INT),
        _Field("physical", _BOOL),
    ),
}


def _invalid(message: str) -> ServiceError:
    return ServiceError(GrpcCode.INVALID_ARGUMENT, "raftkv: " + message)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "boolean"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object"


def _show(value: Any) -> str:
    """A short rendering of a bad value for an error message."""
    if isinstance(value, (dict, list)):
        return _json_type(value)
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bytes(raw: Any, path: str) -> bytes:
    if type(raw) is not str:
        raise _invalid(f'field "{path}": expected a base64 string, got {_json_type(raw)}')
    try:
        return _a2b(raw, strict_mode=True)
    except ValueError:  # binascii.Error, or non-ASCII text
        pass
    try:
        text = raw.translate(_URLSAFE_TO_STD)
        return _a2b(text + "=" * (-len(text) % 4), strict_mode=True)
    except ValueError:
        raise _invalid(f'field "{path}": invalid base64 {_show(raw)}') from None


def _int64(raw: Any, path: str) -> int:
    kind = type(raw)
    if kind is int:
        value = raw
    elif kind is str and _INT_TEXT.fullmatch(raw) is not None:
        value = int(raw)
    else:
        raise _invalid(
            f'field "{path}": expected a 64-bit integer (a JSON integer or a decimal string), '
            f"got {_show(raw)}"
        )
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _invalid(f'field "{path}": {value} is out of the int64 range')
    return value


def _uint64(raw: Any, path: str) -> int:
    kind = type(raw)
    if kind is int:
        value = raw
    elif kind is str and _UINT_TEXT.fullmatch(raw) is not None:
        value = int(raw)
    else:
        raise _invalid(
            f'field "{path}": expected a 64-bit unsigned integer (a JSON integer or a decimal '
            f"string), got {_show(raw)}"
        )
    if not 0 <= value <= _UINT64_MAX:
        raise _invalid(f'field "{path}": {value} is out of the uint64 range')
    return value


def _enum(raw: Any, enum: type[IntEnum], path: str) -> int:
    kind = type(raw)
    if kind is str:
        member = enum.__members__.get(raw)
        if member is None:
            names = ", ".join(enum.__members__)
            raise _invalid(
                f'field "{path}": unknown value {_show(raw)} for enum '
                f"{enum.__name__} (one of {names}, or its number)"
            )
        return member
    if kind is int and _INT32_MIN <= raw <= _INT32_MAX:
        try:
            return enum(raw)
        except ValueError:
            return raw  # validate_request refuses it with etcd's text
    raise _invalid(f'field "{path}": expected an enum name or number, got {_show(raw)}')


def _decode(obj: Any, spec: _Message, path: str, depth: int) -> Any:
    if spec.cls is RequestOp and type(obj) is dict and len(obj) == 1:
        put = obj.get("request_put")
        if type(put) is dict and len(put) == 2:
            # The op a txn of puts repeats: a put of a key and a value, decoded in one step
            # (the same answer and errors as the general path below, in a third of the time;
            # the fields in the body's order, so a bad one is named as that path names it).
            (name1, raw1), (name2, raw2) = put.items()
            key_first = name1 == "key" and name2 == "value"
            if (
                (key_first or (name1 == "value" and name2 == "key"))
                and type(raw1) is str
                and type(raw2) is str
            ):
                where = path + "request_put."
                first, second = _bytes(raw1, where + name1), _bytes(raw2, where + name2)
                request = _new_put(first, second) if key_first else _new_put(second, first)
                return _new_op(None, request, None, None)
    return _decode_fields(obj, spec, path, depth)


def _decode_fields(obj: Any, spec: _Message, path: str, depth: int) -> Any:
    if obj is None:
        return spec.cls(**spec.required)
    if type(obj) is not dict:
        where = f'field "{path[:-1]}"' if path else "body"
        raise _invalid(f"{where}: expected a JSON object, got {_json_type(obj)}")
    kwargs = dict(spec.required)
    fields = spec.fields
    for name, raw in obj.items():
        f = fields.get(name)
        if f is None or raw is None:
            continue  # unknown field (ignored, as etcd) or null (= default)
        kind = f.kind
        if kind is _BY:
            kwargs[f.attr] = _bytes(raw, path + name)
        elif kind is _INT:
            kwargs[f.attr] = _int64(raw, path + name)
        elif kind is _BOOL:
            if raw is not True and raw is not False:
                raise _invalid(f'field "{path}{name}": expected true or false, got {_show(raw)}')
            kwargs[f.attr] = raw
        elif kind is _ENUM:
            kwargs[f.attr] = _enum(raw, f.enum, path + name)  # type: ignore[arg-type]
        elif kind is _MSG:
            sub_depth = depth + 1 if f.message == "TxnRequest" else depth
            if sub_depth > MAX_TXN_DEPTH:
                raise _invalid(f"txn nested deeper than {MAX_TXN_DEPTH} levels")
            kwargs[f.attr] = _decode(raw, _MESSAGES[f.message], f"{path}{name}.", sub_depth)
        else:  # REPEATED
            if type(raw) is not list:
                raise _invalid(
                    f'field "{path}{name}": expected a JSON array, got {_json_type(raw)}'
                )
            item_spec = _MESSAGES[f.message]
            kwargs[f.attr] = tuple(
                _decode(item, item_spec, f"{path}{name}[{i}].", depth) for i, item in enumerate(raw)
            )
    if spec.cls is RequestOp and len(kwargs) > 1:
        # etcd's jsonpb silently keeps one member of the oneof; refusing is clearer.
        raise _invalid(
            f'field "{path[:-1]}": a txn operation must set exactly one of '
            "request_range, request_put, request_delete_range, request_txn"
        )
    return spec.cls(**kwargs)


def parse_json(body: bytes) -> Any:
    """The JSON value of a request body; an empty (or all-whitespace) body is ``None``."""
    if not body or body.isspace():
        return None
    try:
        return json.loads(body)
    except RecursionError:
        raise _invalid("invalid JSON body: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many int digits
        raise _invalid(f"invalid JSON body: {exc}") from None


_new_op = quick_constructor(RequestOp)
_new_put = quick_constructor(PutRequest)


def _decoder(message: str) -> Any:
    spec = _MESSAGES[message]

    def decode(body: bytes) -> Any:
        return _decode(parse_json(body), spec, "", 0)

    decode.__name__ = "decode_" + message
    decode.__doc__ = f"Decode a JSON request body into a ``{message}`` (see module docstring)."
    return decode


decode_range = _decoder("RangeRequest")
decode_put = _decoder("PutRequest")
decode_delete_range = _decoder("DeleteRangeRequest")
decode_txn = _decoder("TxnRequest")
decode_compaction = _decoder("CompactionRequest")


# Lease requests: a handful of scalar fields, decoded by JSON name (ID, TTL, keys).
_LEASE_FIELDS: dict[str, _Kind] = {"ID": _INT, "TTL": _INT, "keys": _BOOL}
MAX_KEEPALIVE_REQUESTS = 1024  # request objects in one keep-alive body


def _lease_object(obj: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The known fields of one lease request object (absent/null ones left out)."""
    if obj is None:
        return {}
    if type(obj) is not dict:
        raise _invalid(f"body: expected a JSON object, got {_json_type(obj)}")
    out: dict[str, Any] = {}
    for name, raw in obj.items():
        if name not in allowed or raw is None:
            continue  # unknown field (ignored, as etcd) or null (= default)
        if _LEASE_FIELDS[name] is _INT:
            out[name] = _int64(raw, name)
        elif raw is True or raw is False:
            out[name] = raw
        else:
            raise _invalid(f'field "{name}": expected true or false, got {_show(raw)}')
    return out


def decode_lease_grant(body: bytes) -> tuple[int, int]:
    """LeaseGrantRequest ``{"TTL", "ID"}`` -> ``(ttl_s, lease_id)``."""
    f = _lease_object(parse_json(body), ("TTL", "ID"))
    return f.get("TTL", 0), f.get("ID", 0)


def decode_lease_id(body: bytes) -> int:
    """LeaseRevokeRequest / LeaseKeepAliveRequest ``{"ID"}`` -> ``lease_id``."""
    return _lease_object(parse_json(body), ("ID",)).get("ID", 0)


def decode_lease_time_to_live(body: bytes) -> tuple[int, bool]:
    """LeaseTimeToLiveRequest ``{"ID", "keys"}`` -> ``(lease_id, keys)``."""
    f = _lease_object(parse_json(body), ("ID", "keys"))
    return f.get("ID", 0), f.get("keys", False)


def decode_empty(body: bytes) -> None:
    """A request without fields (LeaseLeasesRequest): empty, ``null`` or a JSON object."""
    _lease_object(parse_json(body), ())


def _known_enum(raw: Any, enum: type[IntEnum], path: str) -> Any:
    value = _enum(raw, enum, path)
    if value not in enum._value2member_map_:
        raise _invalid(f'field "{path}": unknown {enum.__name__} {value}')
    return enum(value)


def decode_alarm(body: bytes) -> AlarmRequest:
    """AlarmRequest ``{"action", "memberID", "alarm"}`` (see the module docstring)."""
    obj = parse_json(body)
    if obj is None:
        return AlarmRequest()
    if type(obj) is not dict:
        raise _invalid(f"body: expected a JSON object, got {_json_type(obj)}")
    action, member_id, alarm = AlarmAction.GET, 0, AlarmType.NONE
    for name, raw in obj.items():
        if raw is None:
            continue  # null = the default
        if name == "action":
            action = _known_enum(raw, AlarmAction, name)
        elif name == "memberID":
            member_id = _uint64(raw, name)
        elif name == "alarm":
            alarm = _known_enum(raw, AlarmType, name)
    return AlarmRequest(action, member_id, alarm)


def decode_lease_keepalive_stream(body: bytes) -> list[int]:
    """Lease IDs of a keep-alive request stream: JSON objects one after another (whitespace
    between them is allowed); an empty body is one request for ID 0."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"invalid JSON body: {exc}") from None
    decoder = json.JSONDecoder()
    ids: list[int] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        if len(ids) >= MAX_KEEPALIVE_REQUESTS:
            raise _invalid(f"more than {MAX_KEEPALIVE_REQUESTS} keep-alive requests in a body")
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except RecursionError:
            raise _invalid("invalid JSON body: nested too deeply") from None
        except ValueError as exc:
            raise _invalid(f"invalid JSON body: {exc}") from None
        ids.append(_lease_object(obj, ("ID",)).get("ID", 0))
    return ids or [0]


# ---------------------------------------------------------------------------------------------
# Encoding (the hot path: plain dicts, built directly, serialized once)
#
# ``*_response(r)`` build the JSON object as a dict (used for sub-responses and in tests);
# ``encode_*(r)`` produce the body bytes of a top-level response: the header's JSON text is
# assembled from a cached prefix/suffix (cluster, member and term rarely change; only the
# revision does), and the remaining fields are serialized once and spliced in after it.


def b64(data: bytes) -> str:
    return _b2a(data, newline=False).decode("ascii")


def header(h: ResponseHeader) -> dict[str, str]:
    out = {}
    if h.cluster_id:
        out["cluster_id"] = str(h.cluster_id)
    if h.member_id:
        out["member_id"] = str(h.member_id)
    if h.revision:
        out["revision"] = str(h.revision)
    if h.raft_term:
        out["raft_term"] = str(h.raft_term)
    return out


# (cluster_id, member_id, raft_term) -> JSON text around the revision. A pure memo, bounded:
# cleared when full (a term change adds one entry).
_HEADER_PARTS: dict[tuple[int, int, int], tuple[str, str]] = {}
_HEADER_PARTS_MAX = 64


def header_json(h: ResponseHeader) -> str:
    """``json(header(h))``, fast for the usual header with every field set."""
    if not (h.cluster_id and h.member_id and h.revision and h.raft_term):
        return dumps(header(h))
    key = (h.cluster_id, h.member_id, h.raft_term)
    parts = _HEADER_PARTS.get(key)
    if parts is None:
        if len(_HEADER_PARTS) >= _HEADER_PARTS_MAX:
            _HEADER_PARTS.clear()
        parts = _HEADER_PARTS[key] = (
            f'{{"cluster_id":"{h.cluster_id}","member_id":"{h.member_id}","revision":"',
            f'","raft_term":"{h.raft_term}"}}',
        )
    return parts[0] + str(h.revision) + parts[1]


def _with_header(h: ResponseHeader, fields: dict[str, Any]) -> bytes:
    """Body bytes of ``{"header": h, **fields}`` (header first, as etcd writes it)."""
    if not fields:
        return ('{"header":' + header_json(h) + "}").encode("ascii")
    return ('{"header":' + header_json(h) + "," + dumps(fields)[1:]).encode("ascii")


def key_value(kv: KeyValue) -> dict[str, str]:
    out = {}
    if kv.key:
        out["key"] = _b2a(kv.key, newline=False).decode("ascii")
    if kv.create_revision:
        out["create_revision"] = str(kv.create_revision)
    if kv.mod_revision:
        out["mod_revision"] = str(kv.mod_revision)
    if kv.version:
        out["version"] = str(kv.version)
    if kv.value:
        out["value"] = _b2a(kv.value, newline=False).decode("ascii")
    if kv.lease:
        out["lease"] = str(kv.lease)
    return out


def key_value_json(kv: KeyValue) -> str:
    """``dumps(key_value(kv))``, built as text for the usual KeyValue (every field but the
    lease set): a range answer of a thousand keys spends most of its time here."""
    key, value = kv.key, kv.value
    if not (key and value and kv.create_revision and kv.mod_revision and kv.version):
        return dumps(key_value(kv))
    text = (
        f'{{"key":"{_b2a(key, newline=False).decode("ascii")}",'
        f'"create_revision":"{kv.create_revision}","mod_revision":"{kv.mod_revision}",'
        f'"version":"{kv.version}","value":"{_b2a(value, newline=False).decode("ascii")}"'
    )
    return text + (f',"lease":"{kv.lease}"}}' if kv.lease else "}")


def _range_fields(r: RangeResponse) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.kvs:
        out["kvs"] = list(map(key_value, r.kvs))
    if r.more:
        out["more"] = True
    if r.count:
        out["count"] = str(r.count)
    return out


def _put_fields(r: PutResponse) -> dict[str, Any]:
    return {} if r.prev_kv is None else {"prev_kv": key_value(r.prev_kv)}


def _delete_range_fields(r: DeleteRangeResponse) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.deleted:
        out["deleted"] = str(r.deleted)
    if r.prev_kvs:
        out["prev_kvs"] = list(map(key_value, r.prev_kvs))
    return out


def _txn_fields(r: TxnResponse) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.succeeded:
        out["succeeded"] = True
    if r.responses:
        out["responses"] = list(map(_response_op, r.responses))
    return out


def range_response(r: RangeResponse) -> dict[str, Any]:
    return {"header": header(r.header), **_range_fields(r)}


def put_response(r: PutResponse) -> dict[str, Any]:
    return {"header": header(r.header), **_put_fields(r)}


def delete_range_response(r: DeleteRangeResponse) -> dict[str, Any]:
    return {"header": header(r.header), **_delete_range_fields(r)}


def txn_response(r: TxnResponse) -> dict[str, Any]:
    return {"header": header(r.header), **_txn_fields(r)}


def _response_op(op: ResponseOp) -> dict[str, Any]:
    if op.response_put is not None:
        return {"response_put": put_response(op.response_put)}
    if op.response_range is not None:
        return {"response_range": range_response(op.response_range)}
    if op.response_delete_range is not None:
        return {"response_delete_range": delete_range_response(op.response_delete_range)}
    if op.response_txn is not None:
        return {"response_txn": txn_response(op.response_txn)}
    return {}


ENCODE_STEP_KVS = 1024  # kvs per call in encode_range_in_steps
ENCODE_IN_THREAD_KVS = 10_000  # a range answer longer than this is encoded off the loop


def encode_range(r: RangeResponse) -> bytes:
    return encode_range_in_steps(r, step=max(1, len(r.kvs)))


# The usual KeyValue of a range answer (every field but the lease set), as bytes: ``%``
# fills it in C from base64 bytes and ints, with no str made per field.
KV_BYTES = b'{"key":"%s","create_revision":"%d","mod_revision":"%d","version":"%d","value":"%s"}'
_KEY = attrgetter("key")
_VALUE = attrgetter("value")
_CREATE = attrgetter("create_revision")
_MOD = attrgetter("mod_revision")
_VERSION = attrgetter("version")
_LEASE = attrgetter("lease")


def usual_key_values_json(kvs: Sequence[KeyValue], template: bytes = KV_BYTES) -> bytes | None:
    """``template`` (``KV_BYTES`` or one holding it, with the same five ``%``s) filled in
    for each KeyValue, joined by commas, as ASCII bytes: column by column, when every
    KeyValue is the usual one (key, value, revisions and version set, no lease); else None
    (``key_value_json`` costs a dozen Python operations per KeyValue)."""
    keys, values, versions = list(map(_KEY, kvs)), list(map(_VALUE, kvs)), list(map(_VERSION, kvs))
    creates, mods = list(map(_CREATE, kvs)), list(map(_MOD, kvs))
    if not (all(keys) and all(values) and all(creates) and all(mods) and all(versions)) or any(
        map(_LEASE, kvs)
    ):
        return None
    keys64 = [_b2a(k, newline=False) for k in keys]
    values64 = [_b2a(v, newline=False) for v in values]
    return b",".join(
        map(template.__mod__, zip(keys64, creates, mods, versions, values64, strict=True))
    )


def _key_values_json(kvs: Sequence[KeyValue]) -> bytes:
    """``",".join(map(key_value_json, kvs))`` as ASCII bytes, fast for the usual ones."""
    usual = usual_key_values_json(kvs)
    return ",".join(map(key_value_json, kvs)).encode("ascii") if usual is None else usual


def encode_range_in_steps(r: RangeResponse, step: int = ENCODE_STEP_KVS) -> bytes:
    """The body of a range answer, with no single call longer than encoding ``step`` kvs:
    for a big answer in a worker thread (a response is immutable), where one call over a
    million kvs would hold the interpreter, and so the event loop, for seconds."""
    if not r.kvs:
        return _with_header(r.header, _range_fields(r))
    kvs = r.kvs
    # Bytes per step, joined as bytes: bytes.join copies a big body without the interpreter
    # lock, where one str join and encode of it would hold it.
    pieces = [_key_values_json(kvs[i : i + step]) for i in range(0, len(kvs), step)]
    tail = (',"more":true' if r.more else "") + (f',"count":"{r.count}"' if r.count else "")
    head = '{"header":' + header_json(r.header) + ',"kvs":['
    return b"".join((head.encode("ascii"), b",".join(pieces), b"]", tail.encode("ascii"), b"}"))


def encode_put(r: PutResponse) -> bytes:
    return _with_header(r.header, _put_fields(r))


def encode_delete_range(r: DeleteRangeResponse) -> bytes:
    return _with_header(r.header, _delete_range_fields(r))


def encode_txn(r: TxnResponse) -> bytes:
    responses = r.responses
    if len(responses) > 1 and len(set(map(id, responses))) == 1:
        # The store answers every bare put of a txn with one shared ResponseOp: its text is
        # made once (at 100 puts, 1.5 µs a put before).
        one = dumps(_response_op(responses[0]))
        text = '{"header":' + header_json(r.header)
        text += ',"succeeded":true' if r.succeeded else ""
        return (text + ',"responses":[' + ",".join([one] * len(responses)) + "]}").encode("ascii")
    return _with_header(r.header, _txn_fields(r))


def encode_compaction(r: CompactionResponse) -> bytes:
    return _with_header(r.header, {})


def _nonzero_int(fields: dict[str, Any], name: str, value: int) -> None:
    if value:
        fields[name] = str(value)


def encode_lease_grant(r: LeaseGrantResponse) -> bytes:
    fields: dict[str, Any] = {}
    _nonzero_int(fields, "ID", r.lease_id)
    _nonzero_int(fields, "TTL", r.ttl_s)
    return _with_header(r.header, fields)


def encode_lease_revoke(r: LeaseRevokeResponse) -> bytes:
    return _with_header(r.header, {})


def encode_lease_time_to_live(r: LeaseTimeToLiveResponse) -> bytes:
    fields: dict[str, Any] = {}
    _nonzero_int(fields, "ID", r.lease_id)
    _nonzero_int(fields, "TTL", r.ttl_s)
    _nonzero_int(fields, "grantedTTL", r.granted_ttl_s)
    if r.keys:
        fields["keys"] = [b64(k) for k in r.keys]
    return _with_header(r.header, fields)


def encode_lease_leases(r: LeaseLeasesResponse) -> bytes:
    fields: dict[str, Any] = {}
    if r.leases:
        fields["leases"] = [{"ID": str(lease_id)} for lease_id in r.leases]
    return _with_header(r.header, fields)


def encode_lease_keepalive_line(r: LeaseKeepAliveResponse) -> bytes:
    """One line of the keep-alive stream: ``{"result": {...}}`` and a newline."""
    fields: dict[str, Any] = {}
    _nonzero_int(fields, "ID", r.lease_id)
    _nonzero_int(fields, "TTL", r.ttl_s)
    return b'{"result":' + _with_header(r.header, fields) + b"}\n"


def alarm_response(r: AlarmResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"header": header(r.header)}
    alarms = []
    for a in r.alarms:
        item: dict[str, Any] = {}
        if a.member_id:
            item["memberID"] = str(a.member_id)
        if a.alarm:
            item["alarm"] = AlarmType(a.alarm).name
        alarms.append(item)
    if alarms:
        out["alarms"] = alarms
    return out


def encode_alarm(r: AlarmResponse) -> bytes:
    return encode(alarm_response(r))


def status_response(s: NodeStatus) -> dict[str, Any]:
    """etcdserverpb.StatusResponse for ``/v3/maintenance/status``."""
    out: dict[str, Any] = {
        "header": header(ResponseHeader(s.cluster_id, s.member_id, s.revision, s.raft_term)),
        "version": ETCD_VERSION,
    }
    if s.db_size_bytes:
        out["dbSize"] = str(s.db_size_bytes)
    if s.leader:
        out["leader"] = str(s.leader)
    if s.raft_index:
        out["raftIndex"] = str(s.raft_index)
    if s.raft_term:
        out["raftTerm"] = str(s.raft_term)
    if s.raft_applied_index:
        out["raftAppliedIndex"] = str(s.raft_applied_index)
    if s.errors:
        out["errors"] = list(s.errors)
    if s.db_size_bytes:
        out["dbSizeInUse"] = str(s.db_size_bytes)  # no free pages in an in-memory store
    if s.is_learner:
        out["isLearner"] = True
    if s.quota_backend_bytes:
        out["dbSizeQuota"] = str(s.quota_backend_bytes)  # etcd 3.6's field
    if s.archive_lag_entries is not None:  # not etcd's: its clients ignore unknown fields
        out["raftkvArchive"] = {
            "lagEntries": str(s.archive_lag_entries),
            "lagSeconds": round(s.archive_lag_seconds or 0.0, 3),
        }
    return out


def encode(payload: dict[str, Any]) -> bytes:
    """Serialize a response dict compactly (ASCII JSON, like etcd's gateway)."""
    return dumps(payload).encode("ascii")
