"""Wing–Gong linearizability search with Lowe's memoization, one partition at a time.

Algorithm
---------
Each partition's operations become a doubly linked list of *events* (one call event and one
return event per operation) sorted by time; at equal times calls come before returns, so
touching intervals count as overlapping (more permissive, never a false violation). A pending
operation's return event is at infinity, after everything.

Depth-first search from the head of the list:

- at a **call** event, try to linearize that operation next: if ``model.step`` accepts it and
  the configuration ``(set of linearized operations, new state)`` has not been explored before,
  push it on a stack, *lift* its call and return events out of the list and restart from the
  head; otherwise move on to the next event;
- at a **return** event, the operation it belongs to is not linearized yet, yet it finished
  before everything later in the list was called: no extension of the current order works, so
  pop the last linearized operation, put its events back, and try the event after its call.

The history is linearizable when the list becomes empty, and not linearizable when a return
event is reached with an empty stack. The configuration cache (Lowe, "Testing for
linearizability", 2017; used by porcupine) is what keeps this from being exponential in
practice: a configuration's future does not depend on how it was reached.

One addition to porcupine's search: **observers are placed greedily.** When the model marks
an operation as an observer (``is_observer``: a read; dropping it from any accepted sequence
leaves an accepted sequence), and it may come next and the current state accepts it without
change, it becomes the *only* option at that node. Exact, not a heuristic: from any valid
completion, moving that observer to the front gives another (it is minimal, so real time
allows it; the state is unchanged; the rest stays accepted because it is removable). If the
forced branch fails, so does the node. Without this, ``r`` reads of one value overlapping each
other are explored in up to ``2**r`` subsets before a violation can be reported
(``test_concurrent_reads_are_not_permuted``: 57 steps instead of 25,606).

Bounds: ``max_steps_per_partition`` counts ``model.step`` calls (deterministic, so tests can
assert on it); ``timeout_s`` is an optional wall-clock cap for the whole check. Exceeding
either yields ``UNKNOWN``, never a guess. Memory is bounded by the step count (one cache entry
per accepted step).

Soundness: ``ILLEGAL`` is reported only after the search has exhausted every order that
respects real time, so it is never reported for a linearizable history (given a correct model
and a correct partition function). ``OK`` comes with a witness order.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tests.lincheck.history import INFINITY, History, Operation
from tests.lincheck.model import Model

DEFAULT_MAX_STEPS_PER_PARTITION = 2_000_000

# bounds on the explanation text, so a huge history still prints a readable failure
_MAX_PREFIX_SHOWN = 25
_MAX_CANDIDATES_SHOWN = 20
_MAX_PARTITIONS_EXPLAINED = 3

_DEADLINE_CHECK_STEPS = 1024  # how often the search looks at the clock

_END = -1  # "no next event" in the linked list; index 0 is the head sentinel


class Verdict(enum.Enum):
    OK = "ok"
    ILLEGAL = "illegal"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Candidate:
    """An operation that could have been linearized right after the prefix."""

    operation: Operation
    accepted: bool  # model.step accepted it in the state after the prefix


@dataclass(frozen=True, slots=True)
class Counterexample:
    """Where the deepest branch of the search got stuck."""

    prefix: tuple[Operation, ...]  # longest linearizable prefix found, in order
    state: Hashable  # model state after the prefix
    blocked: Operation  # not placed; returned before the ops outside `candidates` were called
    candidates: tuple[Candidate, ...]  # every operation that could go next (blocked included)


@dataclass(frozen=True, slots=True)
class PartitionResult:
    title: str
    operations: tuple[Operation, ...]
    verdict: Verdict
    steps: int  # model.step calls
    cache_size: int  # configurations memoized
    linearization: tuple[Operation, ...] | None  # a witness order when OK
    counterexample: Counterexample | None  # when ILLEGAL (also when UNKNOWN, if any dead end)


@dataclass(frozen=True, slots=True)
class CheckResult:
    verdict: Verdict
    partitions: tuple[PartitionResult, ...]
    steps: int  # model.step calls over all partitions
    operation_count: int  # operations handed to the checker (before partitioning)
    explanation: str  # human-readable; print it when a test fails

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK

    def __str__(self) -> str:
        return self.explanation


@dataclass(frozen=True, slots=True)
class _Search:
    verdict: Verdict
    steps: int
    cache_size: int
    order: list[int] | None
    counterexample: Counterexample | None


def check(
    model: Model,
    history: History | Iterable[Operation],
    *,
    max_steps_per_partition: int = DEFAULT_MAX_STEPS_PER_PARTITION,
    timeout_s: float | None = None,
) -> CheckResult:
    """Is ``history`` linearizable with respect to ``model``? Every partition is checked."""
    ops = history.operations() if isinstance(history, History) else list(history)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    describe_partition = getattr(model, "describe_partition", None)
    results: list[PartitionResult] = []
    for index, part in enumerate(model.partition(ops)):
        title = describe_partition(part) if describe_partition else f"partition {index}"
        if deadline is not None and time.monotonic() >= deadline:
            search = _Search(Verdict.UNKNOWN, 0, 0, None, None)
        else:
            search = _search(model, part, max_steps_per_partition, deadline)
        order = search.order
        results.append(
            PartitionResult(
                title=title,
                operations=tuple(part),
                verdict=search.verdict,
                steps=search.steps,
                cache_size=search.cache_size,
                linearization=None if order is None else tuple(part[i] for i in order),
                counterexample=search.counterexample,
            )
        )
    verdicts = {r.verdict for r in results}
    if Verdict.ILLEGAL in verdicts:
        verdict = Verdict.ILLEGAL
    elif Verdict.UNKNOWN in verdicts:
        verdict = Verdict.UNKNOWN
    else:
        verdict = Verdict.OK
    partitions = tuple(results)
    origin = min((op.call for op in ops), default=0)
    return CheckResult(
        verdict=verdict,
        partitions=partitions,
        steps=sum(r.steps for r in results),
        operation_count=len(ops),
        explanation=_explain(model, verdict, partitions, len(ops), origin, max_steps_per_partition),
    )


def assert_linearizable(
    model: Model, history: History | Iterable[Operation], **kwargs: Any
) -> CheckResult:
    """``check`` and raise ``AssertionError`` with the explanation unless the verdict is OK."""
    result = check(model, history, **kwargs)
    if not result.ok:
        raise AssertionError(result.explanation)
    return result


def _search(
    model: Model, ops: Sequence[Operation], max_steps: int, deadline: float | None
) -> _Search:
    n = len(ops)
    if n == 0:
        return _Search(Verdict.OK, 0, 0, [], None)
    events = sorted(
        [(op.call, 0, i) for i, op in enumerate(ops)] + [(op.ret, 1, i) for i, op in enumerate(ops)]
    )
    size = 2 * n + 1
    nxt = list(range(1, size + 1))
    nxt[-1] = _END
    prv = list(range(-1, size - 1))
    match = [0] * size  # call event -> its return event; 0 for return events and the head
    opi = [0] * size  # event -> operation index
    call_pos = [0] * n
    ret_pos = [0] * n
    for pos, (_time, is_return, i) in enumerate(events, 1):
        opi[pos] = i
        if is_return:
            ret_pos[i] = pos
        else:
            call_pos[i] = pos
    for i in range(n):
        match[call_pos[i]] = ret_pos[i]
    inputs = [op.input for op in ops]
    outputs = [op.output for op in ops]
    bits = [1 << i for i in range(n)]
    is_observer = getattr(model, "is_observer", None)
    observer = [
        is_observer is not None and not op.pending and is_observer(op.input, op.output)
        for op in ops
    ]
    step = model.step

    state = model.init()
    linearized = 0  # bitset of operation indexes
    cache: set[tuple[int, Hashable]] = set()
    # (call event, state before it, forced): forced = placed as the only option of its node
    calls: list[tuple[int, Hashable, bool]] = []
    steps = 0
    # one comparison per step covers both bounds: past `limit`, look at the step budget and
    # (only when there is a deadline) the clock
    limit = max_steps if deadline is None else min(max_steps, _DEADLINE_CHECK_STEPS)
    best_depth = -1
    best_prefix: list[int] = []
    best_blocked = -1
    best_state: Hashable = state

    def result(verdict: Verdict, order: list[int] | None = None) -> _Search:
        if best_blocked < 0:
            cx = None
        else:
            cx = _counterexample(
                model, ops, best_prefix, best_state, best_blocked, call_pos, ret_pos
            )
        return _Search(verdict, steps, len(cache), order, cx)

    e = nxt[0]
    arrived = True  # at a node for the first time: look for an observer to place greedily
    while True:
        if arrived:
            arrived = False
            # An observer (e.g. a read) that the current state accepts without changing it can
            # go first: any valid order continuing from here stays valid with it moved to the
            # front. So it is this node's only option -- concurrent reads are not permuted.
            g = nxt[0]
            while match[g]:
                i = opi[g]
                if observer[i]:
                    steps += 1
                    if steps > limit:
                        if steps > max_steps or time.monotonic() > deadline:  # type: ignore[operator]
                            steps -= 1
                            return result(Verdict.UNKNOWN)
                        limit = min(max_steps, steps + _DEADLINE_CHECK_STEPS)
                    ok, new_state = step(state, inputs[i], outputs[i])
                    if ok and new_state == state:
                        break
                g = nxt[g]
            if match[g]:  # found one
                new_linearized = linearized | bits[i]
                config = (new_linearized, state)
                if config in cache:  # explored before, without success: this node fails too
                    e = g
                    while match[e]:
                        e = nxt[e]
                else:
                    cache.add(config)
                    calls.append((g, state, True))
                    linearized = new_linearized
                    _lift(nxt, prv, g, match[g])
                    e = nxt[0]
                    if e == _END:
                        return result(Verdict.OK, [opi[c] for c, _, _ in calls])
                    arrived = True
                    continue
        r = match[e]
        if r:  # a call event: try to linearize its operation next
            steps += 1
            if steps > limit:
                if steps > max_steps or time.monotonic() > deadline:  # type: ignore[operator]
                    steps -= 1
                    return result(Verdict.UNKNOWN)
                limit = min(max_steps, steps + _DEADLINE_CHECK_STEPS)
            i = opi[e]
            ok, new_state = step(state, inputs[i], outputs[i])
            if ok:
                new_linearized = linearized | bits[i]
                config = (new_linearized, new_state)
                if config not in cache:
                    cache.add(config)
                    calls.append((e, state, False))
                    state = new_state
                    linearized = new_linearized
                    _lift(nxt, prv, e, r)
                    e = nxt[0]
                    if e == _END:
                        return result(Verdict.OK, [opi[c] for c, _, _ in calls])
                    arrived = True
                    continue
            e = nxt[e]
        else:  # a return event of an operation not linearized yet: backtrack
            depth = len(calls)
            if depth > best_depth:
                best_depth = depth
                best_prefix = [opi[c] for c, _, _ in calls]
                best_blocked = opi[e]
                best_state = state
            while True:
                if not calls:
                    return result(Verdict.ILLEGAL)
                e, state, forced = calls.pop()
                linearized ^= bits[opi[e]]
                _unlift(nxt, prv, e, match[e])
                if not forced:
                    break
                # a forced placement failed: its node has no other option, so it failed too
            e = nxt[e]


def _lift(nxt: list[int], prv: list[int], call: int, ret: int) -> None:
    """Take an operation's call and return events out of the linked list."""
    p = prv[call]
    q = nxt[call]
    nxt[p] = q
    prv[q] = p
    p = prv[ret]
    q = nxt[ret]
    nxt[p] = q
    if q != _END:
        prv[q] = p


