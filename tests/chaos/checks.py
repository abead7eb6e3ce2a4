"""The judgments of a chaos run, as pure functions of what was recorded (unit-tested alone).

- :func:`lost_writes` -- every acknowledged write ``(key, revision)`` must be a PUT event of
  the replicated history (a later overwrite does not hide it: the history keeps every
  revision, and the chaos cluster never compacts).
- :func:`watch_problems` -- a watcher's events must be in revision order, with no
  ``(revision, key)`` twice, and equal to the reference history up to the final revision
  (nothing missing, nothing extra, same values).
- :func:`replica_problems` -- every member's replay of the history must be identical.
- :func:`fencing_violations` -- replaying the history: each write of the lock's resource key
  carries the token of the lock key's *current* holder (its create revision), and tokens
  never go backwards. A write by a holder whose lock was already gone (lease expired, lock
  taken over) is an overlap.
- :func:`percentile` -- nearest-rank percentile (with fewer than 100 samples p99 is the max).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from tests.chaos.watchers import Event

MAX_EXAMPLES = 10


def lost_writes(acked: Iterable[tuple[str, int, str]], history: Sequence[Event]) -> list[str]:
    puts = {(key, rev) for rev, kind, key, _value, _create in history if kind == "PUT"}
    return [f"{workload}: {key}@{rev}" for key, rev, workload in acked if (key, rev) not in puts]


def watch_problems(
    name: str, events: Sequence[Event], reference: Sequence[Event], until_revision: int
) -> list[str]:
    problems = []
    seen: set[tuple[int, str]] = set()
    last = 0
    for ev in events:
        rev, key = ev[0], ev[2]
        if rev < last:
            problems.append(f"{name}: revision {rev} ({key}) after {last}: out of order")
        if (rev, key) in seen:
            problems.append(f"{name}: {key}@{rev} delivered twice")
        seen.add((rev, key))
        last = max(last, rev)
    got = [e for e in events if e[0] <= until_revision]
    if got != list(reference):
        missing = [e for e in reference if (e[0], e[2]) not in seen]
        extra = sorted(set(got) - set(reference))
        problems.append(
            f"{name}: {len(got)} events up to revision {until_revision}, reference "
            f"has {len(reference)}; missing {len(missing)} (e.g. "
            f"{missing[:3]}), extra/different {len(extra)} (e.g. {extra[:3]})"
        )
    return problems[:MAX_EXAMPLES]


def replica_problems(histories: dict[str, Sequence[Event]]) -> list[str]:
    names = sorted(histories)
    problems = []
    base = histories[names[0]]
    for other in names[1:]:
        h = histories[other]
        if list(h) != list(base):
            diff = next(
                (i for i, (a, b) in enumerate(zip(base, h, strict=False)) if a != b),
                min(len(base), len(h)),
            )
            problems.append(
                f"{other} differs from {names[0]} at event {diff}: "
                f"{h[diff] if diff < len(h) else 'end'} vs "
                f"{base[diff] if diff < len(base) else 'end'} "
                f"({len(h)} vs {len(base)} events)"
            )
    return problems


def fencing_violations(
    history: Sequence[Event], lock_key: str, resource_key: str
) -> tuple[int, list[str]]:
    """(number of fenced writes checked, violations)."""
    holder = 0  # create revision of the current lock key, 0 when free
    highest = 0
    checked = 0
    violations = []
    for rev, kind, key, value, create in history:
        if key == lock_key:
            holder = create if kind == "PUT" else 0
        elif key == resource_key and kind == "PUT":
            checked += 1
            try:
                token = int(value.split(":", 1)[0])
            except ValueError:
                violations.append(f"resource@{rev}: value {value!r} carries no token")
                continue
            if token != holder:
                violations.append(
                    f"resource@{rev} written with token {token} while the lock "
                    f"was {'free' if not holder else f'held by token {holder}'}"
                )
            if token < highest:
                violations.append(f"resource@{rev}: token {token} after token {highest}")
            highest = max(highest, token)
    return checked, violations[:MAX_EXAMPLES]


def percentile(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]
