"""Stateless request checks: etcd's gRPC-layer validation (api/v3rpc/key.go).

Contract: ``validate_request(req)`` raises an ``InvalidArgumentError`` (subclass) with etcd's
text for a request etcd rejects before proposing it, and returns ``None`` otherwise. It reads no
store state, so the HTTP layer calls it before proposing (bad input never reaches the log) and
the store calls it again when applying (an entry in the log is never trusted to be valid).

Checks, in etcd's order:
- range / put / delete-range: non-empty ``key`` (``etcdserver: key is not provided``);
  put: ``ignore_value`` with a value, ``ignore_lease`` with a lease; range: a known sort
  order and sort target (``etcdserver: invalid sort option``, etcd >= 3.6's check).
- txn: at most ``max_txn_ops`` compares / success ops / failure ops per level (a nested txn
  gets the remainder, as etcd), non-empty compare keys, each op checked; an op with no request
  set is ``etcdserver: key not found`` (etcd's "empty op"); then etcd's ``checkIntervals``:
  within the success list and within the failure list, a key may be put at most once and may
  not be both put and deleted (``etcdserver: duplicate key given in txn request``); puts in a
  nested txn's success and failure lists may repeat each other (only one branch runs).

One deliberate difference from etcd: a delete with ``range_end == b"\\0"`` (every key >= key)
counts as covering all keys >= key in the overlap check. etcd treats that ``"\\0"`` literally
there (an empty interval), so it lets a txn put a key that the same txn deletes, which can
even panic etcd (``ignore_value`` after such a delete). Rejecting it keeps every key written
at most once per revision, an invariant the store relies on.

Type checks (bytes fields are ``bytes``, integer fields are ints within int64) guard the
store against a wrongly built request; they raise ``InvalidArgumentError`` too.
"""

from __future__ import annotations

from kvserver.kvpb.errors import (
    MSG_DUPLICATE_KEY,
    MSG_EMPTY_KEY,
    MSG_INVALID_SORT_OPTION,
    MSG_LEASE_PROVIDED,
    MSG_TOO_MANY_OPS,
    MSG_VALUE_PROVIDED,
    InvalidArgumentError,
    KeyNotFoundError,
)
from kvserver.kvpb.kv import (
    CompactionRequest,
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    PutRequest,
    RangeRequest,
    RequestOp,
    SortOrder,
    SortTarget,
    TxnRequest,
)

DEFAULT_MAX_TXN_OPS = 128  # etcd's --max-txn-ops default

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_SORT_ORDERS = frozenset(int(v) for v in SortOrder)
_SORT_TARGETS = frozenset(int(v) for v in SortTarget)
_COMPARE_RESULTS = frozenset(int(v) for v in CompareResult)
_COMPARE_TARGETS = frozenset(int(v) for v in CompareTarget)


def _check_bytes(name: str, value: object) -> None:
    if type(value) is not bytes:
        raise InvalidArgumentError(
            f"raftkv: field {name} must be bytes, got {type(value).__name__}"
        )


def _check_int(name: str, value: object) -> None:
    if type(value) is not int and not isinstance(value, int):
        raise InvalidArgumentError(f"raftkv: field {name} must be an integer")
    if not _INT64_MIN <= value <= _INT64_MAX:  # type: ignore[operator]
        raise InvalidArgumentError(f"raftkv: field {name} is out of the int64 range")


_RANGE_INT_FIELDS = (
    "limit",
    "revision",
    "min_mod_revision",
    "max_mod_revision",
    "min_create_revision",
    "max_create_revision",
)


def check_range(r: RangeRequest) -> None:
    if type(r.key) is not bytes or type(r.range_end) is not bytes:
        _check_bytes("key", r.key)
        _check_bytes("range_end", r.range_end)
    if not r.key:
        raise InvalidArgumentError(MSG_EMPTY_KEY)
    if r.sort_order not in _SORT_ORDERS or r.sort_target not in _SORT_TARGETS:
        raise InvalidArgumentError(MSG_INVALID_SORT_OPTION)
    for v in (
        r.limit,
        r.revision,
        r.min_mod_revision,
        r.max_mod_revision,
        r.min_create_revision,
        r.max_create_revision,
    ):
        if type(v) is not int or not _INT64_MIN <= v <= _INT64_MAX:
            for name in _RANGE_INT_FIELDS:  # slow path: name the offending field
                _check_int(name, getattr(r, name))


def check_put(r: PutRequest) -> None:
    if type(r.key) is not bytes:
        _check_bytes("key", r.key)
    if type(r.value) is not bytes:
        _check_bytes("value", r.value)
    if not r.key:
        raise InvalidArgumentError(MSG_EMPTY_KEY)
    if r.lease:
        _check_int("lease", r.lease)
    if r.ignore_value and r.value:
        raise InvalidArgumentError(MSG_VALUE_PROVIDED)
    if r.ignore_lease and r.lease != 0:
        raise InvalidArgumentError(MSG_LEASE_PROVIDED)


def check_delete(r: DeleteRangeRequest) -> None:
    _check_bytes("key", r.key)
    _check_bytes("range_end", r.range_end)
    if not r.key:
        raise InvalidArgumentError(MSG_EMPTY_KEY)


