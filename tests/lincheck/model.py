"""The sequential specification a history is checked against.

A model is any object with these methods (a structural ``Protocol``, no base class needed):

- ``init() -> state``: the state before any operation.
- ``step(state, input, output) -> (ok, new_state)``: can ``input`` applied to ``state``
  return ``output``? If so, also the state afterwards. ``output is None`` means the outcome
  is unknown (a pending operation placed somewhere in the order): then ``ok`` must be true
  whenever the input can be applied at all. ``step`` must be pure and deterministic.
- ``partition(operations) -> list of sub-histories``: split a history into independent parts
  (P-compositionality, e.g. one per key) that are checked separately. A history is
  linearizable iff every part is, *provided* operations of different parts never constrain
  each other. Returning ``[list(operations)]`` is always correct. A model may drop operations
  that cannot matter (a pending read has no effect and any output would do).
- ``describe_operation(input, output) -> str`` and ``describe_state(state) -> str``: short
  human-readable text for explanations (``output is None`` for a pending operation).
- optional ``describe_partition(operations) -> str``: a title for one part ("key 'x'").
- optional ``is_observer(input, output) -> bool`` (asked only for completed operations):
  true if the operation only observes -- removing it from any sequence that ``step``
  accepts (from any state) leaves a sequence that is still accepted. A read is the typical
  observer. The checker then places an observer as soon as the current state accepts it
  *unchanged*, without trying other orders: any valid continuation stays valid with the
  observer moved to the front. Without this, ``r`` concurrent reads of one value are tried
  in up to ``2**r`` subsets. Answering False is always correct, just slower.

States must be hashable and two equal states must behave identically in every future
``step``: the checker memoizes ``(set of linearized operations, state)`` pairs it has already
explored.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

from tests.lincheck.history import Operation


class Model(Protocol):
    def init(self) -> Hashable: ...

    def step(self, state: Any, input: Any, output: Any) -> tuple[bool, Hashable]: ...

    def partition(self, operations: Sequence[Operation]) -> list[list[Operation]]: ...

    def describe_operation(self, input: Any, output: Any) -> str: ...

    def describe_state(self, state: Any) -> str: ...

    # optional: def describe_partition(self, operations) -> str
    # optional: def is_observer(self, input, output) -> bool
