"""Auto-compaction: etcd's ``--auto-compaction-mode`` / ``--auto-compaction-retention``.

Semantics (etcd 3.4, ``etcdserver/api/v3compactor``):

- ``revision`` mode, retention ``N`` (an integer): every check interval (5 minutes in etcd;
  ``--auto-compaction-check-interval`` here, for tests) compact at ``current revision - N``
  — keep the last N revisions — unless that is ``<= 0`` or the same revision as the last
  successful auto-compaction.
- ``periodic`` mode, retention a duration (``1h``, ``30m``, ``90s``, ``1h30m``; a bare integer
  means hours, as in etcd): the revision is sampled every ``period / 10`` (at most every
  6 minutes); the first compaction happens one ``period`` after start, later ones every
  ``min(period, 1h)``, each at the oldest of the last ``period / interval + 1`` samples (the
  revision of ``period`` + one sampling interval earlier, exactly as etcd's slice of
  samples) — so history of roughly the last ``period`` is kept.
- A retention of ``0`` (the default) disables auto-compaction, in either mode.
- Only the leader compacts: while this member is not the leader the compactor is paused
  (etcd pauses it on a leader change); samples are still taken. A compaction goes through
  the normal path (``RaftKV.compact``: proposed through raft, applied on every member). A
  compaction answered "already compacted" counts as done, as in etcd; any other failure is
  retried at the next check.

The decisions live in two small policy classes driven by an injected clock reading and the
current revision (``on_tick(now_s, revision, is_leader) -> revision to compact or None``,
then ``done(revision, ok)``), so they are tested with a fake clock; ``Compactor`` is the
asyncio loop around a policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

MODES = ("periodic", "revision")
DEFAULT_REVISION_CHECK_INTERVAL_S = 300.0  # etcd's revInterval (5 minutes)
HOUR_S = 3600.0
RETRY_DIVISOR = 10  # etcd: sample/retry every period / 10

_UNITS_S = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|ms|s|m|h)")


def parse_duration_s(text: str) -> float:
    """Go's ``time.ParseDuration`` for non-negative durations: ``"1h30m"``, ``"500ms"``,
    ``"1.5h"``, ``"0"``. Raises ValueError."""
    s = text.strip()
    if s == "0":
        return 0.0
    if not s:
        raise ValueError("empty duration")
    total, pos = 0.0, 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r} (want e.g. 1h, 30m, 90s, 500ms)")
        total += float(m.group(1)) * _UNITS_S[m.group(2)]
        pos = m.end()
    return total


@dataclass(frozen=True)
class AutoCompaction:
    """Parsed flags. ``retention_revisions`` (revision mode) or ``period_s`` (periodic)."""

    mode: str = "periodic"
    retention_revisions: int = 0
    period_s: float = 0.0
    check_interval_s: float = DEFAULT_REVISION_CHECK_INTERVAL_S

    @property
    def enabled(self) -> bool:
        return self.retention_revisions > 0 if self.mode == "revision" else self.period_s > 0

    @classmethod
    def parse(cls, mode: str, retention: str, check_interval: str | None = None) -> AutoCompaction:
        """From the flag texts; raises ValueError with a message naming the flag."""
        mode = mode.strip().lower()
        if mode not in MODES:
            raise ValueError(f"--auto-compaction-mode: want periodic or revision, got {mode!r}")
        interval_s = DEFAULT_REVISION_CHECK_INTERVAL_S
        if check_interval is not None and check_interval.strip():
            try:
                interval_s = parse_duration_s(check_interval)
            except ValueError as exc:
                raise ValueError(f"--auto-compaction-check-interval: {exc}") from None
            if interval_s <= 0:
                raise ValueError("--auto-compaction-check-interval must be positive")
        text = retention.strip()
        if mode == "revision":
            if not re.fullmatch(r"[0-9]{1,18}", text):
                raise ValueError(
                    "--auto-compaction-retention: revision mode wants a "
                    f"non-negative integer (revisions to keep), got {retention!r}"
                )
            return cls(mode, retention_revisions=int(text), check_interval_s=interval_s)
        if re.fullmatch(r"[0-9]{1,9}", text):  # etcd: a bare integer is hours
            period_s = int(text) * HOUR_S
        else:
            try:
                period_s = parse_duration_s(text)
            except ValueError as exc:
                raise ValueError(
                    f"--auto-compaction-retention: {exc} (or a whole number of hours)"
                ) from None
        return cls(mode, period_s=period_s, check_interval_s=interval_s)

    def policy(self, now_s: float, revision: int) -> RevisionPolicy | PeriodicPolicy:
        if self.mode == "revision":
            return RevisionPolicy(self.retention_revisions, self.check_interval_s)
        return PeriodicPolicy(self.period_s, now_s, revision)


class RevisionPolicy:
    """Keep the last ``retention`` revisions, checked every ``interval_s``."""

    def __init__(self, retention: int, interval_s: float = DEFAULT_REVISION_CHECK_INTERVAL_S):
        if retention <= 0 or interval_s <= 0:
            raise ValueError("retention and interval must be positive")
        self.retention = retention
        self.interval_s = interval_s
        self.last_compacted = 0  # the last revision auto-compacted successfully

    @property
    def tick_interval_s(self) -> float:
        return self.interval_s

    def on_tick(self, now_s: float, revision: int, is_leader: bool) -> int | None:
        if not is_leader:
            return None  # paused
        target = revision - self.retention
        if target <= 0 or target == self.last_compacted:
            return None
        return target

    def done(self, revision: int, ok: bool) -> None:
        if ok:
            self.last_compacted = revision


class PeriodicPolicy:
    """Keep about ``period_s`` of history (etcd's Periodic compactor, see module docs)."""

    def __init__(self, period_s: float, now_s: float, revision: int):
        if period_s <= 0:
            raise ValueError("period must be positive")
        self.period_s = period_s
        self.compact_interval_s = min(period_s, HOUR_S)
        self.retry_interval_s = self.compact_interval_s / RETRY_DIVISOR
        retentions = int(period_s / self.retry_interval_s + 1e-9) + 1
        # revision samples, one per retry interval; [0] is the one from one period ago
        self.samples: deque[int] = deque([revision], maxlen=retentions)
        self.last_success_s = now_s
        self.base_interval_s = period_s  # the first compaction waits a whole period

    @property
    def tick_interval_s(self) -> float:
        return self.retry_interval_s

    def on_tick(self, now_s: float, revision: int, is_leader: bool) -> int | None:
        try:
            if not is_leader:
                return None  # paused
            if now_s - self.last_success_s < self.base_interval_s - 1e-9:
                return None
            self.base_interval_s = self.compact_interval_s
            return self.samples[0]
        finally:
            self.samples.append(revision)  # the sample for the next ticks

    def done(self, revision: int, ok: bool, now_s: float | None = None) -> None:
        if ok:
            self.last_success_s = time.monotonic() if now_s is None else now_s


class Compactor:
    """The loop: every ``policy.tick_interval_s`` ask the policy, and compact when told to.

    ``revision()`` is the store's current revision, ``is_leader()`` whether this member
    leads, ``compact(rev)`` proposes the compaction (raises on failure; an "already
    compacted" error is reported through ``is_compacted_error``) — in the server these are
    ``RaftKV``'s store revision, ``node.is_leader`` and ``RaftKV.compact``.
    """

    def __init__(
        self,
        settings: AutoCompaction,
        *,
        revision: Callable[[], int],
        is_leader: Callable[[], bool],
        compact: Callable[[int], Awaitable[object]],
        is_compacted_error: Callable[[BaseException], bool] = lambda e: False,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.settings = settings
        self._revision = revision
        self._is_leader = is_leader
        self._compact = compact
        self._is_compacted_error = is_compacted_error
        self._clock = clock
        self.policy = settings.policy(clock(), revision())
        self.compactions = 0  # successful auto-compactions (for tests/metrics)
        self.last_revision = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="auto-compactor")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.policy.tick_interval_s)
            await self.tick()

    async def tick(self) -> int | None:
        """One check: compacts if the policy says so; returns the revision compacted."""
        try:
            leader = bool(self._is_leader())
        except Exception:  # the node is not up yet / shutting down
            leader = False
        rev = self.policy.on_tick(self._clock(), self._revision(), leader)
        if rev is None:
            return None
        log.info("auto-compaction at revision %d (%s mode)", rev, self.settings.mode)
        try:
            await self._compact(rev)
            ok = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            ok = self._is_compacted_error(exc)
            if not ok:
                log.warning(
                    "auto-compaction at revision %d failed (%s); retrying at the next check",
                    rev,
                    exc,
                )
        if isinstance(self.policy, PeriodicPolicy):
            self.policy.done(rev, ok, self._clock())
        else:
            self.policy.done(rev, ok)
        if ok:
            self.compactions += 1
            self.last_revision = rev
            return rev
        return None
