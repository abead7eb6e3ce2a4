"""How healthy this member's disk is, judged by its WAL fsyncs, and what a leader does about it.

etcd keeps a leader whose disk has become slow: every write then waits for that disk, and
the operator is told to move the leader by hand (``etcdctl move-leader``). Here a leader
whose own fsyncs turn slow while a follower's do not hands leadership to that follower,
and a member whose disk stops completing fsyncs altogether says so on ``/health``.

Contract
--------
``FsyncWatch`` is fed by the WAL writer thread (``begin()`` before an fsync, ``end(seconds)``
after it) and read from the loop. It keeps the last ``MAX_SAMPLES`` (100) fsyncs and the
start of the one in flight. ``health()`` is a ``DiskHealth``: the p99 of those that ended
within ``window_s`` (an fsync still in flight counts with its age so far, so a disk that
stopped answering is slow at once), how many there were, and for how long the fsync in
flight has been waiting (``stalled_s``, 0 when none is).

Why the last 100 and not every fsync of the window: fsyncs are serial, so a disk that turns
slow also turns rare. At 1,400 fsyncs a second, five seconds of a healthy past would need
seventy 500 ms fsyncs (35 s) before they made 1 % of the window; of the last 100, two make
the p99 at once. The p99 never rests on a single fsync (``p99``): one hiccup behind a big
write is not a slow disk.

``DiskHealth.slow(threshold_s, min_samples)``: the p99 is at or past the threshold over at
least ``min_samples`` fsyncs, or one fsync has been waiting ``STALLED_SLOW_S`` (or four
times the threshold, if longer). A disk
that wrote nothing in the window is not slow (nothing says it is).

``choose_transferee``: the follower a slow leader hands leadership to, or None. Only a
caught-up voter whose own report arrived and whose disk is *healthy*: its p99 below half
the threshold and nothing in flight past it (the gap between "slow" and "healthy" keeps two
members with middling disks from passing leadership back and forth). Among those, the one
with the lowest p99.

``SlowDiskGuard`` runs on the loop, once per ``check_interval_s``:

- **Stall**: an fsync in flight for ``stall_timeout_s`` or longer makes ``problem()`` say so
  (``/health`` turns false with ``DISK STALLED``) and logs an ERROR once per stall. Such a
  member's raft task is waiting for that fsync, so as a leader it sends no heartbeat: its
  followers elect another leader after an election timeout, which is how it steps down (the
  raft core is only ever touched by the raft task; nothing else can move it). Its writes
  were never acknowledged, so none is lost; when the fsync returns it hears the new term and
  follows. A failed fsync is a different thing: the WAL refuses all further writes and the
  member stops (``wal.errors.WalFailedError``).
- **Slow leader**: while this member leads and its ``health()`` is ``slow``, it asks each
  caught-up voter (match index at least the commit index) for that voter's ``DiskHealth``
  (``ask_peer``: over the peer transport, ``GET /raft/disk``; only while slow, so a healthy
  cluster pays nothing), and hands leadership to ``choose_transferee``'s pick through raft's
  leadership transfer (``Node.transfer_leadership``), logging a WARNING that names the cause
  and counting it (``transfers``). New proposals wait in the node while the transfer is on
  (up to ``transfer_hold_s``): see ``Node.transfer_leadership`` for why a slow leader's
  transfer fails without that. At most one such transfer per ``transfer_interval_s`` from
  this member; one that did not happen (still leader in the same term
  ``RETRY_AFTER_HOLDS`` holds later) does not count. None when no follower is healthy (every write would wait on a slow disk
  either way, and a transfer costs an election's worth of unavailability).

A check that comes more than two intervals late is skipped: the process stood still (SIGSTOP,
a stalled loop), and an fsync in flight across the pause would look as old as the pause.

Bounds: the guard holds the loop for a sort of at most ``MAX_SAMPLES`` + 1 floats per check; the
peer queries are bounded by ``ask_timeout_s`` each and run concurrently.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kvserver.server.config import ServerConfig

log = logging.getLogger(__name__)

MAX_SAMPLES = 100  # the newest fsyncs a p99 is taken over (module doc)
# One fsync in flight this long makes a disk slow by itself (a healthy disk's fsync can take
# a few hundred milliseconds now and then, behind a big write; a second is never healthy:
# etcd warns of any fsync over one).
STALLED_SLOW_S = 1.0
STALLED_SLOW_FACTOR = 4  # ... or this many times the threshold, if that is longer
RETRY_AFTER_HOLDS = 2  # a transfer that left this member leader in its term this long failed


@dataclass(frozen=True, slots=True)
class DiskHealth:
    """A member's WAL fsync latency over its window (seconds)."""

    p99_s: float = 0.0
    samples: int = 0
    stalled_s: float = 0.0

    def slow(self, threshold_s: float, min_samples: int) -> bool:
        if self.stalled_s >= max(STALLED_SLOW_S, STALLED_SLOW_FACTOR * threshold_s):
            return True
        return self.samples >= min_samples and self.p99_s >= threshold_s

    def healthy(self, threshold_s: float) -> bool:
        """Healthy enough to lead instead of a slow leader (below half the threshold)."""
        return self.stalled_s < threshold_s / 2 and self.p99_s < threshold_s / 2

    def to_json(self) -> dict[str, float]:
        return {"p99_s": self.p99_s, "samples": self.samples, "stalled_s": self.stalled_s}

    @classmethod
    def from_json(cls, body: Any) -> DiskHealth:
        """Parse a peer's answer; ``ValueError`` on anything else than three finite numbers
        (a peer's answer is input like any other)."""
        if not isinstance(body, dict):
            raise ValueError("disk health: not an object")
        values = []
        for key in ("p99_s", "samples", "stalled_s"):
            v = body.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"disk health: bad {key}")
            if v < 0:
                raise ValueError(f"disk health: negative {key}")
            values.append(v)
        return cls(float(values[0]), int(values[1]), float(values[2]))


