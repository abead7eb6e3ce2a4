"""A small builder for etcd transactions: compares, then the ``then`` or the ``otherwise`` ops.

Usage::

    from kvserver.client import Cmp, Op, Txn

    txn = (Txn()
           .when(Cmp.version("lock") == 0)                # the key does not exist
           .then(Op.put("lock", "me"), Op.get("lock"))
           .otherwise(Op.get("lock")))
    result = await client.txn(txn)                      # TxnResult
    if result.succeeded: ...

``Cmp.<target>(key)`` names what to compare (``value``, ``version``, ``create_revision``,
``mod_revision``, ``lease``); compare it with ``==``, ``!=``, ``<``, ``>`` (or ``.eq()``,
``.ne()``, ``.lt()``, ``.gt()``) to get a ``Compare``. A compare with ``prefix=True`` or a
``range_end`` must hold for every key in the range (etcd ≥ 3.3). ``Op.put/get/delete/txn``
build the operations. Keys and values may be ``str`` (encoded UTF-8) or ``bytes``.

The results come back in ``TxnResult.responses``, one per op of the branch that ran.
The builder produces the store's own ``TxnRequest`` (``to_request()``); ``client.txn`` accepts
either.
"""

from __future__ import annotations

from typing import Any

from kvserver.kvpb.kv import (
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
    prefix_range_end,
)

MAX_TXN_OPS = 128  # etcd's default --max-txn-ops

KeyLike = str | bytes


def as_bytes(data: KeyLike, what: str = "key") -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} must be str or bytes, not {type(data).__name__}")


def key_range(key: KeyLike, range_end: KeyLike | None, prefix: bool) -> tuple[bytes, bytes]:
    """(key, range_end) in etcd's convention from the user's key/range_end/prefix options."""
    k = as_bytes(key)
    if prefix and range_end is not None:
        raise ValueError("give either prefix=True or range_end, not both")
    if prefix:
        # etcdctl's `get "" --prefix`: the empty prefix means every key, which etcd spells
        # key = range_end = "\0" (an empty key is refused as "key is not provided").
        return (k, prefix_range_end(k)) if k else (b"\0", b"\0")
    return k, as_bytes(range_end, "range_end") if range_end is not None else b""


class CompareOperand:
    """One side of a txn compare: a target of a key (range). Compare it to get a ``Compare``."""

    __slots__ = ("_target", "_key", "_range_end")
    __hash__ = None  # type: ignore[assignment]  # == builds a Compare, not a bool

    def __init__(
        self,
        target: CompareTarget,
        key: KeyLike,
        *,
        range_end: KeyLike | None = None,
        prefix: bool = False,
    ) -> None:
        self._target = target
        self._key, self._range_end = key_range(key, range_end, prefix)

    def _build(self, result: CompareResult, other: object) -> Compare:
        field: dict[str, Any]
        if self._target == CompareTarget.VALUE:
            field = {"value": as_bytes(other, "compared value")}  # type: ignore[arg-type]
        else:
            if isinstance(other, bool) or not isinstance(other, int):
                raise TypeError(
                    f"compare {self._target.name} with an int, not {type(other).__name__}"
                )
            name = {
                CompareTarget.VERSION: "version",
                CompareTarget.CREATE: "create_revision",
                CompareTarget.MOD: "mod_revision",
                CompareTarget.LEASE: "lease",
            }[self._target]
            field = {name: other}
        return Compare(
            result=result, target=self._target, key=self._key, range_end=self._range_end, **field
        )

    def eq(self, other: object) -> Compare:
        return self._build(CompareResult.EQUAL, other)

    def ne(self, other: object) -> Compare:
        return self._build(CompareResult.NOT_EQUAL, other)

    def lt(self, other: object) -> Compare:
        return self._build(CompareResult.LESS, other)

    def gt(self, other: object) -> Compare:
        return self._build(CompareResult.GREATER, other)

    __eq__ = eq  # type: ignore[assignment]
    __ne__ = ne  # type: ignore[assignment]
    __lt__ = lt
    __gt__ = gt


class Cmp:
    """Compare targets: ``Cmp.version(key) == 0`` and friends."""

    @staticmethod
    def value(key: KeyLike, **range_opts) -> CompareOperand:
        return CompareOperand(CompareTarget.VALUE, key, **range_opts)

    @staticmethod
    def version(key: KeyLike, **range_opts) -> CompareOperand:
        return CompareOperand(CompareTarget.VERSION, key, **range_opts)

    @staticmethod
    def create_revision(key: KeyLike, **range_opts) -> CompareOperand:
        return CompareOperand(CompareTarget.CREATE, key, **range_opts)

    @staticmethod
    def mod_revision(key: KeyLike, **range_opts) -> CompareOperand:
        return CompareOperand(CompareTarget.MOD, key, **range_opts)

    @staticmethod
    def lease(key: KeyLike, **range_opts) -> CompareOperand:
        return CompareOperand(CompareTarget.LEASE, key, **range_opts)