def _unlift(nxt: list[int], prv: list[int], call: int, ret: int) -> None:
    """Put back the events of the operation lifted last (their own links were kept)."""
    p = prv[ret]
    q = nxt[ret]
    nxt[p] = ret
    if q != _END:
        prv[q] = ret
    p = prv[call]
    q = nxt[call]
    nxt[p] = call
    prv[q] = call


def _counterexample(
    model: Model,
    ops: Sequence[Operation],
    prefix: list[int],
    state: Hashable,
    blocked: int,
    call_pos: list[int],
    ret_pos: list[int],
) -> Counterexample:
    placed = set(prefix)
    # the operations that could go next: called before the blocked operation returned
    candidates = sorted(
        (j for j in range(len(ops)) if j not in placed and call_pos[j] < ret_pos[blocked]),
        key=call_pos.__getitem__,
    )
    return Counterexample(
        prefix=tuple(ops[i] for i in prefix),
        state=state,
        blocked=ops[blocked],
        candidates=tuple(
            Candidate(ops[j], model.step(state, ops[j].input, ops[j].output)[0]) for j in candidates
        ),
    )


def _time(t: int | float, origin: int | float) -> str:
    if t == INFINITY:
        return "never"
    d = t - origin
    return str(d) if isinstance(d, int) else f"{d:.6g}"


