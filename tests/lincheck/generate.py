"""Random key-value histories that are linearizable by construction.

Each client issues operations one after another on its own timeline (think time, then a call,
then a latency), so clients overlap. Every operation gets a *linearization point* inside its
interval; the operations are then executed in linearization-point order against a plain dict
with an etcd-like global revision counter, and the outputs are what that execution returned.
Ordering by points inside the intervals respects real time, so the history is linearizable.

A pending operation (``pending_fraction``) models a request that timed out: its point may lie
long after the client gave up, or it never applies at all; the client then continues under a
new client id. Its output is unknown. ``crashes`` models a leader being killed: at that many
random instants every operation in flight loses its response (and applies or not, at random).

Values are unique (``"v<n>"``), so :func:`impossible_read` -- a completed get changed to read a
value nobody wrote -- always makes the history non-linearizable.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, replace

from tests.lincheck import kv
from tests.lincheck.history import INFINITY, Operation
from tests.lincheck.kv import KvInput, KvOpKind, KvOutput

NEVER_WRITTEN = "never-written"


@dataclass(frozen=True, slots=True)
class _Planned:
    seq: int
    client_id: int
    call: int
    ret: int | float
    point: int | None  # None: a pending operation that never applies
    input: KvInput


def generate_kv_history(
    rng: random.Random,
    *,
    operations: int,
    keys: int,
    clients: int,
    pending_fraction: float = 0.0,
    crashes: int = 0,
    revisions: bool = True,
    cas_fraction: float = 0.08,
    delete_fraction: float = 0.07,
    put_fraction: float = 0.35,
    max_think: int = 3,
    max_latency: int = 20,
) -> list[Operation]:
    """A linearizable history of ``operations`` operations (see the module docstring)."""
    key_names = [f"k{i}" for i in range(keys)]
    recent: dict[str, list[str]] = {k: [] for k in key_names}  # for plausible CAS expectations
    timeline = [(0, c) for c in range(clients)]  # (time the client is free, client id)
    heapq.heapify(timeline)
    next_client = clients
    values = 0
    planned: list[_Planned] = []
    for seq in range(operations):
        free_at, client = heapq.heappop(timeline)
        call = free_at + rng.randint(0, max_think)
        latency = rng.randint(1, max_latency)
        key = rng.choice(key_names)
        roll = rng.random()
        if roll < put_fraction:
            values += 1
            inp = kv.put(key, f"v{values}")
            recent[key].append(f"v{values}")
        elif roll < put_fraction + delete_fraction:
            inp = kv.delete(key)
        elif roll < put_fraction + delete_fraction + cas_fraction:
            values += 1
            expected = rng.choice([None, *recent[key][-3:]])
            inp = kv.cas(key, expected, f"v{values}")
            recent[key].append(f"v{values}")
        else:
            inp = kv.get(key)
        if rng.random() < pending_fraction:
            # timed out: may apply much later than the client stopped waiting, or never
            point = call + rng.randint(0, 5 * max_latency) if rng.random() < 0.5 else None
            planned.append(_Planned(seq, client, call, INFINITY, point, inp))
            heapq.heappush(timeline, (call + latency, next_client))
            next_client += 1
        else:
            point = call + rng.randint(0, latency)
            planned.append(_Planned(seq, client, call, call + latency, point, inp))
            heapq.heappush(timeline, (call + latency, client))
    if crashes:
        planned = _crash(rng, planned, crashes, max_latency)
    outputs = _execute(planned)
    return [
        Operation(
            p.seq,
            p.client_id,
            p.call,
            p.ret,
            p.input,
            None if p.ret == INFINITY else _strip(outputs[p.seq], revisions),
        )
        for p in planned
    ]


def _crash(
    rng: random.Random, planned: list[_Planned], crashes: int, max_latency: int
) -> list[_Planned]:
    """At ``crashes`` random instants every operation in flight loses its response."""
    end = max(p.call for p in planned)
    instants = [rng.randint(0, end) for _ in range(crashes)]
    out = []
    for p in planned:
        if p.ret != INFINITY and any(p.call <= t < p.ret for t in instants):
            point = p.point if rng.random() < 0.5 else None
            p = replace(p, ret=INFINITY, point=point)
        out.append(p)
    return out


def _execute(planned: list[_Planned]) -> dict[int, KvOutput]:
    store: dict[object, tuple[object, int]] = {}  # key -> (value, mod_revision)
    revision = 0
    outputs: dict[int, KvOutput] = {}
    applied = sorted((p for p in planned if p.point is not None), key=lambda p: (p.point, p.seq))
    for p in applied:
        inp = p.input
        current = store.get(inp.key)
        if inp.kind is KvOpKind.GET:
            outputs[p.seq] = kv.get_ok(*(current if current else (None, None)))
        elif inp.kind is KvOpKind.PUT:
            revision += 1
            store[inp.key] = (inp.value, revision)
            outputs[p.seq] = kv.put_ok(revision)
        elif inp.kind is KvOpKind.DELETE:
            if current:
                revision += 1
                del store[inp.key]
            outputs[p.seq] = kv.delete_ok(1 if current else 0)
        else:
            if (current[0] if current else None) == inp.expected:
                revision += 1
                store[inp.key] = (inp.value, revision)
                outputs[p.seq] = kv.cas_ok(True, revision)
            else:
                outputs[p.seq] = kv.cas_ok(False)
    return outputs


def _strip(output: KvOutput, revisions: bool) -> KvOutput:
    return output if revisions else replace(output, revision=None)


def impossible_read(ops: list[Operation], rng: random.Random) -> tuple[list[Operation], int]:
    """Change one completed get (chosen at random) to read a value nobody ever wrote.

    Returns the mutated history and the op id changed. Raises ValueError if there is no
    completed get.
    """
    gets = [op for op in ops if op.input.kind is KvOpKind.GET and not op.pending]
    if not gets:
        raise ValueError("no completed get to mutate")
    victim = rng.choice(gets)
    mutated = [
        replace(op, output=kv.get_ok(NEVER_WRITTEN)) if op.op_id == victim.op_id else op
        for op in ops
    ]
    return mutated, victim.op_id
