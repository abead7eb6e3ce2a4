"""A key-value model: put, get, delete and compare-and-set, partitioned by key.

Inputs are :class:`KvInput` (build them with :func:`put`, :func:`get`, :func:`delete`,
:func:`cas`); outputs are :class:`KvOutput` (build them with :func:`put_ok`, :func:`get_ok`,
:func:`delete_ok`, :func:`cas_ok`). A value is any hashable except ``None``; ``None`` means
"absent" both in a read result and as the ``expected`` value of a CAS (create-if-absent).

Revisions are optional. When a response carries one, it is etcd's: a put (or successful CAS)
reports the revision it created, which becomes the key's ``mod_revision``; a get reports the
``mod_revision`` of what it read. Revisions are global in etcd, but a per-key partition can
only check the per-key consequences: revisions of successive writes of one key strictly
increase, and a read reports exactly the revision of the write it observed. These are
necessary conditions, so checking them per key never flags a legal history.

Per-key state: ``(value, mod_revision, floor)`` where ``value`` is ``None`` when absent,
``mod_revision`` is ``None`` when unknown (written by a pending put, or deleted), and
``floor`` is the largest revision known to have been created for this key (0 at first); any
later write of the key has a larger revision.

Partitioning drops pending gets: a read that never returned changes nothing and could have
returned anything.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from tests.lincheck.history import INFINITY, Operation

KvState = tuple[Hashable | None, int | None, int]


class KvOpKind(enum.Enum):
    PUT = "put"
    GET = "get"
    DELETE = "delete"
    CAS = "cas"


@dataclass(frozen=True, slots=True)
class KvInput:
    kind: KvOpKind
    key: Hashable
    value: Hashable | None = None  # PUT/CAS: the new value (never None)
    expected: Hashable | None = None  # CAS: required current value; None = key must be absent


@dataclass(frozen=True, slots=True)
class KvOutput:
    """A response. Fields not reported by the server stay None and are not checked."""

    value: Hashable | None = None  # GET: value read; None = absent
    revision: int | None = None  # PUT/CAS: revision created; GET: mod_revision of the value read
    deleted: int | None = None  # DELETE: number of keys deleted (0 or 1)
    succeeded: bool | None = None  # CAS: whether the comparison held and the write applied


def put(key: Hashable, value: Hashable) -> KvInput:
    if value is None:
        raise ValueError("a put needs a value (None means absent)")
    return KvInput(KvOpKind.PUT, key, value)


def get(key: Hashable) -> KvInput:
    return KvInput(KvOpKind.GET, key)


def delete(key: Hashable) -> KvInput:
    return KvInput(KvOpKind.DELETE, key)


def cas(key: Hashable, expected: Hashable | None, value: Hashable) -> KvInput:
    if value is None:
        raise ValueError("a CAS needs a new value (None means absent)")
    return KvInput(KvOpKind.CAS, key, value, expected)


def put_ok(revision: int | None = None) -> KvOutput:
    return KvOutput(revision=revision)


def get_ok(value: Hashable | None, revision: int | None = None) -> KvOutput:
    return KvOutput(value=value, revision=revision)


def delete_ok(deleted: int | None = None) -> KvOutput:
    return KvOutput(deleted=deleted)


def cas_ok(succeeded: bool | None, revision: int | None = None) -> KvOutput:
    return KvOutput(revision=revision, succeeded=succeeded)


_PUT = KvOpKind.PUT
_GET = KvOpKind.GET
_DELETE = KvOpKind.DELETE


class KvModel:
    """The sequential specification of one key-value map, partitioned by key.

    ``prune_unobserved_pending_writes`` (default on) drops pending writes that provably cannot
    matter (see :func:`_prune_unobserved_pending_writes`); it changes the cost, not the
    verdict. Each pending write left in a partition can double the search space of a
    non-linearizable history, so this is what keeps histories with many timeouts checkable.
    """

    def __init__(self, *, prune_unobserved_pending_writes: bool = True) -> None:
        self.prune_unobserved_pending_writes = prune_unobserved_pending_writes

    def init(self) -> KvState:
        return (None, None, 0)

    def step(self, state: KvState, input: KvInput, output: KvOutput | None) -> tuple[bool, KvState]:
        value, revision, floor = state
        kind = input.kind
        if kind is _GET:
            if output is None:
                return True, state
            if output.value != value:
                return False, state
            read_revision = output.revision
            if read_revision is None or value is None:
                return True, state
            if revision is None:
                # the value came from a write whose revision we did not learn: it is newer
                # than every revision known so far; the read teaches us which it was
                if read_revision > floor:
                    return True, (value, read_revision, read_revision)
                return False, state
            return read_revision == revision, state
        if kind is _PUT:
            return self._write(input.value, output, floor)
        if kind is _DELETE:
            deleted = None if output is None else output.deleted
            if deleted is not None and deleted != (0 if value is None else 1):
                return False, state
            return True, (None, None, floor)
        # CAS
        holds = value == input.expected
        succeeded = None if output is None else output.succeeded
        if succeeded is not None and succeeded != holds:
            return False, state
        if not holds:
            return True, state
        return self._write(input.value, output, floor)

    @staticmethod
    def _write(new_value: Hashable, output: KvOutput | None, floor: int) -> tuple[bool, KvState]:
        created = None if output is None else output.revision
        if created is None:
            return True, (new_value, None, floor)
        if created <= floor:
            return False, (new_value, None, floor)
        return True, (new_value, created, created)

    def is_observer(self, input: KvInput, output: KvOutput) -> bool:
        """Completed reads, failed CASes and deletes of nothing only observe the key.

        Dropping one from any sequence this model accepts leaves an accepted sequence: a
        failed CAS never changes the state; a ``deleted=0`` delete is accepted only when the
        key is absent (whose revision is always unknown), and leaves it so; a get leaves the
        state alone or, reading a value of unknown revision, learns that revision -- and the
        state without that knowledge accepts everything the one with it does (the revision
        checks only get looser).
        """
        kind = input.kind
        if kind is _GET:
            return True
        if kind is _DELETE:
            return output.deleted == 0
        if kind is KvOpKind.CAS:
            return output.succeeded is False
        return False

    def partition(self, operations: Sequence[Operation]) -> list[list[Operation]]:
        by_key: dict[Hashable, list[Operation]] = {}
        for op in operations:
            if op.output is None and op.input.kind is _GET:
                continue
            by_key.setdefault(op.input.key, []).append(op)
        if not self.prune_unobserved_pending_writes:
            return list(by_key.values())
        return [_prune_unobserved_pending_writes(ops) for ops in by_key.values()]

    def describe_operation(self, input: KvInput, output: KvOutput | None) -> str:
        kind = input.kind
        if kind is _PUT:
            call = f"put({input.key!r}, {input.value!r})"
        elif kind is _GET:
            call = f"get({input.key!r})"
        elif kind is _DELETE:
            call = f"delete({input.key!r})"
        else:
            call = f"cas({input.key!r}, {input.expected!r} -> {input.value!r})"
        if output is None:
            return f"{call} -> ? (unknown outcome)"
        parts: list[str] = []
        if kind is _GET:
            parts.append("absent" if output.value is None else repr(output.value))
        elif kind is _DELETE:
            parts.append("ok" if output.deleted is None else f"deleted={output.deleted}")
        elif kind is KvOpKind.CAS and output.succeeded is not None:
            parts.append("succeeded" if output.succeeded else "failed")
        else:
            parts.append("ok")
        if output.revision is not None:
            parts.append(f"rev={output.revision}")
        return f"{call} -> {' '.join(parts)}"

    def describe_state(self, state: Any) -> str:
        value, revision, _floor = state
        if value is None:
            return "absent"
        return repr(value) if revision is None else f"{value!r} (rev {revision})"

    def describe_partition(self, operations: Sequence[Operation]) -> str:
        return f"key {operations[0].input.key!r}" if operations else "no operations"


def _prune_unobserved_pending_writes(ops: list[Operation]) -> list[Operation]:
    """Drop the pending puts/CASes of one key whose effect no operation could depend on.

    A pending write W of value v can be dropped when (1) no completed get read v and no CAS
    expected v, and (2) no completed operation that returned after W was called observes the
    key's *presence* without its value: a delete reporting ``deleted=1`` or a CAS not known to
    have succeeded. Proof sketch: take any linearization that applies W. The state right after
    W holds v with an unknown revision and the same revision floor as before. By (1) the next
    operation on the key cannot be a completed get or a successful CAS; by (2) it cannot be a
    presence-observing delete or CAS; a delete with ``deleted=0`` needs absence. So W is
    followed by the end, by pending CASes that fail (move them to the end, unapplied), or by a
    put / unreported delete whose resulting state does not depend on W. Removing W therefore
    leaves a linearization of the rest; conversely any linearization without W is one where W
    "never applied". The verdict is the same either way.
    """
    pending_writes = [
        op for op in ops if op.output is None and op.input.kind in (_PUT, KvOpKind.CAS)
    ]
    if not pending_writes:
        return ops
    observed: set[Hashable] = set()
    latest_presence_observer = -INFINITY  # return time of the last presence-only observer
    for op in ops:
        kind = op.input.kind
        if kind is KvOpKind.CAS:
            observed.add(op.input.expected)
            if op.output is not None and op.output.succeeded is not True:
                latest_presence_observer = max(latest_presence_observer, op.ret)
        elif op.output is None:
            continue
        elif kind is _GET:
            observed.add(op.output.value)
        elif kind is _DELETE and op.output.deleted == 1:
            latest_presence_observer = max(latest_presence_observer, op.ret)
    drop = {
        id(op)
        for op in pending_writes
        if op.input.value not in observed and latest_presence_observer < op.call
    }
    return [op for op in ops if id(op) not in drop] if drop else ops