def _describe(model: Model, op: Operation, origin: int | float) -> str:
    return (
        f"#{op.op_id} client {op.client_id}: {model.describe_operation(op.input, op.output)}"
        f"  [call {_time(op.call, origin)}, return {_time(op.ret, origin)}]"
    )


def _explain(
    model: Model,
    verdict: Verdict,
    partitions: tuple[PartitionResult, ...],
    operation_count: int,
    origin: int | float,
    max_steps: int,
) -> str:
    steps = sum(p.steps for p in partitions)
    head = (
        f"linearizability: {verdict.name} -- {operation_count} operations in "
        f"{len(partitions)} partition(s), {steps} search steps"
    )
    if verdict is Verdict.OK:
        return head
    lines = [
        head,
        "(times are relative to the first call, in the history's clock units -- "
        "nanoseconds for History)",
    ]
    illegal = [p for p in partitions if p.verdict is Verdict.ILLEGAL]
    for p in illegal[:_MAX_PARTITIONS_EXPLAINED]:
        lines.append("")
        lines.extend(_explain_illegal(model, p, origin))
    if len(illegal) > _MAX_PARTITIONS_EXPLAINED:
        rest = ", ".join(p.title for p in illegal[_MAX_PARTITIONS_EXPLAINED:])
        lines.append(f"\nalso not linearizable: {rest}")
    unknown = [p for p in partitions if p.verdict is Verdict.UNKNOWN]
    for p in unknown[:_MAX_PARTITIONS_EXPLAINED]:
        depth = len(p.counterexample.prefix) if p.counterexample else 0
        lines.append(
            f"\n{p.title}: UNKNOWN -- search stopped after {p.steps} steps (budget "
            f"{max_steps} per partition, or the timeout) with {len(p.operations)} operations; "
            f"deepest prefix placed so far: {depth}. Raise the budget or shorten the history."
        )
    if len(unknown) > _MAX_PARTITIONS_EXPLAINED:
        lines.append(f"\n{len(unknown) - _MAX_PARTITIONS_EXPLAINED} more partitions UNKNOWN")
    return "\n".join(lines)


