"""Incremental safety checkers for the cluster simulation (Raft paper, figure 3).

The simulator reports what each node does, as it does it; every method here does O(1) work
per reported entry (a leader-completeness check is O(log) once per election), so checking
after every simulation step costs little. A broken property raises ``SafetyViolation``.

Properties (Raft paper section 5, figure 3):
- Election safety: at most one leader per term (``leader``).
- Votes: within one term a node's vote never changes; terms never go down, not even across
  a crash, because term and vote are persisted before anyone hears of them (``hard_state``).
- Log matching: every ``(index, term)`` that any node ever persisted has one entry and one
  predecessor term (``append``). By induction, two logs that hold the same ``(index, term)``
  are identical up to it, without ever comparing whole logs.
- Committed entries are permanent: the first time any node reports index i committed (its
  hard state commit covers i, or it applies i), the entry becomes the truth for i; any other
  report of i committed, any apply of i, and any overwrite of i on a node that has it
  committed must carry the same entry (``commit``, ``append``, ``apply``).
- Leader completeness: a new leader's log holds every entry known to be committed
  (``leader_log``). Sound because an entry committed before the election was committed by
  a leader of a lower term (a higher-term leader would need a quorum that already refuses
  the lower term's votes).
- State machine safety: every node applies contiguous indexes, only committed ones, and the
  same entry at each index; a CRC chain over the applied sequence must agree at every index,
  also for a node restored from a snapshot (``apply``, ``apply_snapshot``).
"""

from __future__ import annotations

from raft import Entry


class SafetyViolation(AssertionError):
    """A Raft safety property failed; the message names the property, node, index/term."""


class SafetyChecker:
    __slots__ = ("chain_at", "committed", "leaders", "log_sigs", "max_committed")

    def __init__(self) -> None:
        self.leaders: dict[int, int] = {}  # term -> leader id
        self.log_sigs: dict[tuple[int, int], tuple[Entry, int]] = {}  # (i, t) -> (e, prev t)
        self.committed: dict[int, Entry] = {}  # index -> the committed entry
        self.max_committed = 0
        self.chain_at: dict[int, int] = {}  # applied index -> chain after applying it

    # -- elections ----------------------------------------------------------------------
    def leader(self, node: int, term: int) -> None:
        other = self.leaders.setdefault(term, node)
        if other != node:
            raise SafetyViolation(f"election safety: nodes {other} and {node} lead term {term}")

    @staticmethod
    def hard_state(node: int, old_term: int, old_vote: int, term: int, vote: int) -> None:
        """Check a node's new (term, vote) against the last one it had (persisted or not)."""
        if term < old_term:
            raise SafetyViolation(f"node {node}: term went down {old_term} -> {term}")
        if term == old_term and old_vote != 0 and vote != old_vote:
            raise SafetyViolation(
                f"node {node}: vote changed within term {term}: {old_vote} -> {vote}"
            )

    def leader_log(self, node: int, term_at) -> None:
        """``term_at(i)`` is the new leader's log term at i (None: compacted, -1: missing)."""
        for index in range(1, self.max_committed + 1):
            want = self.committed.get(index)
            if want is None:
                continue
            got = term_at(index)
            if got is None:
                continue  # inside the leader's snapshot: committed there by construction
            if got != want.term:
                raise SafetyViolation(
                    f"leader completeness: node {node} leads without committed {want} "
                    f"(its log has term {got} at {index})"
                )

    # -- logs ---------------------------------------------------------------------------
    def append(self, node: int, prev_term: int, entries, commit: int) -> None:
        """A node persists ``entries`` after an entry of term ``prev_term``."""
        sigs = self.log_sigs
        committed = self.committed
        prev_index = entries[0].index - 1
        for e in entries:
            if e.index != prev_index + 1:
                raise SafetyViolation(f"node {node}: appended entries not contiguous at {e}")
            if e.term < prev_term:
                raise SafetyViolation(f"node {node}: term goes down in log at {e}")
            key = (e.index, e.term)
            seen = sigs.get(key)
            if seen is None:
                sigs[key] = (e, prev_term)
            elif seen[0] != e or seen[1] != prev_term:
                raise SafetyViolation(
                    f"log matching: node {node} has {e} after term {prev_term}, another log "
                    f"has {seen[0]} after term {seen[1]}"
                )
            if e.index <= commit:
                want = committed.get(e.index)
                if want is not None and want != e:
                    raise SafetyViolation(
                        f"node {node} overwrote its committed {want} with {e} (commit {commit})"
                    )
            prev_index, prev_term = e.index, e.term

    def commit(self, node: int, entry: Entry) -> None:
        want = self.committed.get(entry.index)
        if want is None:
            self.committed[entry.index] = entry
            if entry.index > self.max_committed:
                self.max_committed = entry.index
        elif want != entry:
            raise SafetyViolation(
                f"committed entry changed: node {node} has {entry} committed, it was {want}"
            )

    # -- state machines -----------------------------------------------------------------
    def apply(self, node: int, applied: int, commit: int, entry: Entry, chain: int) -> None:
        """``applied`` is the node's applied index before this entry, ``chain`` after it."""
        if entry.index != applied + 1:
            raise SafetyViolation(f"node {node} applied {entry} after {applied}: not contiguous")
        if entry.index > commit:
            raise SafetyViolation(f"node {node} applied {entry} beyond its commit {commit}")
        self.commit(node, entry)
        self._chain(node, entry.index, chain)

    def apply_snapshot(self, node: int, applied: int, index: int, term: int, chain: int) -> None:
        if index < applied:
            raise SafetyViolation(f"node {node} restored snapshot {index} below applied {applied}")
        want = self.committed.get(index)
        if want is not None and want.term != term:
            raise SafetyViolation(
                f"node {node} restored snapshot {term}/{index} but {want} is committed"
            )
        self._chain(node, index, chain)

    def _chain(self, node: int, index: int, chain: int) -> None:
        seen = self.chain_at.setdefault(index, chain)
        if seen != chain:
            raise SafetyViolation(
                f"state machine safety: node {node} applied a different sequence up to {index}"
            )
