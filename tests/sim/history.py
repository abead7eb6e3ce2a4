"""Client history of the simulation and an incremental check of linearizable reads.

The data: per key a register; every write puts a unique value (its op id), so a read result
names exactly one write (or none: the initial value). Times are simulation slots.

For a write w: ``inv(w)`` when the client first proposed it; ``applied(w)`` the first time
any node applied it (the write is committed then, so every later linearizable read must see
it or a newer write); ``done(w)`` when the client got its answer (the node it waits on
applied it); ``rev(w)`` the log index at which it took effect (dedup makes it unique).

For a completed read r on key k returning write w (or nothing) at revision ``rev(r)``, with
``inv(r)`` and ``done(r)``, the checker requires:

1. No reading from the future: w exists, is a write to k, and ``inv(w) <= done(r)``.
2. Acknowledged writes are visible: for every write w' to k with ``applied(w') < inv(r)``,
   ``rev(w') <= rev(r)`` (a ReadIndex read served after its index was applied reflects every
   write committed before the read began; the initial value has revision 0).
3. Real-time order (pure linearizability, using only client-visible times): w must not be
   overwritten before r began, i.e. there is no write w' to k with ``done(w) < inv(w')`` and
   ``done(w') < inv(r)``: in every linearization w precedes w' precedes r, so r cannot see w.
   Incrementally: ``M(k, t)`` = max ``inv(w')`` over writes to k done before t; r is stale
   iff ``done(w) < M(k, inv(r))`` (for the initial value: iff any write to k was done before
   ``inv(r)``).
4. Reads do not go back in time: if read r1 on k completed before r began,
   ``rev(r) >= rev(r1)``.

Each condition is necessary for a linearizable register history whose writes take effect in
log order (which the safety checker verifies separately), so a failure is a real anomaly;
the check is not complete (it does not search all linearizations, as a Wing-Gong checker
would), but every bound is kept as a running maximum per key, O(1) per operation.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class LinearizabilityViolation(AssertionError):
    """A read returned a value no linearizable register could have returned."""


@dataclass(slots=True)
class _Write:
    op: int
    key: str
    inv: int
    applied: int | None = None
    done: int | None = None
    rev: int = 0


@dataclass(slots=True)
class _Read:
    rid: int
    key: str
    inv: int
    min_rev: int  # rule 2 bound, taken at inv(r)
    max_inv_done: int  # rule 3: M(k, inv(r)); -1 when no write to k was done before
    min_read_rev: int  # rule 4 bound


@dataclass(slots=True)
class _KeyState:
    max_applied_rev: int = 0
    max_inv_done: int = -1
    max_read_rev: int = 0
    # writes applied/done at the current slot are "before" only reads invoked later
    staged: list = field(default_factory=list)


class History:
    __slots__ = ("keys", "reads", "writes", "completed_reads", "now")

    def __init__(self) -> None:
        self.writes: dict[int, _Write] = {}
        self.reads: dict[int, _Read] = {}
        self.keys: dict[str, _KeyState] = {}
        self.completed_reads = 0
        self.now = 0

    def _key(self, key: str) -> _KeyState:
        ks = self.keys.get(key)
        if ks is None:
            ks = self.keys[key] = _KeyState()
        return ks

    def advance_to(self, now: int) -> None:
        """Move the clock; events of earlier slots become 'strictly before' from now on."""
        if now == self.now:
            return
        self.now = now
        for ks in self.keys.values():
            if ks.staged:
                for kind, value in ks.staged:
                    if kind == 0:
                        ks.max_applied_rev = max(ks.max_applied_rev, value)
                    elif kind == 1:
                        ks.max_inv_done = max(ks.max_inv_done, value)
                    else:
                        ks.max_read_rev = max(ks.max_read_rev, value)
                ks.staged.clear()

    # -- writes -------------------------------------------------------------------------
    def invoke_write(self, op: int, key: str) -> None:
        if op in self.writes:
            raise ValueError(f"write {op} invoked twice")
        self.writes[op] = _Write(op, key, self.now)
        self._key(key)

    def write_applied(self, op: int, rev: int) -> None:
        """A node applied the write (it is committed). Only the first apply counts."""
        w = self.writes[op]
        if w.applied is None:
            w.applied, w.rev = self.now, rev
            self.keys[w.key].staged.append((0, rev))
        elif w.rev != rev:
            raise LinearizabilityViolation(
                f"write {op} took effect at revision {rev} here, {w.rev} elsewhere"
            )

    def write_done(self, op: int) -> None:
        w = self.writes[op]
        if w.done is None:
            if w.applied is None:
                raise LinearizabilityViolation(f"write {op} acknowledged before any apply")
            w.done = self.now
            self.keys[w.key].staged.append((1, w.inv))

    def pending_writes(self) -> list[int]:
        return [op for op, w in self.writes.items() if w.done is None]

    # -- reads --------------------------------------------------------------------------
    def invoke_read(self, rid: int, key: str) -> None:
        ks = self._key(key)
        self.reads[rid] = _Read(
            rid, key, self.now, ks.max_applied_rev, ks.max_inv_done, ks.max_read_rev
        )

    def read_failed(self, rid: int) -> None:
        """A read that never completed constrains nothing."""
        self.reads.pop(rid, None)

    def read_done(self, rid: int, op: int | None, rev: int) -> None:
        r = self.reads.pop(rid)
        self.completed_reads += 1
        where = f"read {rid} of {r.key!r} (invoked at {r.inv}, done at {self.now})"
        if op is None:
            if rev != 0:
                raise LinearizabilityViolation(f"{where}: initial value at revision {rev}")
            if r.max_inv_done >= 0:
                raise LinearizabilityViolation(
                    f"{where} saw the initial value after a write to it was acknowledged"
                )
        else:
            w = self.writes.get(op)
            if w is None or w.key != r.key or w.inv > self.now:
                raise LinearizabilityViolation(f"{where} saw write {op} that was never invoked")
            if w.rev != rev:
                raise LinearizabilityViolation(
                    f"{where} saw write {op} at revision {rev}, it took effect at {w.rev}"
                )
            if w.done is not None and w.done < r.max_inv_done:
                raise LinearizabilityViolation(
                    f"{where} saw write {op} (done at {w.done}), overwritten by a write "
                    f"invoked at {r.max_inv_done} and acknowledged before the read began"
                )
        if rev < r.min_rev:
            raise LinearizabilityViolation(
                f"{where} saw revision {rev}, but a write at revision {r.min_rev} was "
                f"committed and applied before the read began (stale read)"
            )
        if rev < r.min_read_rev:
            raise LinearizabilityViolation(
                f"{where} saw revision {rev}, an earlier completed read saw {r.min_read_rev}"
            )
        self.keys[r.key].staged.append((2, rev))
