"""The etcd v3 JSON gateway dialect, client side: typed requests → JSON bodies, JSON answers →
typed results.

Conventions (grpc-gateway's, as etcd 3.4/3.5 speak them): field names as in the protobufs
(snake_case, except StatusResponse's ``dbSize``/``raftIndex``/... and Member's ``ID``/
``peerURLs``/``clientURLs``, which etcd declares in camelCase); ``bytes`` fields base64 (standard
alphabet, padded); 64-bit integers as JSON strings; enums by name; fields with default values
omitted, both ways. Decoding is lenient where servers differ: an integer may come as a string
or a number, and a field may be spelled snake_case or camelCase.

Bodies sent (only non-default fields appear):

- put: ``{"key", "value", "lease", "prev_kv"}``
- range: ``{"key", "range_end", "limit", "revision", "sort_order", "sort_target",
  "serializable", "keys_only", "count_only"}``
- deleterange: ``{"key", "range_end", "prev_kv"}``
- txn: ``{"compare": [{"result", "target", "key", "range_end", <target field>}],
  "success": [{"request_put"|"request_range"|"request_delete_range"|"request_txn": {...}}],
  "failure": [...]}`` — the compare's target field (``version``, ``create_revision``,
  ``mod_revision``, ``value`` or ``lease``) is always present, even when zero.
- compaction: ``{"revision", "physical"}``
"""

from __future__ import annotations

import base64
import binascii
from binascii import a2b_base64 as _a2b
from collections.abc import Mapping
from typing import Any

from kvserver.client.errors import ResponseFormatError
from kvserver.client.types import (
    CompactResult,
    DeleteResult,
    Member,
    PutResult,
    RangeResult,
    Status,
    TxnResult,
)
from kvserver.kvpb import kv as pb
from kvserver.kvpb.quick import quick_constructor