def _explain_illegal(model: Model, p: PartitionResult, origin: int | float) -> list[str]:
    cx = p.counterexample
    assert cx is not None, "an ILLEGAL partition always has a counterexample"
    lines = [
        f"{p.title}: NOT LINEARIZABLE ({len(p.operations)} operations, {p.steps} steps)",
        f"longest linearizable prefix found: {len(cx.prefix)} of {len(p.operations)} operations",
    ]
    shown = cx.prefix[-_MAX_PREFIX_SHOWN:]
    skipped = len(cx.prefix) - len(shown)
    if skipped:
        lines.append(f"    ... {skipped} earlier operations omitted")
    for n, op in enumerate(shown, skipped + 1):
        lines.append(f"    {n:4d}. {_describe(model, op, origin)}")
    lines.append(f"state after the prefix: {model.describe_state(cx.state)}")
    lines.append(f"cannot place: {_describe(model, cx.blocked, origin)}")
    lines.append(
        f"what could come next (called before #{cx.blocked.op_id} returned; everything else "
        f"must follow #{cx.blocked.op_id}) -- none leads to a valid order:"
    )
    for c in cx.candidates[:_MAX_CANDIDATES_SHOWN]:
        why = (
            "the model accepts it here, but every order continuing from it fails"
            if c.accepted
            else "the model rejects it in this state"
        )
        lines.append(f"    - {_describe(model, c.operation, origin)}: {why}")
    if len(cx.candidates) > _MAX_CANDIDATES_SHOWN:
        lines.append(f"    ... {len(cx.candidates) - _MAX_CANDIDATES_SHOWN} more")
    return lines