class FsyncWatch:
    """WAL fsync durations of the last ``window_s`` and the fsync in flight (module doc)."""

    def __init__(self, window_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)  # (ended, s)
        self._inflight_since: float | None = None

    def begin(self) -> None:
        """An fsync starts (writer thread)."""
        self._inflight_since = self._clock()

    def end(self, seconds: float) -> None:
        """The fsync begun last ended after ``seconds`` (writer thread)."""
        now = self._clock()
        with self._lock:
            self._samples.append((now, seconds))
        self._inflight_since = None

    def stalled_s(self) -> float:
        since = self._inflight_since
        return 0.0 if since is None else max(0.0, self._clock() - since)

    def health(self) -> DiskHealth:
        now = self._clock()
        with self._lock:
            while self._samples and self._samples[0][0] < now - self.window_s:
                self._samples.popleft()
            durations = [s for _, s in self._samples]
        stalled = self.stalled_s()
        if stalled > 0:
            durations.append(stalled)
        return DiskHealth(p99(durations), len(durations), stalled)


def p99(values: Iterable[float]) -> float:
    """The 99th percentile (nearest rank), but never the largest value alone of two or
    more (below 100 values nearest rank is the maximum: one outlier would decide); 0 for no
    values."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = math.ceil(0.99 * len(ordered)) - 1
    return ordered[max(0, min(rank, len(ordered) - 2))]


def choose_transferee(
    peers: Mapping[int, DiskHealth | None], threshold_s: float
) -> tuple[int, DiskHealth] | None:
    """The caught-up follower to hand leadership to (``peers``: those caught up, with their
    report, None where none came), or None (module doc)."""
    healthy = [(h.p99_s, pid, h) for pid, h in peers.items() if h is not None]
    healthy = [c for c in healthy if c[2].healthy(threshold_s)]
    if not healthy:
        return None
    _, pid, h = min(healthy)
    return pid, h


@dataclass(frozen=True, slots=True)
class SlowDiskOptions:
    transfer: bool = True  # --slow-disk-transfer
    threshold_s: float = 0.25  # --slow-disk-fsync-threshold: p99 at or past it is slow
    window_s: float = 5.0  # --slow-disk-window: the p99's window
    min_samples: int = 5  # fsyncs in the window before a p99 counts
    transfer_interval_s: float = 60.0  # --slow-disk-transfer-interval
    stall_timeout_s: float = 10.0  # --disk-stall-timeout (0: never report a stall)
    check_interval_s: float = 1.0
    ask_timeout_s: float = 1.0
    # New proposals wait while the transfer is on (Node.transfer_leadership), at most this
    # long: two election timeouts.
    transfer_hold_s: float = 2.0

    @classmethod
    def from_config(cls, cfg: ServerConfig) -> SlowDiskOptions:
        return cls(
            transfer=cfg.slow_disk_transfer,
            threshold_s=cfg.slow_disk_fsync_threshold_ms / 1000,
            window_s=cfg.slow_disk_window_ms / 1000,
            transfer_interval_s=cfg.slow_disk_transfer_interval_ms / 1000,
            stall_timeout_s=cfg.disk_stall_timeout_ms / 1000,
            transfer_hold_s=2 * cfg.election_timeout_ms / 1000,
        )


class LeaderNode(Protocol):
    """What the guard needs of the node (``kvserver.server.node.Node``)."""

    id: int

    @property
    def is_leader(self) -> bool: ...

    @property
    def term(self) -> int: ...

    def transfer_leadership(self, transferee: int, hold_proposals_s: float = 0.0) -> None: ...

    def caught_up_voters(self) -> list[int]: ...


AskPeer = Callable[[int], Awaitable[Any]]  # peer id -> its /raft/disk JSON (or raises)


class SlowDiskGuard:
    def __init__(
        self,
        node: LeaderNode,
        watch: FsyncWatch,
        ask_peer: AskPeer,
        options: SlowDiskOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.node = node
        self.watch = watch
        self.ask_peer = ask_peer
        self.opts = options or SlowDiskOptions()
        self._clock = clock
        self.transfers = 0  # leadership transfers for a slow disk (/metrics)
        self.stalls = 0  # stalls reported (/metrics)
        self._last_transfer = -math.inf
        self._attempt: tuple[float, int] = (-math.inf, 0)  # (when, term) of the last transfer
        self._stall_logged = False
        self._stay_logged = -math.inf
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="slow-disk-guard")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    def problem(self) -> str:
        """Why ``/health`` must be false on this member's disk's account ("" if it need not)."""
        limit = self.opts.stall_timeout_s
        stalled = self.watch.stalled_s()
        if limit > 0 and stalled >= limit:
            return f"DISK STALLED: a WAL fsync has not completed for {stalled:.1f} s"
        return ""

    def stats(self) -> dict[str, float]:
        health = self.watch.health()
        return {
            "disk_fsync_p99_seconds": health.p99_s,
            "disk_stalled_seconds": health.stalled_s,
            "slow_disk_leader_transfers": self.transfers,
            "disk_stalls": self.stalls,
        }

    async def _run(self) -> None:
        interval = self.opts.check_interval_s
        while True:
            asked = self._clock()
            await asyncio.sleep(interval)
            if self._clock() - asked > 2 * interval:
                # The process (or its loop) stood still meanwhile (SIGSTOP, a stalled loop):
                # the fsync in flight then looks as old as the pause. Judge from the next
                # turn, when it has had a chance to complete.
                continue
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug: say so, keep guarding
                log.exception("slow-disk check failed")

    async def check(self) -> None:
        """One round (module doc); public for tests."""
        self._check_stall()
        opts = self.opts
        if not opts.transfer or not self.node.is_leader:
            return
        own = self.watch.health()
        if not own.slow(opts.threshold_s, opts.min_samples):
            return
        now = self._clock()
        attempted_at, attempt_term = self._attempt
        if (
            self.node.term == attempt_term
            and now - attempted_at >= RETRY_AFTER_HOLDS * opts.transfer_hold_s
        ):
            # Still leading in the term of the last attempt, long after it: that transfer
            # did not happen (raft gave it up), so it does not count against the interval.
            self._attempt = (-math.inf, 0)
            self._last_transfer = -math.inf
        if now - self._last_transfer < opts.transfer_interval_s:
            return
        voters = self.node.caught_up_voters()
        answers = await asyncio.gather(*(self._ask(p) for p in voters))
        reports = dict(zip(voters, answers, strict=True))
        if not self.node.is_leader:  # lost leadership meanwhile
            return
        chosen = choose_transferee(reports, opts.threshold_s)
        if chosen is None:
            if now - self._stay_logged >= opts.transfer_interval_s:
                self._stay_logged = now
                log.warning(
                    "member %x leads on a slow disk (WAL fsync p99 %.0f ms over %d fsyncs, "
                    "threshold %.0f ms) but no caught-up follower has a healthy disk "
                    "(%s): staying leader",
                    self.node.id,
                    own.p99_s * 1000,
                    own.samples,
                    opts.threshold_s * 1000,
                    _describe(reports),
                )
            return
        peer, theirs = chosen
        self._last_transfer = now
        self.transfers += 1
        log.warning(
            "member %x: slow disk: WAL fsync p99 %.0f ms over the last %.0f s (%d fsyncs, "
            "threshold %.0f ms); handing leadership to %x (fsync p99 %.1f ms)",
            self.node.id,
            own.p99_s * 1000,
            opts.window_s,
            own.samples,
            opts.threshold_s * 1000,
            peer,
            theirs.p99_s * 1000,
        )
        self._attempt = (now, self.node.term)
        self.node.transfer_leadership(peer, hold_proposals_s=opts.transfer_hold_s)

    def _check_stall(self) -> None:
        if self.problem():
            if not self._stall_logged:
                self._stall_logged = True
                self.stalls += 1
                log.error(
                    "member %x: disk stalled: a WAL fsync has not completed for %.1f s "
                    "(--disk-stall-timeout %.1f s); /health reports it, and as leader this "
                    "member sends no heartbeat until it completes, so its followers elect "
                    "another leader",
                    self.node.id,
                    self.watch.stalled_s(),
                    self.opts.stall_timeout_s,
                )
        elif self._stall_logged:
            self._stall_logged = False
            log.warning("member %x: the stalled WAL fsync completed", self.node.id)

    async def _ask(self, peer: int) -> DiskHealth | None:
        try:
            async with asyncio.timeout(self.opts.ask_timeout_s):
                return DiskHealth.from_json(await self.ask_peer(peer))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # unreachable, old version, bad answer: not a candidate
            log.debug("disk health of %x: %s", peer, exc)
            return None


def _describe(reports: Mapping[int, DiskHealth | None]) -> str:
    if not reports:
        return "none caught up"
    return ", ".join(
        f"{p:x}: " + ("no answer" if h is None else f"p99 {h.p99_s * 1000:.0f} ms")
        for p, h in reports.items()
    )