_COMPARE_FIELD = {
    pb.CompareTarget.VERSION: "version",
    pb.CompareTarget.CREATE: "create_revision",
    pb.CompareTarget.MOD: "mod_revision",
    pb.CompareTarget.VALUE: "value",
    pb.CompareTarget.LEASE: "lease",
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# ---------------------------------------------------------------------------------------------
# Requests


def encode_put(req: pb.PutRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(req.key)}
    if req.value:
        body["value"] = b64(req.value)
    if req.lease:
        body["lease"] = str(req.lease)
    if req.prev_kv:
        body["prev_kv"] = True
    if req.ignore_value:
        body["ignore_value"] = True
    if req.ignore_lease:
        body["ignore_lease"] = True
    return body


def encode_range(req: pb.RangeRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(req.key)}
    if req.range_end:
        body["range_end"] = b64(req.range_end)
    if req.limit:
        body["limit"] = str(req.limit)
    if req.revision:
        body["revision"] = str(req.revision)
    if req.sort_order != pb.SortOrder.NONE:
        body["sort_order"] = pb.SortOrder(req.sort_order).name
    if req.sort_target != pb.SortTarget.KEY:
        body["sort_target"] = pb.SortTarget(req.sort_target).name
    for flag in ("serializable", "keys_only", "count_only"):
        if getattr(req, flag):
            body[flag] = True
    for bound in (
        "min_mod_revision",
        "max_mod_revision",
        "min_create_revision",
        "max_create_revision",
    ):
        if getattr(req, bound):
            body[bound] = str(getattr(req, bound))
    return body


def encode_delete(req: pb.DeleteRangeRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(req.key)}
    if req.range_end:
        body["range_end"] = b64(req.range_end)
    if req.prev_kv:
        body["prev_kv"] = True
    return body


def encode_compare(cmp: pb.Compare) -> dict[str, Any]:
    target = pb.CompareTarget(cmp.target)
    body: dict[str, Any] = {"result": cmp.result.name, "target": target.name, "key": b64(cmp.key)}
    if cmp.range_end:
        body["range_end"] = b64(cmp.range_end)
    field = _COMPARE_FIELD[target]
    raw = getattr(cmp, field)
    body[field] = b64(raw) if target == pb.CompareTarget.VALUE else str(raw)
    return body


def encode_op(op: pb.RequestOp) -> dict[str, Any]:
    if op.request_put is not None:
        return {"request_put": encode_put(op.request_put)}
    if op.request_range is not None:
        return {"request_range": encode_range(op.request_range)}
    if op.request_delete_range is not None:
        return {"request_delete_range": encode_delete(op.request_delete_range)}
    if op.request_txn is not None:
        return {"request_txn": encode_txn(op.request_txn)}
    raise ValueError("empty txn operation")


def encode_txn(req: pb.TxnRequest) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if req.compare:
        body["compare"] = [encode_compare(c) for c in req.compare]
    if req.success:
        body["success"] = [encode_op(op) for op in req.success]
    if req.failure:
        body["failure"] = [encode_op(op) for op in req.failure]
    return body


def encode_compaction(req: pb.CompactionRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"revision": str(req.revision)}
    if req.physical:
        body["physical"] = True
    return body


# ---------------------------------------------------------------------------------------------
# Answers


def _field(doc: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if name in doc:
            return doc[name]
    return default


def to_int(raw: Any, what: str) -> int:
    """A 64-bit integer sent as a JSON string or number (absent → 0)."""
    if type(raw) is str:  # the usual form first (a range answer has thousands)
        try:
            return int(raw, 10)
        except ValueError:
            raise ResponseFormatError(f"field {what!r}: expected an integer, got {raw!r}") from None
    if raw is None:
        return 0
    if isinstance(raw, bool):
        raise ResponseFormatError(f"field {what!r}: expected an integer, got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw, 10)
        except ValueError:
            pass
    raise ResponseFormatError(f"field {what!r}: expected an integer, got {raw!r}")


def to_bytes(raw: Any, what: str) -> bytes:
    if type(raw) is str:
        # Strict decoding in C takes exactly the text the check below takes (the alphabet,
        # padded); anything else goes the long way, which decides and says why.
        try:
            return _a2b(raw, strict_mode=True)
        except (binascii.Error, ValueError):
            pass
    if raw is None:
        return b""
    if not isinstance(raw, str):
        raise ResponseFormatError(f"field {what!r}: expected base64 text, got {raw!r}")
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ResponseFormatError(f"field {what!r}: bad base64 {raw[:40]!r}") from None


def _to_bool(raw: Any, what: str) -> bool:
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise ResponseFormatError(f"field {what!r}: expected true/false, got {raw!r}")
    return raw


def _mapping(raw: Any, what: str) -> Mapping[str, Any]:
    if type(raw) is dict:  # what json.loads gives: no ABC check
        return raw
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ResponseFormatError(f"{what}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _list(raw: Any, what: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ResponseFormatError(f"{what}: expected a JSON list, got {type(raw).__name__}")
    return raw


def decode_header(raw: Any) -> pb.ResponseHeader:
    doc = _mapping(raw, "header")
    return pb.ResponseHeader(
        cluster_id=to_int(doc.get("cluster_id"), "cluster_id"),
        member_id=to_int(doc.get("member_id"), "member_id"),
        revision=to_int(doc.get("revision"), "revision"),
        raft_term=to_int(doc.get("raft_term"), "raft_term"),
    )


# A range page or a watch response decodes a KeyValue per key: built by a quick constructor
# (kvserver.kvpb.quick), a third of the frozen dataclass's own __init__.
_new_kv = quick_constructor(pb.KeyValue)


def decode_kv(raw: Any) -> pb.KeyValue:
    get = _mapping(raw, "kv").get
    return _new_kv(
        to_bytes(get("key"), "key"),
        to_bytes(get("value"), "value"),
        to_int(get("create_revision"), "create_revision"),
        to_int(get("mod_revision"), "mod_revision"),
        to_int(get("version"), "version"),
        to_int(get("lease"), "lease"),
    )


def decode_put(raw: Any) -> PutResult:
    doc = _mapping(raw, "put response")
    prev = doc.get("prev_kv")
    return PutResult(
        header=decode_header(doc.get("header")),
        prev_kv=decode_kv(prev) if prev is not None else None,
    )


def decode_range(raw: Any) -> RangeResult:
    doc = _mapping(raw, "range response")
    return RangeResult(
        header=decode_header(doc.get("header")),
        kvs=tuple(map(decode_kv, _list(doc.get("kvs"), "kvs"))),
        more=_to_bool(doc.get("more"), "more"),
        count=to_int(doc.get("count"), "count"),
    )


def decode_delete(raw: Any) -> DeleteResult:
    doc = _mapping(raw, "deleterange response")
    return DeleteResult(
        header=decode_header(doc.get("header")),
        deleted=to_int(doc.get("deleted"), "deleted"),
        prev_kvs=tuple(decode_kv(kv) for kv in _list(doc.get("prev_kvs"), "prev_kvs")),
    )


def decode_txn(raw: Any) -> TxnResult:
    doc = _mapping(raw, "txn response")
    responses: list[PutResult | RangeResult | DeleteResult | TxnResult] = []
    last: Any = None
    for item in _list(doc.get("responses"), "responses"):
        if item == last and responses:
            # The puts of a txn answer alike (one header each, no prev_kv): an op equal to
            # the one before decodes to the same (immutable) result.
            responses.append(responses[-1])
            continue
        last = item
        op = _mapping(item, "txn response op")
        if "response_put" in op:
            responses.append(decode_put(op["response_put"]))
        elif "response_range" in op:
            responses.append(decode_range(op["response_range"]))
        elif "response_delete_range" in op:
            responses.append(decode_delete(op["response_delete_range"]))
        elif "response_txn" in op:
            responses.append(decode_txn(op["response_txn"]))
        else:
            raise ResponseFormatError(f"txn response op with no known field: {sorted(op)}")
    return TxnResult(
        header=decode_header(doc.get("header")),
        succeeded=_to_bool(doc.get("succeeded"), "succeeded"),
        responses=tuple(responses),
    )


def decode_compaction(raw: Any) -> CompactResult:
    return CompactResult(header=decode_header(_mapping(raw, "compaction response").get("header")))


def decode_status(raw: Any, endpoint: str) -> Status:
    doc = _mapping(raw, "status response")

    def num(*names: str) -> int:
        return to_int(_field(doc, *names), names[0])

    errors = _list(_field(doc, "errors", default=None), "errors")
    archive = doc.get("raftkvArchive")
    lag_entries = lag_seconds = None
    if isinstance(archive, dict):  # raftkv's extra field (a member with --archive-url)
        lag_entries = to_int(archive.get("lagEntries", 0), "raftkvArchive.lagEntries")
        try:
            lag_seconds = float(archive.get("lagSeconds", 0))
        except (TypeError, ValueError):
            raise ResponseFormatError("raftkvArchive.lagSeconds is not a number") from None
    return Status(
        endpoint=endpoint,
        header=decode_header(doc.get("header")),
        version=str(doc.get("version") or ""),
        db_size_bytes=num("db_size", "dbSize"),
        db_size_in_use_bytes=num("db_size_in_use", "dbSizeInUse"),
        leader=num("leader"),
        raft_index=num("raft_index", "raftIndex"),
        raft_term=num("raft_term", "raftTerm"),
        raft_applied_index=num("raft_applied_index", "raftAppliedIndex"),
        is_learner=_to_bool(_field(doc, "is_learner", "isLearner"), "is_learner"),
        errors=tuple(str(e) for e in errors),
        db_size_quota_bytes=num("db_size_quota", "dbSizeQuota"),
        archive_lag_entries=lag_entries,
        archive_lag_seconds=lag_seconds,
    )


def decode_member(raw: Any) -> Member:
    doc = _mapping(raw, "member")

    def urls(*names: str) -> tuple[str, ...]:
        return tuple(str(u) for u in _list(_field(doc, *names), names[0]))

    if "ID" in doc:  # etcd's gateway: decimal
        member_id = to_int(doc["ID"], "ID")
    elif isinstance(doc.get("id"), str):  # raftkv's /v1/status: hex, as etcdctl prints ids
        try:
            member_id = int(doc["id"], 16)
        except ValueError:
            raise ResponseFormatError(f"field 'id': bad hex member id {doc['id']!r}") from None
    else:
        member_id = to_int(doc.get("id"), "id")
    return Member(
        id=member_id,
        name=str(doc.get("name") or ""),
        peer_urls=urls("peer_urls", "peerURLs"),
        client_urls=urls("client_urls", "clientURLs"),
        is_learner=_to_bool(_field(doc, "is_learner", "isLearner"), "is_learner"),
    )


def decode_members(raw: Any) -> tuple[Member, ...]:
    """Members from ``/v3/cluster/member/list`` (etcd: ``ID`` in decimal, ``peerURLs``,
    ``clientURLs``) or raftkv's ``GET /v1/status`` (``id`` as a hex string, ``peer_urls``,
    ``client_urls``); both carry ``members``."""
    doc = _mapping(raw, "member list")
    return tuple(decode_member(m) for m in _list(doc.get("members"), "members"))
