"""Recording a concurrent history: operations with call and return times.

Contract
--------
An :class:`Operation` is one client request as seen from the outside: the time the client
*called* it (just before the request left), the time it *returned* (just after the response
arrived), the ``input`` (what was asked) and the ``output`` (what came back). Times are numbers
on one monotonic clock; only their order matters to the checker.

Three outcomes are recorded (``History.ok`` / ``info`` / ``fail``):

- ``ok``: the response arrived; ``ret`` is the receive time and ``output`` the response.
- ``info``: the outcome is unknown (timeout, connection reset, client crashed). The operation
  may or may not have taken effect, at any time after its call, so ``ret = INFINITY`` and
  ``output = None``. The checker may place it anywhere after its call -- including after every
  other operation, which is the same as "never applied".
- ``fail``: the request was *definitely not applied* (e.g. rejected by validation before it
  reached the log). It is dropped from the history. Mark a failure this way only when the
  server guarantees it; when in doubt use ``info``, which is always safe.

An operation invoked but never completed when :meth:`History.operations` is called counts as
``info``.

Times: the recorder uses ``time.monotonic_ns`` (integer nanoseconds). On Linux
``CLOCK_MONOTONIC`` is system-wide, so histories recorded by several processes on one host
can be merged with :func:`merge_operations`. Equal times are treated as overlapping by the
checker (a call at the same instant as another operation's return may be ordered either way),
which can only make it more permissive, never report a false violation.

The recorder is thread-safe (one lock around two dict updates) and non-blocking, so it can be
called from threads and from asyncio tasks alike. It is bounded: at most ``max_operations``
invocations, then :class:`HistoryError`.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

INFINITY = math.inf

DEFAULT_MAX_OPERATIONS = 1_000_000


class HistoryError(Exception):
    """Misuse of the recorder: unknown handle, double completion, too many operations."""


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation of a history. ``ret == INFINITY`` (and ``output is None``) when pending."""

    op_id: int
    client_id: Hashable
    call: int | float
    ret: int | float  # invariant: call <= ret; INFINITY when the outcome is unknown
    input: Any
    output: Any  # invariant: None iff ret == INFINITY

    def __post_init__(self) -> None:
        if not self.call <= self.ret:
            raise ValueError(f"operation {self.op_id}: return {self.ret} before call {self.call}")
        if self.ret == INFINITY and self.output is not None:
            raise ValueError(f"operation {self.op_id}: a pending operation has no output")
        if self.ret != INFINITY and self.output is None:
            raise ValueError(f"operation {self.op_id}: a completed operation needs an output")

    @property
    def pending(self) -> bool:
        """True when the outcome is unknown (the operation may or may not have applied)."""
        return self.ret == INFINITY


@dataclass(frozen=True, slots=True)
class OpHandle:
    """What :meth:`History.invoke` returns; pass it back to ``ok``/``info``/``fail``."""

    op_id: int
    client_id: Hashable


class History:
    """A thread-safe recorder of a concurrent history (see the module docstring)."""

    def __init__(
        self,
        clock: Callable[[], int | float] = time.monotonic_ns,
        *,
        max_operations: int = DEFAULT_MAX_OPERATIONS,
    ) -> None:
        self._clock = clock
        self._max_operations = max_operations
        self._lock = threading.Lock()
        self._ids = itertools.count()
        # op_id -> (client_id, call, input) for operations still in flight
        self._open: dict[int, tuple[Hashable, int | float, Any]] = {}
        self._done: dict[int, Operation] = {}
        self._failed = 0

    def invoke(self, client_id: Hashable, input: Any) -> OpHandle:
        """Record a call; read the clock *before* sending the request (this does)."""
        call = self._clock()
        with self._lock:
            op_id = next(self._ids)
            if op_id >= self._max_operations:
                raise HistoryError(f"more than {self._max_operations} operations recorded")
            self._open[op_id] = (client_id, call, input)
        return OpHandle(op_id, client_id)

    def ok(self, handle: OpHandle, output: Any) -> Operation:
        """Record a response; call it right after the response arrived."""
        if output is None:
            raise HistoryError("ok() needs an output; use info() for an unknown outcome")
        ret = self._clock()
        with self._lock:
            client_id, call, input = self._take(handle)
            op = Operation(handle.op_id, client_id, call, ret, input, output)
            self._done[handle.op_id] = op
        return op

    def info(self, handle: OpHandle) -> Operation:
        """Record an unknown outcome: it may have applied, at any time after the call."""
        with self._lock:
            client_id, call, input = self._take(handle)
            op = Operation(handle.op_id, client_id, call, INFINITY, input, None)
            self._done[handle.op_id] = op
        return op

    def fail(self, handle: OpHandle) -> None:
        """Record a definite failure: the operation certainly did not apply; it is dropped."""
        with self._lock:
            self._take(handle)
            self._failed += 1

    def record(self, client_id: Hashable, input: Any) -> Recording:
        """Context manager: ``with h.record(c, inp) as r: r.ok(out)``.

        Leaving the block without ``r.ok``/``r.fail`` -- by an exception or otherwise --
        records ``info`` (unknown outcome), the only safe default. Works in sync and async code.
        """
        return Recording(self, self.invoke(client_id, input))

    def _take(self, handle: OpHandle) -> tuple[Hashable, int | float, Any]:
        try:
            return self._open.pop(handle.op_id)
        except KeyError:
            state = "already completed" if handle.op_id in self._done else "unknown"
            raise HistoryError(f"operation {handle.op_id} is {state}") from None

    @property
    def failed_count(self) -> int:
        """How many operations were dropped by :meth:`fail`."""
        return self._failed

    def __len__(self) -> int:
        with self._lock:
            return len(self._open) + len(self._done)

    def operations(self) -> list[Operation]:
        """The history so far, by op id; operations still in flight count as pending."""
        with self._lock:
            ops = dict(self._done)
            for op_id, (client_id, call, input) in self._open.items():
                ops[op_id] = Operation(op_id, client_id, call, INFINITY, input, None)
        return [ops[k] for k in sorted(ops)]


class Recording:
    """One in-flight operation inside ``with History.record(...)``."""

    __slots__ = ("_history", "handle", "_done")

    def __init__(self, history: History, handle: OpHandle) -> None:
        self._history = history
        self.handle = handle
        self._done = False

    def ok(self, output: Any) -> None:
        self._history.ok(self.handle, output)
        self._done = True

    def info(self) -> None:
        self._history.info(self.handle)
        self._done = True

    def fail(self) -> None:
        self._history.fail(self.handle)
        self._done = True

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done:
            self.info()


def merge_operations(*histories: Iterable[Operation]) -> list[Operation]:
    """Concatenate histories recorded separately (e.g. one per client process).

    Op ids are renumbered; client ids are kept, so they must be distinct across the inputs.
    The times must come from one clock (``time.monotonic_ns`` on one host is).
    """
    merged: list[Operation] = []
    for ops in histories:
        for op in ops:
            merged.append(
                Operation(len(merged), op.client_id, op.call, op.ret, op.input, op.output)
            )
    return merged