def _check_compare(c: Compare) -> None:
    if type(c) is not Compare:
        raise InvalidArgumentError("raftkv: txn compare must be a Compare")
    _check_bytes("compare.key", c.key)
    _check_bytes("compare.range_end", c.range_end)
    _check_bytes("compare.value", c.value)
    if not c.key:
        raise InvalidArgumentError(MSG_EMPTY_KEY)
    if c.result not in _COMPARE_RESULTS or c.target not in _COMPARE_TARGETS:
        raise InvalidArgumentError("raftkv: unknown compare result or target")
    for name in ("version", "create_revision", "mod_revision", "lease"):
        _check_int("compare." + name, getattr(c, name))


def _check_op(op: RequestOp, max_txn_ops: int) -> None:
    if type(op) is not RequestOp:
        raise InvalidArgumentError("raftkv: txn operation must be a RequestOp")
    put = op.request_put
    if (
        type(put) is PutRequest
        and op.request_range is None
        and op.request_delete_range is None
        and op.request_txn is None
    ):  # the common op first: a put (what the general path below checks, in fewer steps)
        check_put(put)
        return
    set_fields = [
        f
        for f in (op.request_range, op.request_put, op.request_delete_range, op.request_txn)
        if f is not None
    ]
    if not set_fields:
        raise KeyNotFoundError()  # etcd: "empty op / nil entry"
    if len(set_fields) > 1:
        raise InvalidArgumentError("raftkv: a txn operation must set exactly one request")
    if op.request_range is not None:
        _typed(op.request_range, RangeRequest)
        check_range(op.request_range)
    elif op.request_put is not None:
        _typed(op.request_put, PutRequest)
        check_put(op.request_put)
    elif op.request_delete_range is not None:
        _typed(op.request_delete_range, DeleteRangeRequest)
        check_delete(op.request_delete_range)
    else:
        _typed(op.request_txn, TxnRequest)
        _check_txn_ops(op.request_txn, max_txn_ops)  # type: ignore[arg-type]


def _typed(obj: object, cls: type) -> None:
    if type(obj) is not cls:
        raise InvalidArgumentError(f"raftkv: expected {cls.__name__}, got {type(obj).__name__}")


def _check_txn_ops(r: TxnRequest, max_txn_ops: int) -> None:
    opc = max(len(r.compare), len(r.success), len(r.failure))
    if opc > max_txn_ops:
        raise InvalidArgumentError(MSG_TOO_MANY_OPS)
    for c in r.compare:
        _check_compare(c)
    for op in r.success:
        _check_op(op, max_txn_ops - opc)
    for op in r.failure:
        _check_op(op, max_txn_ops - opc)


# An interval of deleted keys: (begin, end) with end None for the single key ``begin`` and
# end b"" for "every key >= begin".
_Interval = tuple[bytes, bytes | None]


def _deletes_cover(dels: list[_Interval], k: bytes) -> bool:
    for begin, end in dels:
        if end is None:
            if k == begin:
                return True
        elif begin <= k and (not end or k < end):
            return True
    return False


def _check_intervals(ops: tuple[RequestOp, ...]) -> tuple[set[bytes], list[_Interval]]:
    """etcd's checkIntervals: returns (keys put, intervals deleted) for the parent level."""
    dels: list[_Interval] = []
    for op in ops:
        d = op.request_delete_range
        if d is None:
            continue
        if not d.range_end:
            dels.append((d.key, None))
        elif d.range_end == b"\0":
            dels.append((d.key, b""))
        else:
            dels.append((d.key, d.range_end))

    puts: set[bytes] = set()
    for op in ops:
        t = op.request_txn
        if t is None:
            continue
        puts_then, dels_then = _check_intervals(t.success)
        puts_else, dels_else = _check_intervals(t.failure)
        for k in puts_then:
            if k in puts or _deletes_cover(dels, k):
                raise InvalidArgumentError(MSG_DUPLICATE_KEY)
            puts.add(k)
        for k in puts_else:
            if k in puts and k not in puts_then:
                raise InvalidArgumentError(MSG_DUPLICATE_KEY)
            if _deletes_cover(dels, k):
                raise InvalidArgumentError(MSG_DUPLICATE_KEY)
            puts.add(k)
        dels.extend(dels_then)
        dels.extend(dels_else)

    for op in ops:
        p = op.request_put
        if p is None:
            continue
        if p.key in puts or _deletes_cover(dels, p.key):
            raise InvalidArgumentError(MSG_DUPLICATE_KEY)
        puts.add(p.key)
    return puts, dels


def check_txn(r: TxnRequest, max_txn_ops: int = DEFAULT_MAX_TXN_OPS) -> None:
    _check_txn_ops(r, max_txn_ops)
    # Overlap checks after the size checks (etcd: avoids quadratic work on huge requests).
    _check_intervals(r.success)
    _check_intervals(r.failure)


def check_compaction(r: CompactionRequest) -> None:
    _check_int("revision", r.revision)


def validate_request(req: object, max_txn_ops: int = DEFAULT_MAX_TXN_OPS) -> None:
    """Raise ``InvalidArgumentError`` if etcd would reject ``req`` before proposing it."""
    kind = type(req)
    if kind is PutRequest:
        check_put(req)  # type: ignore[arg-type]
    elif kind is RangeRequest:
        check_range(req)  # type: ignore[arg-type]
    elif kind is DeleteRangeRequest:
        check_delete(req)  # type: ignore[arg-type]
    elif kind is TxnRequest:
        check_txn(req, max_txn_ops)  # type: ignore[arg-type]
    elif kind is CompactionRequest:
        check_compaction(req)  # type: ignore[arg-type]
    else:
        raise InvalidArgumentError(f"raftkv: unknown request type {kind.__name__}")