class Op:
    """Txn operations (and the requests the client's own calls send)."""

    @staticmethod
    def put(key: KeyLike, value: KeyLike, *, lease: int = 0, prev_kv: bool = False) -> RequestOp:
        return RequestOp(
            request_put=PutRequest(
                key=as_bytes(key), value=as_bytes(value, "value"), lease=lease, prev_kv=prev_kv
            )
        )

    @staticmethod
    def get(
        key: KeyLike,
        *,
        range_end: KeyLike | None = None,
        prefix: bool = False,
        limit: int = 0,
        revision: int = 0,
        keys_only: bool = False,
        count_only: bool = False,
        sort_order: SortOrder | str = SortOrder.NONE,
        sort_target: SortTarget | str = SortTarget.KEY,
    ) -> RequestOp:
        return RequestOp(
            request_range=range_request(
                key,
                range_end=range_end,
                prefix=prefix,
                limit=limit,
                revision=revision,
                keys_only=keys_only,
                count_only=count_only,
                sort_order=sort_order,
                sort_target=sort_target,
            )
        )

    @staticmethod
    def delete(
        key: KeyLike,
        *,
        range_end: KeyLike | None = None,
        prefix: bool = False,
        prev_kv: bool = False,
    ) -> RequestOp:
        k, end = key_range(key, range_end, prefix)
        return RequestOp(
            request_delete_range=DeleteRangeRequest(key=k, range_end=end, prev_kv=prev_kv)
        )

    @staticmethod
    def txn(txn: Txn | TxnRequest) -> RequestOp:
        return RequestOp(request_txn=txn.to_request() if isinstance(txn, Txn) else txn)


def _enum(kind, raw):
    if isinstance(raw, str):
        try:
            return kind[raw.upper()]
        except KeyError:
            names = ", ".join(m.name.lower() for m in kind)
            raise ValueError(f"unknown {kind.__name__} {raw!r}: want one of {names}") from None
    return kind(raw)


def range_request(
    key: KeyLike,
    *,
    range_end: KeyLike | None = None,
    prefix: bool = False,
    limit: int = 0,
    revision: int = 0,
    serializable: bool = False,
    keys_only: bool = False,
    count_only: bool = False,
    sort_order: SortOrder | str = SortOrder.NONE,
    sort_target: SortTarget | str = SortTarget.KEY,
) -> RangeRequest:
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if revision < 0:
        raise ValueError(f"revision must be >= 0, got {revision}")
    k, end = key_range(key, range_end, prefix)
    return RangeRequest(
        key=k,
        range_end=end,
        limit=limit,
        revision=revision,
        serializable=serializable,
        keys_only=keys_only,
        count_only=count_only,
        sort_order=_enum(SortOrder, sort_order),
        sort_target=_enum(SortTarget, sort_target),
    )


class Txn:
    """Builder: ``Txn().when(*compares).then(*ops).otherwise(*ops)``; each call appends and
    returns the builder. All compares must hold for ``then`` to run."""

    __slots__ = ("_compare", "_success", "_failure")

    def __init__(self) -> None:
        self._compare: list[Compare] = []
        self._success: list[RequestOp] = []
        self._failure: list[RequestOp] = []

    def when(self, *compares: Compare) -> Txn:
        for c in compares:
            if not isinstance(c, Compare):
                raise TypeError(f"not a compare: {c!r} (build one with Cmp.version(k) == 0)")
        self._compare.extend(compares)
        return self

    def then(self, *ops: RequestOp) -> Txn:
        self._success.extend(_check_ops(ops))
        return self

    def otherwise(self, *ops: RequestOp) -> Txn:
        self._failure.extend(_check_ops(ops))
        return self

    # Aliases read like etcd's Go client: Txn().If(...).Then(...).Else(...)
    if_ = when
    else_ = otherwise

    def to_request(self) -> TxnRequest:
        if max(len(self._success), len(self._failure)) > MAX_TXN_OPS:
            raise ValueError(f"a txn branch has more than {MAX_TXN_OPS} operations")
        return TxnRequest(
            compare=tuple(self._compare), success=tuple(self._success), failure=tuple(self._failure)
        )

    def __repr__(self) -> str:
        return (
            f"Txn(compare={len(self._compare)}, then={len(self._success)}, "
            f"otherwise={len(self._failure)})"
        )


def _check_ops(ops: tuple[RequestOp, ...]) -> tuple[RequestOp, ...]:
    for op in ops:
        if not isinstance(op, RequestOp):
            raise TypeError(f"not a txn operation: {op!r} (build one with Op.put/get/delete)")
    return ops
