"""The changefeed driver's ledger: which events of the range exist past the last commit.

The stream reader's background watch (``changefeed._RangeWatcher``) records, for every event
of the watched range it receives, the event's revision and key. From that record the driver
answers, without reading values again:

* the latest offset under a limit (``end_within``): the largest event revision such that the
  batch ``(start, end]`` holds at most ``max_events`` events and spans at most
  ``max_revisions`` revisions — a revision is never split, so a first revision with more
  events than the cap is taken whole;
* the partitions of a batch (``split``): disjoint key ranges cut between keys so that each
  holds about the same number of the batch's events (every event of a key in one
  partition), each with the revision of its last event and its event count, so the task that
  reads it knows when it has everything (a watch of a key range that had no event would not
  know when to stop);
* the events themselves, when it holds them (``held``): each partition's payloads in
  revision order, so the driver can hand a task its events instead of the task reading them
  from the store again.

Payloads. ``add`` may give an event's payload (the decoded event) and its size in bytes; the
ledger holds payloads while their total stays within ``hold_bytes``, and records an event
that would go past it by revision and key only. ``held`` answers a partition's payloads only
when it holds every one of them (else None: the task reads that partition from the store).

``complete``: every event with ``floor < revision <= complete`` is recorded (the watch
advanced past it). Events at or below a committed offset are dropped (``trim``). The record
holds at most ``capacity`` events: the watch thread waits (``add`` blocks) until a commit
frees room, so a query far behind the store does not hold its whole backlog in the driver.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass

DEFAULT_CAPACITY = 2_000_000
DEFAULT_HOLD_BYTES = 128 << 20


@dataclass(frozen=True, slots=True)
class KeySlice:
    """One partition of a batch: keys ``[lo, hi)`` (None: the watched range's own bound),
    ``count`` events, the last at revision ``last``."""

    lo: bytes | None
    hi: bytes | None
    last: int
    count: int


class EventLedger:
    def __init__(self, first: int, capacity: int = DEFAULT_CAPACITY, hold_bytes: int = 0) -> None:
        self.floor = first - 1  # invariant: floor <= complete
        self.complete = first - 1
        self.capacity = capacity
        self.hold_bytes = hold_bytes
        self.held_bytes = 0  # invariant: the sum of _sizes, at most hold_bytes
        self._revs: list[int] = []  # invariant: non-decreasing, every value > floor
        self._keys: list[bytes] = []
        self._payloads: list = []  # an event's payload, None when not held
        self._sizes: list[int] = []  # 0 when not held
        self._cond = threading.Condition()
        self._closed = False

    # -- the watch thread ----------------------------------------------------------------------

    def add(self, revision: int, key: bytes, payload=None, size: int = 0) -> None:
        with self._cond:
            while len(self._revs) >= self.capacity and not self._closed:
                self._cond.wait(0.5)
            if revision <= self.floor:
                return
            self._revs.append(revision)
            self._keys.append(key)
            if payload is not None and self.held_bytes + size <= self.hold_bytes:
                self._payloads.append(payload)
                self._sizes.append(size)
                self.held_bytes += size
            else:
                self._payloads.append(None)
                self._sizes.append(0)
            if revision - 1 > self.complete:
                self.complete = revision - 1  # a revision's events arrive together
                self._cond.notify_all()

    def mark_complete(self, revision: int) -> None:
        with self._cond:
            if revision > self.complete:
                self.complete = revision
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the driver ----------------------------------------------------------------------------

    def wait_complete(self, revision: int, timeout_s: float) -> bool:
        """Wait until every event up to ``revision`` is recorded (or ``timeout_s`` passed)."""
        with self._cond:
            return (
                self._cond.wait_for(lambda: self.complete >= revision or self._closed, timeout_s)
                and self.complete >= revision
            )

    def covers(self, start: int, end: int) -> bool:
        with self._cond:
            return self.floor <= start and end <= self.complete

    def latest(self) -> int:
        """The newest recorded event revision whose events are all here (floor: none)."""
        with self._cond:
            i = bisect_right(self._revs, self.complete)
            return self._revs[i - 1] if i else self.floor

    def end_within(self, start: int, max_events: int = 0, max_revisions: int = 0) -> int:
        """The end of the next batch from ``start`` under the caps (0: none); ``start`` when
        no complete event is past it."""
        with self._cond:
            revs = self._revs
            i0 = bisect_right(revs, start)
            ic = bisect_right(revs, self.complete)
            if ic <= i0:
                return start
            end = revs[ic - 1]
            if max_revisions and end > start + max_revisions:
                j = bisect_right(revs, start + max_revisions)
                end = revs[j - 1] if j > i0 else revs[i0]
            if max_events and ic - i0 > max_events:
                over = revs[i0 + max_events]  # the revision of the first event past the cap
                j = bisect_left(revs, over)
                end = min(end, revs[j - 1] if j > i0 else over)
            return end

    def count(self, start: int, end: int) -> int:
        with self._cond:
            return bisect_right(self._revs, end) - bisect_right(self._revs, start)

    def split(self, start: int, end: int, parts: int, min_events: int) -> list[KeySlice]:
        """Key-range partitions of batch ``(start, end]`` (see the module docstring): at most
        ``parts``, each of at least about ``min_events`` events; one when the batch is small."""
        with self._cond:
            i0 = bisect_right(self._revs, start)
            i1 = bisect_right(self._revs, end)
            revs = self._revs[i0:i1]
            keys = self._keys[i0:i1]
        total = len(revs)
        if total == 0:
            return []
        want = max(1, min(parts, total // max(min_events, 1)))
        if want == 1:
            return [KeySlice(None, None, revs[-1], total)]
        counts = Counter(keys)
        last = dict(zip(keys, revs, strict=True))  # revisions ascend: a key's last wins
        ordered = sorted(counts)
        groups: list[list] = []  # [first key, last revision, count]
        acc = 0
        for k in ordered:
            n = counts[k]
            if not groups or (acc >= total * len(groups) / want and len(groups) < want):
                groups.append([k, 0, 0])
            g = groups[-1]
            g[1] = max(g[1], last[k])
            g[2] += n
            acc += n
        out = []
        for i, (first, last_rev, n) in enumerate(groups):
            lo = None if i == 0 else first
            hi = groups[i + 1][0] if i + 1 < len(groups) else None
            out.append(KeySlice(lo, hi, last_rev, n))
        return out

    def held(
        self, start: int, end: int, slices: list[KeySlice], max_bytes: int = 0
    ) -> list[list | None]:
        """For each of ``split``'s ``slices`` of batch ``(start, end]``: its events' payloads
        in revision order, or None when one of them is not held (or, with ``max_bytes``,
        when they hold more than that)."""
        with self._cond:
            i0 = bisect_right(self._revs, start)
            i1 = bisect_right(self._revs, end)
            keys = self._keys[i0:i1]
            payloads = self._payloads[i0:i1]
            sizes = self._sizes[i0:i1]
        bounds = [sl.lo or b"" for sl in slices[1:]]  # slice i holds keys [lo_i, lo_i+1)
        out: list[list | None] = [[] for _ in slices]
        used = [0] * len(slices)
        for key, payload, size in zip(keys, payloads, sizes, strict=True):
            i = bisect_right(bounds, key) if bounds else 0
            events = out[i]
            if events is None:
                continue
            used[i] += size
            if payload is None or (max_bytes and used[i] > max_bytes):
                out[i] = None
            else:
                events.append(payload)
        return out

    def trim(self, upto: int) -> None:
        """Forget the events at or below ``upto`` (a committed offset)."""
        with self._cond:
            if upto <= self.floor:
                return
            i = bisect_right(self._revs, upto)
            del self._revs[:i]
            del self._keys[:i]
            del self._payloads[:i]
            self.held_bytes -= sum(self._sizes[:i])
            del self._sizes[:i]
            self.floor = upto
            if self.complete < upto:
                self.complete = upto
            self._cond.notify_all()
