"""The node driver: a raft task that owns the raft core, and an apply task behind it.

Nothing but the raft task touches the ``RawNode``. Everything else hands it work through
queues and wakes it: peer messages (``receive``), proposals (``propose``), linearizable read
barriers (``read_barrier``) and ticks. Each turn of the raft task drains those queues into
the core — so every proposal that arrived while the previous Ready was being written goes
into the next Ready together (batching falls out of the loop) — and then handles one Ready in
the order etcd's raft documents for a Ready (``doc.go``, "Usage"):

1. replication messages of a leader (MsgApp, MsgHeartbeat, MsgSnap) and a leadership
   transfer's MsgTimeoutNow are sent first: a leader may send entries before its own write
   completes (Raft thesis §10.2.1), and none of them promises anything about its own disk
   (etcd's leader sends all of its messages before it writes);
2. the snapshot, entries and hard state are persisted (the WAL writer thread fsyncs when
   ``must_sync``; the loop keeps serving meanwhile);
3. all other messages — votes and acknowledgements, which promise durable state — are sent;
4. the snapshot and committed entries are queued for the apply task, and then ``advance``.

Why two tasks (etcd's ``raftNode`` goroutine and its apply loop): applying, restoring a
snapshot and making one take time that grows with the data. If the raft task waited for them,
a leader busy applying a big delete or writing a snapshot of a million keys would send no
heartbeat, and its followers would elect another leader. So the raft task only persists,
sends and hands over; it keeps ticking, heartbeating and answering votes while the apply task
works through its queue, and every long step of the apply task yields to the loop in bounded
slices. The one exception is a Ready with a conf change among its committed entries: the raft
task waits until the apply task has applied it (as etcd's ``raftNode`` does), so the core never
counts votes with a configuration the member has not applied. ``applied`` is the apply task's
progress; reads (``read_barrier``) are answered once it reaches their read index.

Proposal payloads travel in entries as ``origin (8 bytes) | sequence (8 bytes) | payload``.
``origin`` is random per process, so the node that proposed an entry recognises it when it
applies it and hands the state machine's result to the waiting caller; other nodes just
apply it. Retried client writes are de-duplicated by the state machine (client request ids),
not here.

Membership (``kvserver.membership``): ``propose_conf_change`` proposes a ConfChange and returns
once this node has applied it (matched by the change's ``id``); applied changes go to the
``on_conf_change`` callback. The optional ``members`` object (``snapshot()`` /
``restore(blob, conf_state)``) is the replicated member registry: its image is framed in front
of the state machine's in every snapshot this node makes (``membership.frame_members``), and
split off again when a snapshot is restored.

Linearizable reads use ReadIndex, batched: all callers waiting when the raft task runs share
one read_index request, and while one is out unanswered the next callers wait to share the
following one; a batch whose answer does not come (leader change, dropped message) is asked
again every ``read_retry_s``.

Failures (``_step``, ``health_problem``): an exception that escapes the raft task stops the
node (``failed`` is set, ``failure`` says why; ``kvserver.assembly.member`` exits non-zero), so does a
``RaftInvariantError`` while stepping a peer message — in particular
``CommitOutOfRangeError``, which means this member lost log entries it had acknowledged and
may have counted toward a commit quorum with them (etcd panics there too). Any other error
on a peer message drops that message and is logged at ERROR. ``health_problem()`` is the
node's part of ``/health``: failed, failing recently, or a follower whose leader has not yet
sent it one heartbeat it could take (the heartbeat's commit index is what exposes a lost
log, so a follower is not healthy before it has passed that check once per term).
"""

import asyncio
import gc
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvserver import stages
from kvserver.kvpb import service_errors as errors
from kvserver.membership.registry import frame_members, split_members_frame
from kvserver.server.expiry import Expired, Expiry
from kvserver.server.gc_pacer import freeze_heap
from kvserver.server.metrics import DurationHistogram
from raft import (
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    MemoryStorage,
    Message,
    MessageType,
    ProposalDroppedError,
    RawNode,
    Ready,
    SnapOutOfDateError,
    Snapshot,
    SnapshotMetadata,
    StateType,
)
from raft.errors import (
    CommitOutOfRangeError,
    CompactedError,
    RaftError,
    RaftInvariantError,
    UnavailableError,
)
from snap import forked
from snap.forked import ChildFailedError, ForkedChild
from snap.spill import SpillFile, drop_resident_pages, spill_chunks
from snap.spill import fill as spill_into

log = logging.getLogger(__name__)

# MsgTimeoutNow among them: a leader on a slow disk that hands leadership away would
# otherwise hold it back for one more of its slow fsyncs (kvserver.server.disk_health).
_SEND_BEFORE_PERSIST = frozenset(
    {MessageType.MsgApp, MessageType.MsgHeartbeat, MessageType.MsgSnap, MessageType.MsgTimeoutNow}
)
PROPOSAL_HEADER_BYTES = 16  # origin | sequence, in front of every proposal
# The apply task yields to the loop after this long: a batch of big committed entries (a
# member replaying its WAL at start-up, a follower catching up on txns of 128 puts) would
# otherwise hold heartbeats, reads and the GC pacer's freeze for the whole batch.
_APPLY_SLICE_S = 0.01
# A snapshot's end (on the loop: its WAL record, the log cut; then the heap trim in a thread)
# and the next snapshot's fork each hold up a member's writes for 10-50 ms at a million keys;
# the next one starts this long after the last one was kept, so that the two do not add up.
# Both grow with the state: below SNAPSHOT_SPACING_MIN_BYTES of snapshot they take a
# millisecond or two, and snapshots follow each other as soon as they are due.
SNAPSHOT_SPACING_S = 0.5
SNAPSHOT_SPACING_MIN_BYTES = 32 * 1024 * 1024
# A snapshot child holds no event loop, so it serializes in chunks of this size: the store's
# batches then hold up to a thousand records (a 64 KiB chunk holds about a hundred), and
# restoring a million keys from them took 1.33 s instead of 1.47 s.
CHILD_SNAPSHOT_CHUNK_BYTES = 1 << 20
# 1 ms .. ~0.5 s: a fork copies the page tables, 20-30 ms per GiB of heap on a quiet machine.
FORK_BUCKETS_SECONDS = tuple(0.001 * 2**i for i in range(10))
STEP_ERROR_UNHEALTHY_S = 10.0  # /health is false this long after a peer message failed


@dataclass(frozen=True)
class _Continuation:
    """A snapshot image that continues the raft storage's snapshot ``source``: ``chunks``
    give the new parts and, in their place, the source's body as a view (never read here),
    which lies at ``source_range`` in the source's data. Once the chunks are all taken,
    ``layout`` holds the new image's layout, as the state machine's ``snapshot_layout``
    would read it (empty if the state machine does not say)."""

    source: SnapshotMetadata
    source_range: tuple[int, int]
    chunks: Iterator[bytes | memoryview]
    layout: list[Any] = field(default_factory=list)


class StateMachine(Protocol):
    """What the driver needs from the replicated state machine (the KV store).

    Optional hooks, called from the raft task if the state machine has them:
    ``on_leader_start()`` when this member, as leader, applies the empty entry of its term
    (everything of earlier terms is applied: the lessor is promoted there),
    ``on_leader_stop()`` when it stops being leader, and ``on_replay_start()`` /
    ``on_replay_end()`` around the replay of the log after a restart (no client reads until
    it ends: a bulk apply)."""

    def apply(self, index: int, payload: bytes) -> object:
        """Apply one committed proposal; the result goes to the proposer's caller (or an
        ``ApplyInSteps`` whose generator returns it)."""

    def snapshot_chunks(self, chunk_size_bytes: int = ...) -> Iterator[bytes]:
        """The state's image as of the call (applies may go on while the chunks are taken),
        in chunks small enough to produce without stalling the loop; a snapshot child, which
        holds no loop, asks for bigger ones (bigger batches restore faster)."""

    async def install_snapshot(self, data: bytes | memoryview) -> None:
        """Replace the state with a snapshot image from the leader, without holding the loop
        for long (the raft task keeps running meanwhile)."""


class ApplyInSteps:
    """What ``StateMachine.apply`` returns for an entry whose work grows with the data (a
    delete of a million keys): a generator doing the work a bounded step at a time, yielding
    None between steps, that returns the entry's result. The apply task runs it to the end
    before it applies the next entry, yielding to the loop between steps: the entry is still
    applied whole and in order (the state machine keeps readers from seeing it half done),
    and the raft task keeps ticking and heartbeating meanwhile."""

    __slots__ = ("steps",)

    def __init__(self, steps: Generator[None, None, object]):
        self.steps = steps

    def run_now(self) -> object:
        """Run the steps to the end at once; the entry's result. For replays off the loop
        (a point-in-time restore, a changefeed reading archived history), where nothing
        else waits for the loop."""
        steps = self.steps
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                return stop.value

    async def run(self) -> object:
        """Run the steps to the end, one loop turn per step; the entry's result."""
        steps = self.steps
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                return stop.value
            await asyncio.sleep(0)


class DurableStorage(Protocol):
    """WAL + snapshot files behind the raft core's MemoryStorage (kvserver.server.node_storage)."""

    raft_storage: MemoryStorage

    async def persist(self, rd: Ready) -> None: ...

    async def save_snapshot(
        self, metadata: SnapshotMetadata, data_parts: list[bytes | memoryview]
    ) -> bytes | memoryview: ...

    def write_snapshot_file_in_child(
        self, metadata: SnapshotMetadata, data_parts: list[bytes | memoryview]
    ) -> str: ...

    def continue_snapshot_file(
        self,
        metadata: SnapshotMetadata,
        source: SnapshotMetadata,
        source_range: tuple[int, int],
        parts: SpillFile,
        head_bytes: int,
    ) -> ForkedChild: ...

    async def record_snapshot_file(self, metadata: SnapshotMetadata) -> bytes | memoryview: ...

    @property
    def spill_dir(self) -> str | None: ...  # where this member's snapshots spill (snap.spill)

    def compact(self, index: int) -> None: ...


class MemberSnapshots(Protocol):
    """The member registry's part in snapshots (kvserver.membership): framed before the state
    machine's image, restored with the configuration the snapshot carries."""

    def snapshot(self) -> bytes: ...

    def restore(self, blob: bytes | None, conf_state: ConfState) -> None: ...


@dataclass(frozen=True)
class NodeHandlers:
    """Everything the node calls out to, handed over when it starts (as etcd's
    ``raftNode.start(readyHandler)``), so the parts built around the node — transport, state
    machine, membership — can take the node in their constructors instead of being patched
    onto each other afterwards."""

    state_machine: StateMachine
    send: Callable[[list[Message]], None]  # never blocks (the transport queues per peer)
    members: MemberSnapshots | None = None
    on_conf_change: Callable[[ConfChange, ConfState], None] | None = None
    # after the node dropped much memory at once: log entries a snapshot made redundant, the
    # state replaced by a leader's snapshot (kvserver.server.heap_trim gives it back)
    on_memory_freed: Callable[[str], None] | None = None


@dataclass
class NodeOptions:
    heartbeat_interval_s: float = 0.1
    request_timeout_s: float = 5.0
    read_retry_s: float = 0.5
    snapshot_count: int = 100_000  # etcd 3.4's default
    # ... or after this many bytes of applied entries (0: no such limit), see snapshot_due
    snapshot_bytes: int = 64 * 1024 * 1024
    snapshot_catchup_entries: int = 5000
    snapshot_catchup_bytes: int = 64 * 1024 * 1024
    max_pending_proposals: int = 10000
    # Snapshots made by a forked child where the platform allows (snap.forked).
    snapshot_in_child: bool = True
    # A snapshot continues the previous one when no compaction ran since (see
    # _start_snapshot): no fork, and work that grows with the changes, not the store.
    snapshot_incremental: bool = True
    # A log cut asks for a heap trim only when it freed at least this much entry data. The
    # trim locks the allocator's main arena, so the loop waits for it (17-86 ms at two
    # million keys); entries of a few hundred bytes (single puts) are not in that heap at
    # all (CPython's own allocator holds them and unmaps its arenas itself), so a cut of
    # 10,000 of them gave nothing back for the stall. A cut after a load of txns of 128
    # puts frees hundreds of megabytes.
    log_cut_trim_min_bytes: int = 32 * 1024 * 1024


class _ReadBatch:
    __slots__ = ("ctx", "waiters", "index", "asked_at")

    def __init__(self, ctx: bytes):
        self.ctx = ctx
        self.waiters: list[asyncio.Future] = []
        self.index: int | None = None  # known once the ReadState arrives
        self.asked_at = 0.0


# A snapshot child that runs longer than this is killed (and snapshots move to the loop): at
# two million keys a child takes seconds, minutes only on a machine far too busy.
SNAPSHOT_CHILD_TIMEOUT_S = 600.0

SNAPSHOT_STAGGER_FRACTION = 4  # a member snapshots after up to a quarter more entries


def snapshot_threshold(node_id: int, amount: int) -> int:
    """How much applied after its last snapshot (entries, or bytes of them) a member takes
    the next one: ``amount`` plus a fixed part of up to a quarter of it, derived from the
    member's ID. Every member applies the same entries, so with one threshold all of them
    would serialize their whole state at the same moment; at a million keys that is seconds
    of CPU each, and the writes all wait on the busy machine at once. Staggered, the
    snapshots follow one another. Which entries a snapshot covers does not matter to raft."""
    return amount + (node_id % 1009) * amount // (1009 * SNAPSHOT_STAGGER_FRACTION)


class Node:
    def __init__(
        self,
        *,
        raw: RawNode,
        node_id: int,
        storage: DurableStorage,
        options: NodeOptions,
        applied: int,
        conf_state: ConfState,
    ):
        self.raw = raw
        self.id = node_id
        self.storage = storage
        self.opts = options
        # Set by start(): the node calls out to them only from its tasks.
        self.sm: StateMachine
        self.members: MemberSnapshots | None
        self._send: Callable[[list[Message]], None]
        self._on_conf_change: Callable[[ConfChange, ConfState], None] | None
        self._on_memory_freed: Callable[[str], None] | None = None
        # invariant: snapshot_index <= applied <= committed
        self.applied = applied
        self.snapshot_index = applied
        # Bytes of the entries applied since start-up, and their count at the newest snapshot
        # (and at the one being made): a restart replays what lies between, so a member also
        # snapshots once that passes ``snapshot_bytes``, however few the entries.
        self.applied_bytes = 0
        self._applied_bytes_at_snapshot = 0
        self._snapshot_started: tuple[int, int] = (applied, 0)  # (index, applied_bytes)
        self._snapshot_in_child = options.snapshot_in_child and forked.available()
        # How long each snapshot's fork held the loop (``raftkv_snapshot_fork_seconds``).
        self.snapshot_fork_seconds = DurationHistogram(FORK_BUCKETS_SECONDS)
        # Snapshots kept, by how they were made (``raftkv_snapshots_made_total``).
        self.snapshots_made = {"continued": 0, "child": 0, "loop": 0}
        # (snapshot index, offset of the state machine's image, its layout) of the raft
        # storage's snapshot, adopted from the continuation that made it or else found in a
        # thread after it changed: what the next snapshot continues from
        # (``_continued_chunks``).
        self._snapshot_layout: tuple[int, int, Any] | None = None
        self.snapshot_layout_reads = 0  # images read back for their layout (not adopted)
        self._layout_task: asyncio.Task | None = None
        self._snapshot_incremental = options.snapshot_incremental
        self.conf_state = conf_state
        hard_state, _ = storage.raft_storage.initial_state()
        self.leader = 0
        self.term = hard_state.term
        self.role = StateType.FOLLOWER
        self.leader_changes = 0  # every change of the known leader, to "none" included
        self.leaders_seen = 0  # changes to a new leader only (etcd's leader_changes_seen)
        self._durable_term_vote = (hard_state.term, hard_state.vote)

        self._origin = os.urandom(8)
        self._seq = 0
        self._wake = asyncio.Event()
        self._inbox: list[Message] = []
        self._ticks = 0
        self._proposals: list[bytes] = []
        self._hold_proposals_until = 0.0  # monotonic; see transfer_leadership
        self._held_forwarded: list[Message] = []  # proposals other members forwarded, held
        self._proposal_waiters: dict[int, asyncio.Future] = {}
        # the deadlines of proposals' and reads' waiters, failed by the ticker when overdue
        self._expiry = Expiry()
        self._conf_proposals: list[ConfChange] = []
        self._conf_waiters: dict[int, asyncio.Future] = {}  # by ConfChange.id
        self._unreachable: list[int] = []
        self._snapshot_status: list[tuple[int, bool]] = []
        self._read_new: _ReadBatch | None = None
        self._reads_asked: dict[bytes, _ReadBatch] = {}
        self._reads_ready: list[_ReadBatch] = []
        self._read_seq = 0
        # The apply task's queue: committed entries, or a snapshot to restore, in log order.
        self._apply_queue: deque[tuple[Entry, ...] | Snapshot] = deque()
        self._apply_wake = asyncio.Event()
        self._applied_waiters: list[tuple[int, asyncio.Future]] = []  # (index, woken at it)
        self._snapshot_task: asyncio.Task | None = None  # writing this member's own snapshot
        self._next_snapshot_at = 0.0  # monotonic time: no snapshot starts before it
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self.failed = asyncio.Event()  # set if the raft loop dies: the member exits
        self.failure: BaseException | None = None  # what ended the raft loop
        # The latest peer message the core failed on with an unexpected error: (monotonic
        # time, error); /health is false for STEP_ERROR_UNHEALTHY_S after it.
        self._step_error: tuple[float, str] | None = None
        # (term, leader) of the last heartbeat this follower took from its leader without an
        # error: the heartbeat's commit index proves our log holds what the leader thinks we
        # acknowledged (a node that lost entries fails right there), so /health waits for it.
        self._confirmed_leader: tuple[int, int] = (0, 0)
        # The commit index this member had before it (re)started. Its store lives in memory:
        # until the entries up to there are applied again it is older than what it served
        # before the restart (etcd's store is on disk and never goes back), so local reads
        # and new watches wait for ``recovered`` (see ``wait_recovered``).
        self.recovered_commit = hard_state.commit
        self.recovered = asyncio.Event()
        if applied >= self.recovered_commit:
            self.recovered.set()
        self._gc_paused_for_replay = False
        self._replay_started: tuple[float, int] | None = None  # (monotonic time, applied)
        # counters read by /metrics (kvserver.assembly.member.Member._stats)
        self.stats = {"proposals_applied": 0, "proposals_failed": 0}
        # More reasons for /health to be false, from parts beside the node (a stalled disk:
        # kvserver.server.disk_health); each returns "" when all is well.
        self.health_checks: list[Callable[[], str]] = []

    # --- inputs (called from any coroutine on the loop) ----------------------------------

    def receive(self, messages: list[Message]) -> None:
        if stages.ON:
            _mark_received(messages)
        self._inbox.extend(messages)
        self._wake.set()

    def report_unreachable(self, peer_id: int) -> None:
        self._unreachable.append(peer_id)
        self._wake.set()

    def report_snapshot(self, peer_id: int, failed: bool) -> None:
        self._snapshot_status.append((peer_id, failed))
        self._wake.set()

    def transfer_leadership(self, transferee: int, hold_proposals_s: float = 0.0) -> None:
        """Ask the raft core to hand leadership to ``transferee`` (etcd's
        ``TransferLeadership``), on the raft task's next turn, as the message a peer would
        send (a follower passes it on to its leader). Nothing is answered: the caller watches
        ``leader``; a leader gives a transfer up after an election timeout.

        ``hold_proposals_s``: new proposals wait in the node (not in the log) until the
        leader changes or this long has passed, then go to the core (a follower's core
        forwards them to the new leader). Raft refuses proposals only while the transfer is
        on; a leader whose turns are slow (a slow disk: the raft task waits for each fsync)
        counts an election timeout's ticks in two or three turns, gives the transfer up,
        and takes proposals again, and the transferee's vote request then reaches voters
        whose logs are longer than its own: the transfer fails. Held, the log stays where
        the transferee caught up until it has won. Proposals other members forward here
        are held alike: raft drops those during a transfer without a word, and their
        clients waited out the request timeout."""
        if hold_proposals_s > 0:
            self._hold_proposals_until = time.monotonic() + hold_proposals_s
        self.receive([Message(type=MessageType.MsgTransferLeader, to=self.id, frm=transferee)])

    async def propose(self, payload: bytes, timeout_s: float | None = None) -> object:
        """Replicate ``payload``; return the state machine's result once applied here.

        A proposal counts against ``max_pending_proposals`` until it is applied, fails or
        times out, even when its caller went away first (a client that resets its calls
        must not queue proposals past the bound): a canceled caller leaves its waiter in
        place, and the waiter goes when the proposal's fate is known or its time is up."""
        if self._stopped:
            raise errors.stopping()
        if len(self._proposal_waiters) >= self.opts.max_pending_proposals:
            raise errors.ServiceError(
                errors.GrpcCode.RESOURCE_EXHAUSTED, "etcdserver: too many requests", retryable=True
            )
        self._seq += 1
        seq = self._seq
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._proposal_waiters[seq] = fut
        self._proposals.append(self._origin + seq.to_bytes(8, "big") + payload)
        self._wake.set()
        timeout = timeout_s or self.opts.request_timeout_s
        self._expiry.add(time.monotonic() + timeout, fut)
        abandoned = False
        try:
            return await fut
        except Expired:
            self.stats["proposals_failed"] += 1
            raise errors.timed_out() from None
        except asyncio.CancelledError:
            # the caller's cancellation canceled the waiter too, unless the answer came first
            abandoned = fut.cancelled() and self._proposal_waiters.get(seq) is fut
            raise
        finally:
            if abandoned:
                self._abandon(seq, timeout)
            else:
                self._proposal_waiters.pop(seq, None)

    def _abandon(self, seq: int, timeout_s: float) -> None:
        """Keeps a canceled caller's proposal counted, under a waiter nobody awaits, until it
        is applied or fails, or for at most ``timeout_s`` (a proposal a leader dropped is
        never answered)."""
        waiters = self._proposal_waiters
        loop = asyncio.get_running_loop()
        fut = waiters[seq] = loop.create_future()

        def forget(_: object = None) -> None:
            if waiters.get(seq) is fut:
                del waiters[seq]
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # retrieved, so asyncio does not log it as never retrieved

        fut.add_done_callback(forget)
        loop.call_later(timeout_s, forget)

    async def propose_conf_change(
        self, cc: ConfChange, timeout_s: float | None = None
    ) -> ConfState:
        """Propose a membership change (``cc.id`` 0: a random one is chosen); return the
        configuration once this node has applied it. A change raft refuses (another one is
        not applied yet) never applies: the caller times out."""
        if self._stopped:
            raise errors.stopping()
        if not cc.id:
            cc = ConfChange(
                cc.type, cc.node_id, cc.context, int.from_bytes(os.urandom(8), "big") or 1
            )
        fut = asyncio.get_running_loop().create_future()
        self._conf_waiters[cc.id] = fut
        self._conf_proposals.append(cc)
        self._wake.set()
        try:
            async with asyncio.timeout(timeout_s or self.opts.request_timeout_s):
                return await fut
        except TimeoutError:
            raise errors.timed_out() from None
        finally:
            self._conf_waiters.pop(cc.id, None)

    @property
    def conf_change_ready(self) -> bool:
        """Raft would take a conf change now: this leader applied every change it may have
        (its term's first entry included), so the one-pending-change rule will not refuse."""
        return self.raw.raft.pending_conf_index <= self.applied

    async def wait_recovered(self, timeout_s: float | None = None) -> None:
        """Return once the entries committed before this member started are applied again
        (at once in steady state); ``unavailable`` if that takes longer than the timeout."""
        if self.recovered.is_set():
            return
        try:
            async with asyncio.timeout(timeout_s or self.opts.request_timeout_s):
                await self.recovered.wait()
        except TimeoutError:
            raise errors.replaying(
                f"this member is still replaying its log after a restart (applied "
                f"{self.applied} of {self.recovered_commit})"
            ) from None

    def _note_applied(self) -> None:
        if self.applied >= self.recovered_commit and not self.recovered.is_set():
            self.recovered.set()
            self._end_replay_gc_pause()
            hook = getattr(self.sm, "on_replay_end", None)  # optional StateMachine hook
            if hook is not None:
                hook()
            if self._replay_started is not None:
                started, first = self._replay_started
                log.info(
                    "node %x: replayed the log up to %d (%d entries) in %.2f s",
                    self.id,
                    self.recovered_commit,
                    self.applied - first,
                    time.monotonic() - started,
                )

    def _end_replay_gc_pause(self) -> None:
        if self._gc_paused_for_replay:
            self._gc_paused_for_replay = False
            freeze_heap()
            gc.enable()

    async def read_barrier(self, timeout_s: float | None = None) -> int:
        """Wait until this node's state machine reflects every write acknowledged before the
        call (ReadIndex); return the read index."""
        if self._stopped:
            raise errors.stopping()
        if self._read_new is None:
            self._read_seq += 1
            self._read_new = _ReadBatch(self._read_seq.to_bytes(8, "big") + self._origin)
        fut = asyncio.get_running_loop().create_future()
        self._read_new.waiters.append(fut)
        self._wake.set()
        self._expiry.add(time.monotonic() + (timeout_s or self.opts.request_timeout_s), fut)
        try:
            return await fut
        except Expired:
            if self.leader == 0:
                raise errors.no_leader() from None
            raise errors.timed_out() from None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, handlers: NodeHandlers) -> None:
        """Run the raft task and the ticker; from now on the node calls ``handlers``."""
        self.sm = handlers.state_machine
        self._send = handlers.send
        self.members = handlers.members
        self._on_conf_change = handlers.on_conf_change
        self._on_memory_freed = handlers.on_memory_freed
        if not self.recovered.is_set() and gc.isenabled():
            # Applying the WAL again makes millions of long-lived objects, none in a cycle,
            # and the cyclic GC would walk them again and again: a fifth of a replay's time
            # at a million keys. Paused as for the snapshot's restore, until the replay is
            # done (_note_applied), then what it built is frozen.
            gc.disable()
            self._gc_paused_for_replay = True
        if not self.recovered.is_set():
            self._replay_started = (time.monotonic(), self.applied)
            hook = getattr(self.sm, "on_replay_start", None)  # optional StateMachine hook
            if hook is not None:
                hook()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._guarded(self._run()), name=f"raft-{self.id:x}"),
            loop.create_task(self._guarded(self._apply_loop()), name=f"apply-{self.id:x}"),
            loop.create_task(self._ticker(), name=f"tick-{self.id:x}"),
        ]
        self._learn_snapshot_layout()  # of the snapshot this member started from

    async def stop(self) -> None:
        self._stopped = True
        self._end_replay_gc_pause()
        tasks = list(self._tasks)  # a finished snapshot task removes itself from the list
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for fut in (*self._proposal_waiters.values(), *self._conf_waiters.values()):
            if not fut.done():
                fut.set_exception(errors.stopping())

    async def _ticker(self) -> None:
        interval = self.opts.heartbeat_interval_s
        next_at = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += interval
            now = time.monotonic()
            if next_at < now:  # the loop was stalled: do not burst ticks to catch up
                next_at = now + interval
            self._ticks += 1
            self._wake.set()
            self._expiry.expire(now)

    async def _guarded(self, body) -> None:
        """Run the raft or the apply task; an error that escapes it stops the node."""
        try:
            await body
        except asyncio.CancelledError:
            raise
        except CommitOutOfRangeError as exc:
            # Not a bug to trace: durable state was lost (kvserver.assembly.member says what to do).
            log.error(
                "node %x: raft log lost entries this member had acknowledged (%s); the node stops",
                self.id,
                exc,
            )
            self._fail(exc)
        except Exception as exc:
            log.exception("node %x: raft loop failed; the node stops", self.id)
            self._fail(exc)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._feed_core()
            while self.raw.has_ready():
                await self._handle_ready(self.raw.ready())
                self._feed_core()

    def _fail(self, exc: BaseException) -> None:
        self.failure = exc
        self._stopped = True
        self.failed.set()
        for fut in (*self._proposal_waiters.values(), *self._conf_waiters.values()):
            if not fut.done():
                fut.set_exception(errors.stopping())
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()  # the other of the raft and apply tasks, the ticker, a snapshot

    # --- the raft task -------------------------------------------------------------------

    def _feed_core(self) -> None:
        raw = self.raw
        # Messages before ticks: after a pause the heartbeats that did arrive count before
        # the election timer is advanced, so a follower does not campaign against a leader
        # it has just heard from.
        if self._inbox:
            inbox, self._inbox = self._inbox, []
            holding = self._holding_proposals()
            for m in inbox:
                if holding and m.type == MessageType.MsgProp:
                    self._held_forwarded.append(m)  # see transfer_leadership
                else:
                    self._step(m)
        if self._held_forwarded and not self._holding_proposals():
            held, self._held_forwarded = self._held_forwarded, []
            for m in held:  # a follower's core forwards them to the new leader
                self._step(m)
        ticks, self._ticks = self._ticks, 0
        for _ in range(ticks):
            raw.tick()
        if self._unreachable:
            for peer in self._unreachable:
                raw.report_unreachable(peer)
            self._unreachable.clear()
        if self._snapshot_status:
            for peer, failed in self._snapshot_status:
                raw.report_snapshot(peer, failed)
            self._snapshot_status.clear()
        if self._proposals and not self._holding_proposals():
            proposals, self._proposals = self._proposals, []
            for data in proposals:
                if stages.ON:
                    stages.mark("raft.propose")
                try:
                    raw.propose(data)
                except ProposalDroppedError:
                    self.stats["proposals_failed"] += 1
                    self._fail_proposal(
                        data, errors.no_leader() if self.leader == 0 else errors.leader_changed()
                    )
        if self._conf_proposals:
            confs, self._conf_proposals = self._conf_proposals, []
            for cc in confs:
                try:
                    raw.propose_conf_change(cc)
                except ProposalDroppedError:
                    fut = self._conf_waiters.get(cc.id)
                    if fut is not None and not fut.done():
                        fut.set_exception(
                            errors.no_leader() if self.leader == 0 else errors.leader_changed()
                        )
        self._ask_reads()

    def _holding_proposals(self) -> bool:
        if not self._hold_proposals_until:
            return False
        # Held while this member leads, and after it stepped down until it knows the new
        # leader (a follower's core drops a proposal it has nowhere to forward).
        leading_or_between = self.role == StateType.LEADER or self.leader == 0
        if leading_or_between and time.monotonic() < self._hold_proposals_until:
            return True
        self._hold_proposals_until = 0.0  # leadership moved, or the hold ran out
        self._wake.set()  # feed what waited on the next turn
        return False

    def _step(self, m: Message) -> None:
        """Hand one peer message to the core.

        - A documented ``RaftError`` (a response from a peer no longer tracked, ...) is a
          normal condition: the message is dropped, logged at DEBUG.
        - A ``RaftInvariantError`` propagates and stops the node, as etcd panics: either
          this node's durable state is not what it promised (``CommitOutOfRangeError``: it
          lost acknowledged entries) or the core's invariants broke. Going on could lose
          committed writes.
        - Any other exception is a bug or a malformed message that got past the transport's
          checks: the message is dropped, logged at ERROR, and /health is false for
          ``STEP_ERROR_UNHEALTHY_S`` after it. The node keeps running: stopping it would let
          one bad message take a member down, and raft tolerates a lost message.
        """
        raw = self.raw
        try:
            raw.step(m)
        except RaftInvariantError:
            raise
        except RaftError as exc:
            log.debug("dropped message %s: %s", m, exc)
            return
        except Exception as exc:
            log.error(
                "node %x: dropped message %s: the raft core failed on it", self.id, m, exc_info=True
            )
            self._step_error = (time.monotonic(), f"{type(exc).__name__}: {exc}")
            return
        if (
            m.type == MessageType.MsgHeartbeat
            and m.frm == raw.raft.lead
            and m.term == raw.raft.term
        ):
            self._confirmed_leader = (m.term, m.frm)

    def _fail_proposal(self, data: bytes, error: errors.ServiceError) -> None:
        fut = self._proposal_waiters.get(int.from_bytes(data[8:16], "big"))
        if fut is not None and not fut.done():
            fut.set_exception(error)

    def _ask_reads(self) -> None:
        now = time.monotonic()
        batch = self._read_new
        if batch is not None and not self._read_in_flight(now):
            self._read_new = None
            batch.waiters = [w for w in batch.waiters if not w.done()]
            if batch.waiters:
                self._reads_asked[batch.ctx] = batch
        for ctx in [c for c, b in self._reads_asked.items() if all(w.done() for w in b.waiters)]:
            del self._reads_asked[ctx]  # every reader timed out: stop asking
        for batch in self._reads_asked.values():
            if batch.index is None and now - batch.asked_at >= self.opts.read_retry_s:
                batch.asked_at = now
                try:
                    self.raw.read_index(batch.ctx)
                except ProposalDroppedError:
                    pass  # no leader yet: asked again after read_retry_s, or times out

    def _read_in_flight(self, now: float) -> bool:
        """A read batch was asked less than ``read_retry_s`` ago and has no answer yet. The
        reads that arrive meanwhile wait for it and then share the next round, as etcd's
        linearizable read loop has one ReadIndex round out at a time: a round is a heartbeat
        to every follower and back, and under many readers one per raft turn costs every
        member more than the reads need."""
        return any(
            b.index is None and now - b.asked_at < self.opts.read_retry_s
            for b in self._reads_asked.values()
        )

    async def _handle_ready(self, rd: Ready) -> None:
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state)
        hs = rd.hard_state
        if hs is not None:
            self.term = hs.term
        early: list[Message] = []
        late: list[Message] = []
        # A leader may send appends before its own write completes, unless this Ready also
        # changes its term or vote (a one-voter leader elected within the Ready): those must
        # be durable before anything that depends on them leaves the node.
        vote_changed = hs is not None and (hs.term, hs.vote) != self._durable_term_vote
        for m in rd.messages:
            (early if m.type in _SEND_BEFORE_PERSIST and not vote_changed else late).append(m)
        if stages.ON:
            _mark_ready(rd, early, before_persist=True)
        if early:
            self._send(early)
        await self.storage.persist(rd)
        if stages.ON:
            _mark_ready(rd, late, before_persist=False)
        if hs is not None:
            self._durable_term_vote = (hs.term, hs.vote)
        if late:
            self._send(late)
        if rd.snapshot is not None and not rd.snapshot.is_empty():
            self._enqueue_apply(rd.snapshot)
        if rd.committed_entries:
            self._enqueue_apply(rd.committed_entries)
            last = rd.committed_entries[-1].index
            if any(e.type == EntryType.CONF_CHANGE for e in rd.committed_entries):
                await self._wait_applied(last)
        for rs in rd.read_states:
            batch = self._reads_asked.pop(rs.request_ctx, None)
            if batch is not None:
                batch.index = rs.index
                self._reads_ready.append(batch)
        if rd.read_states and self._read_new is not None:
            self._wake.set()  # the reads that waited for that round: the next one now
        self._serve_reads()
        self.raw.advance(rd)

    def _enqueue_apply(self, item: tuple[Entry, ...] | Snapshot) -> None:
        self._apply_queue.append(item)
        self._apply_wake.set()

    async def _wait_applied(self, index: int) -> None:
        """Wait until the apply task has applied ``index``."""
        if self.applied >= index:
            return
        fut = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((index, fut))
        await fut

    # --- the apply task ------------------------------------------------------------------

    async def _apply_loop(self) -> None:
        queue = self._apply_queue
        while True:
            if not queue:
                await self._apply_wake.wait()
                self._apply_wake.clear()
                continue
            item = queue.popleft()
            if isinstance(item, Snapshot):
                await self._restore_from_leader(item)
            else:
                await self._apply(item)
            self._after_apply()
            # Not while replaying the log after a restart: the entries are in the WAL
            # already, and a snapshot child's copy-on-write faults would slow the replay
            # that keeps this member unhealthy. The first apply after it takes one if due.
            if self.snapshot_may_start(time.monotonic()):
                self._start_snapshot()

    def snapshot_may_start(self, now: float) -> bool:
        """Whether to start the next snapshot at monotonic time ``now``: one is due, none is
        being made, the last one (if big) was kept ``SNAPSHOT_SPACING_S`` ago, the log replayed
        after a restart has been applied, and the layout of the raft storage's snapshot is
        not being looked for (``_learn_snapshot_layout``, tens of milliseconds at most: the
        snapshot waits for it rather than fork)."""
        return (
            self._snapshot_task is None
            and (self._layout_task is None or self._layout_task.done())
            and self.recovered.is_set()
            and now >= self._next_snapshot_at
            and self.snapshot_due()
        )

    def snapshot_due(self) -> bool:
        """Whether enough was applied since the newest snapshot to take the next one: more
        than ``snapshot_count`` entries (etcd's rule), or more than ``snapshot_bytes`` bytes
        of them. etcd restarts from its backend file and replays only the WAL's tail; this
        member restarts from its newest snapshot and replays every entry after it, so the
        bytes bound that replay: a million keys loaded in txns of 128 puts are under 8,000
        entries, and without the bytes rule a restart would apply all of them again."""
        opts = self.opts
        if self.applied - self.snapshot_index > snapshot_threshold(self.id, opts.snapshot_count):
            return True
        return opts.snapshot_bytes > 0 and (
            self.applied_bytes - self._applied_bytes_at_snapshot
            > snapshot_threshold(self.id, opts.snapshot_bytes)
        )

    def _after_apply(self) -> None:
        self._note_applied()
        self._serve_reads()
        if self._applied_waiters:
            still = []
            for index, fut in self._applied_waiters:
                if index <= self.applied:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    still.append((index, fut))
            self._applied_waiters = still

    async def _restore_from_leader(self, snapshot: Snapshot) -> None:
        self.conf_state = snapshot.metadata.conf_state
        await self.restore_snapshot_data(snapshot.data, self.conf_state)
        self.applied = self.snapshot_index = snapshot.metadata.index
        self._applied_bytes_at_snapshot = self.applied_bytes
        log.info("node %x: restored snapshot at index %d from the leader", self.id, self.applied)
        self._learn_snapshot_layout()
        if self._on_memory_freed is not None:
            self._on_memory_freed("snapshot-installed")

    def _on_soft_state(self, ss) -> None:
        if ss.lead != self.leader:
            self.leader_changes += 1
            if ss.lead != 0:
                self.leaders_seen += 1
            log.info("node %x: leader is now %x", self.id, ss.lead)
        was_leader = self.role == StateType.LEADER
        self.leader = ss.lead
        self.role = ss.raft_state
        if was_leader and self.role != StateType.LEADER:
            hook = getattr(self.sm, "on_leader_stop", None)  # optional StateMachine hook
            if hook is not None:
                hook()

    async def _apply(self, entries: tuple[Entry, ...]) -> None:
        origin = self._origin
        waiters = self._proposal_waiters
        clock = time.perf_counter
        yield_at = clock() + _APPLY_SLICE_S
        for e in entries:
            if e.index <= self.applied:
                continue  # already in the snapshot we restored
            self.applied_bytes += len(e.data)
            if e.type == EntryType.NORMAL:
                if e.data:
                    result = self.sm.apply(e.index, e.data[PROPOSAL_HEADER_BYTES:])
                    if type(result) is ApplyInSteps:
                        result = await result.run()
                    if e.data[:8] == origin:
                        fut = waiters.get(int.from_bytes(e.data[8:16], "big"))
                        self.stats["proposals_applied"] += 1
                        if fut is not None and not fut.done():
                            if isinstance(result, Exception):
                                fut.set_exception(result)
                            else:
                                fut.set_result(result)
                elif e.term == self.term and self.is_leader:
                    # The empty entry a new leader appends: once it is applied, everything of
                    # earlier terms is too (etcd promotes its lessor here).
                    hook = getattr(self.sm, "on_leader_start", None)  # optional hook
                    if hook is not None:
                        hook()
            elif e.type == EntryType.CONF_CHANGE:
                self._apply_conf_change(ConfChange.decode(e.data))
            self.applied = e.index
            if clock() > yield_at:
                await asyncio.sleep(0)  # a long catch-up must not starve the raft task
                yield_at = clock() + _APPLY_SLICE_S
        if stages.ON:
            stages.mark("apply.done")

    def _apply_conf_change(self, cc: ConfChange) -> None:
        self.conf_state = self.raw.apply_conf_change(cc)
        if self._on_conf_change is not None:
            self._on_conf_change(cc, self.conf_state)
        fut = self._conf_waiters.get(cc.id) if cc.id else None
        if fut is not None and not fut.done():
            fut.set_result(self.conf_state)

    async def restore_snapshot_data(self, data: bytes, conf_state: ConfState) -> None:
        """Restore the state machine (and the member registry) from a snapshot image."""
        blob, rest = split_members_frame(data)
        await self.sm.install_snapshot(data if blob is None else rest)
        if self.members is not None:
            self.members.restore(blob, conf_state)
        drop_resident_pages(data)

    def _serve_reads(self) -> None:
        if not self._reads_ready:
            return
        still = []
        for batch in self._reads_ready:
            if batch.index is not None and batch.index <= self.applied:
                for fut in batch.waiters:
                    if not fut.done():
                        fut.set_result(batch.index)
            else:
                still.append(batch)
        self._reads_ready = still

    def _start_snapshot(self) -> None:
        """Take a snapshot of the state machine at ``applied`` now, and write it out in a task
        of its own while the apply task goes on (one snapshot at a time).

        What is captured here is what the snapshot holds, and the member registry's image is
        taken in the same step. The state machine's ``snapshot_chunks()`` fixes its content
        at this call (the store's stream reads its live index at the revision of the call,
        see ``kvserver.mvcc.snapshot``); the chunks are produced on the loop, a step per
        turn, and the file is written by the member's snap-writer thread. With
        ``snapshot_in_child`` (``--snapshot-in-child``, the default, where the platform
        allows, unless a child failed before) a forked child (``snap.forked``) serializes the state as it is
        at this call and writes the ``.snap`` file, niced, while this process goes on
        applying; the member then records the file in its WAL. At a million keys that is
        seconds of CPU and 300 MB of writes the member's requests no longer wait behind.
        Either way applies go on meanwhile: with the snapshot made in the apply task, every
        write waited for it."""
        index, conf_state = self.applied, self.conf_state
        if not self._still_newest(index):
            return
        self._snapshot_started = (index, self.applied_bytes)
        metadata = SnapshotMetadata(
            conf_state=conf_state, index=index, term=self.raw_storage.term(index)
        )
        members = frame_members(self.members.snapshot()) if self.members is not None else b""
        head = (members,) if members else ()
        sm, storage = self.sm, self.storage
        body: Awaitable[None] | None = None
        continued = self._continued_chunks()
        if continued is not None:
            body = self._snapshot_continued(metadata, head, continued)
        elif self._snapshot_in_child:

            def work() -> None:  # in the child, whose memory goes when it exits: no spill
                chunks = sm.snapshot_chunks(chunk_size_bytes=CHILD_SNAPSHOT_CHUNK_BYTES)
                parts: list[bytes | memoryview] = [*head, *chunks]
                storage.write_snapshot_file_in_child(metadata, parts)

            try:
                child = ForkedChild.start(work)
                self.snapshot_fork_seconds.observe(child.fork_s)
                body = self._snapshot_by_child(metadata, child)
            except OSError as exc:  # no fork now (memory, process limit): this one on the loop
                log.warning("node %x: snapshot child not started (%s)", self.id, exc)
        if body is None:
            chunks = itertools.chain(head, sm.snapshot_chunks())
            body = self._snapshot_on_loop(metadata, spill_chunks(chunks, storage.spill_dir))
        self._snapshot_task = asyncio.get_running_loop().create_task(
            self._guarded(body), name=f"snapshot-{self.id:x}"
        )
        self._snapshot_task.add_done_callback(self._snapshot_done)
        self._tasks.append(self._snapshot_task)

    def _snapshot_done(self, task: asyncio.Task) -> None:
        self._snapshot_task = None
        self._forget_task(task)
        # One that failed in its child, or ended with more applied meanwhile, is still due:
        # taken now, not at the next apply, which on an idle member may never come.
        if not self._stopped and not task.cancelled() and self.snapshot_may_start(time.monotonic()):
            self._start_snapshot()

    def _forget_task(self, task: asyncio.Task) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    def _continued_chunks(self) -> _Continuation | None:
        """The state machine's image as a continuation of the raft storage's snapshot
        (``snapshot_chunks_after``), or None when it cannot be one: its layout is not known
        (yet), a compaction ran since, or the state machine cannot continue images.

        Why: at a million keys a fork of the member holds its loop for 25-45 ms (the page
        tables) and the first turns after it pay for copy-on-write faults, which is what
        writes crossing a snapshot waited for. Continued, a snapshot costs the loop the
        encoding of the versions since the last one, a step per turn, and a spawned process
        (no fork) copies the earlier file's body into the new file; only the first snapshot
        after a compaction (or the first at all) forks."""
        found = self._snapshot_layout
        continue_after = getattr(self.sm, "snapshot_chunks_after", None)  # optional
        if found is None or continue_after is None or not self._snapshot_incremental:
            return None
        index, offset, layout = found
        snapshot = self.raw_storage.snapshot()
        if snapshot.metadata.index != index or not snapshot.data:
            return None
        learned: list[Any] = []
        chunks = continue_after(
            memoryview(snapshot.data)[offset:], layout, on_layout=learned.append
        )
        if chunks is None:
            return None
        start, end = layout.body_range
        return _Continuation(snapshot.metadata, (offset + start, offset + end), chunks, learned)

    def _learn_snapshot_layout(self) -> None:
        """Find the layout of the raft storage's snapshot (now its newest) in a thread, for
        the next snapshot to continue from (``_continued_chunks``)."""
        layout_of = getattr(self.sm, "snapshot_layout", None)  # optional StateMachine hook
        snapshot = self.raw_storage.snapshot()
        index, data = snapshot.metadata.index, snapshot.data
        if layout_of is None or not self._snapshot_incremental or index == 0 or not data:
            return
        self.snapshot_layout_reads += 1

        def find() -> tuple[int, Any] | None:
            _, rest = split_members_frame(data)
            layout = layout_of(rest)
            drop_resident_pages(data)  # read through the mapping: out of the RSS again
            return None if layout is None else (len(data) - len(rest), layout)

        async def learn() -> None:
            try:
                found = await asyncio.to_thread(find)
            except Exception as exc:  # a damaged frame: the next snapshot is made whole
                log.warning("node %x: snapshot at %d not continuable: %s", self.id, index, exc)
                return
            if found is not None and self.raw_storage.snapshot().metadata.index == index:
                self._snapshot_layout = (index, *found)

        task = asyncio.get_running_loop().create_task(learn(), name=f"snapshot-layout-{self.id:x}")
        self._tasks.append(task)
        task.add_done_callback(self._forget_task)
        self._layout_task = task

    async def _snapshot_continued(
        self, metadata: SnapshotMetadata, head: tuple[bytes, ...], continued: _Continuation
    ) -> None:
        # The new parts (the frames and the stream's header, then the versions since,
        # encoded here a batch per turn) go to an anonymous file, as a whole snapshot's image
        # does; a process of its own then writes the new file from that and from the
        # previous file's body, which the chunks hold as a view of its mapping and this
        # member never reads. Any failure turns continuation off: the next snapshot is made
        # whole, the way that does not depend on the previous file.
        started = time.monotonic()
        parts = SpillFile(self.storage.spill_dir)
        try:
            new: list[bytes] = list(head)
            body = None
            for part in continued.chunks:  # the frames and the header, made in one step
                if isinstance(part, memoryview):
                    body = part
                    break
                new.append(part)
            start, end = continued.source_range
            if body is None or len(body) != end - start:
                raise ValueError("the continued image does not hold the previous body")
            await spill_into(parts, new)
            head_bytes = parts.size
            await spill_into(parts, continued.chunks)
            encoded = time.monotonic()
            child = self.storage.continue_snapshot_file(
                metadata, continued.source, continued.source_range, parts, head_bytes
            )
        except Exception:
            log.exception(
                "node %x: continuing the snapshot failed; snapshots are now made whole", self.id
            )
            self._snapshot_incremental = False
            return
        finally:
            parts.close()  # the writer has its own descriptor
        new_bytes = parts.size
        try:
            await child.wait(SNAPSHOT_CHILD_TIMEOUT_S)
        except ChildFailedError as exc:
            log.error(
                "node %x: continued snapshot at %d failed: %s; snapshots are now made whole",
                self.id,
                metadata.index,
                exc,
            )
            self._snapshot_incremental = False
            return
        if not self._still_newest(metadata.index):
            return
        data = await self.storage.record_snapshot_file(metadata)
        made = (
            f"{len(data) / 2**20:.1f} MiB continued from the snapshot at "
            f"{continued.source.index} ({new_bytes / 2**20:.1f} MiB new, encoded in "
            f"{encoded - started:.2f} s), written by process {child.pid} in "
            f"{time.monotonic() - encoded:.2f} s"
        )
        self._keep_snapshot(metadata, data, made, "continued")
        start, end = continued.source_range
        members_bytes = sum(map(len, head))
        if continued.layout and len(data) == new_bytes + end - start:
            self._adopt_snapshot_layout(metadata.index, members_bytes, continued.layout[0])
        else:
            self._learn_snapshot_layout()

    def _adopt_snapshot_layout(self, index: int, members_bytes: int, layout: Any) -> None:
        """The layout of the snapshot this member just continued, known from making it: the
        next snapshot continues this one without ``_learn_snapshot_layout`` reading the
        whole image back (tens of milliseconds of the interpreter lock at a million keys,
        which every request on the loop waited behind, after every snapshot)."""
        if self.raw_storage.snapshot().metadata.index == index:
            self._snapshot_layout = (index, members_bytes, layout)

    async def _snapshot_by_child(self, metadata: SnapshotMetadata, child: ForkedChild) -> None:
        started = time.monotonic()
        try:
            await child.wait(SNAPSHOT_CHILD_TIMEOUT_S)
        except ChildFailedError as exc:
            # Not a reason to stop the member: its next snapshots are made on the loop.
            log.error(
                "node %x: snapshot at %d failed: %s; snapshots now on the loop",
                self.id,
                metadata.index,
                exc,
            )
            self._snapshot_in_child = False
            return
        if not self._still_newest(metadata.index):
            return  # the file, not recorded in the WAL, is ignored by recovery and purged
        data = await self.storage.record_snapshot_file(metadata)
        made = (
            f"{len(data) / 2**20:.1f} MiB serialized and written by child {child.pid} "
            f"in {time.monotonic() - started:.2f} s (the fork took {child.fork_s * 1000:.0f} ms)"
        )
        self._keep_snapshot(metadata, data, made, "child")
        self._learn_snapshot_layout()

    async def _snapshot_on_loop(
        self, metadata: SnapshotMetadata, spilled: Awaitable[memoryview]
    ) -> None:
        # The image goes to a spill file a batch at a time: never the whole image (hundreds
        # of megabytes at a million keys) in the heap.
        started = time.monotonic()
        image = await spilled
        if not self._still_newest(metadata.index):
            return
        # The file first, from the spilled image; the raft storage then keeps the file's
        # mapping. Until then a follower that needs a snapshot gets the previous one: the
        # log it needs after that is still there, since it is cut only below.
        serialized = time.monotonic()
        data = await self.storage.save_snapshot(metadata, [image])
        made = (
            f"{len(image) / 2**20:.1f} MiB serialized on the loop in {serialized - started:.2f} s, "
            f"written in {time.monotonic() - serialized:.2f} s"
        )
        del image  # unmapped once the file is written
        self._keep_snapshot(metadata, data, made, "loop")
        self._learn_snapshot_layout()

    def _still_newest(self, index: int) -> bool:
        """Whether a snapshot at ``index`` is still newer than the raft storage's (a snapshot
        from the leader may have been installed while this member made its own)."""
        try:
            if index > self.raw_storage.snapshot().metadata.index:
                self.raw_storage.term(index)
                return True
        except (CompactedError, UnavailableError):
            pass
        log.info("node %x: snapshot at %d dropped: a newer one was installed", self.id, index)
        return False

    def _keep_snapshot(
        self, metadata: SnapshotMetadata, data: bytes | memoryview, made: str, how: str
    ) -> None:
        """The snapshot's file is durable and recorded: hand its data to the raft storage
        (for followers that need it) and cut the log behind it."""
        index, conf_state = metadata.index, metadata.conf_state
        try:
            self.raw_storage.create_snapshot(index, conf_state, data)
        except SnapOutOfDateError:  # a snapshot from the leader was installed meanwhile
            log.info("node %x: snapshot at %d dropped: a newer one was installed", self.id, index)
            return
        self.snapshots_made[how] += 1
        self.snapshot_index = max(self.snapshot_index, index)
        if len(data) >= SNAPSHOT_SPACING_MIN_BYTES:
            self._next_snapshot_at = time.monotonic() + SNAPSHOT_SPACING_S
        started_index, started_bytes = self._snapshot_started
        if started_index == index:
            self._applied_bytes_at_snapshot = max(self._applied_bytes_at_snapshot, started_bytes)
        compact_to = self._log_cut(index)
        first = self.raw_storage.first_index()
        if compact_to > first:
            freed = self.raw_storage.data_bytes(first, compact_to)
            self.storage.compact(compact_to)
            log.info(
                "node %x: snapshot at %d: %s (log compacted to %d, %.1f MiB of entries freed)",
                self.id,
                index,
                made,
                compact_to,
                freed / 2**20,
            )
            if self._on_memory_freed is not None and freed >= self.opts.log_cut_trim_min_bytes:
                self._on_memory_freed("log-cut")
        else:  # fewer entries than the catch-up window: keep them all for slow followers
            log.info(
                "node %x: snapshot at %d: %s (log not compacted: it keeps the last %d "
                "entries for slow followers)",
                self.id,
                index,
                made,
                self.opts.snapshot_catchup_entries,
            )

    def _log_cut(self, index: int) -> int:
        """Where to cut the log after a snapshot at ``index``: keep at least the last
        ``snapshot_catchup_entries`` entries, and earlier ones too while everything kept
        totals at most ``snapshot_catchup_bytes``. A follower that was down for a while then
        catches up from the log; cut shorter, it would need the whole snapshot, which at a
        million keys is hundreds of megabytes to send and a store to rebuild. O(log n): the
        log of small puts kept within that budget is hundreds of thousands of entries, and
        walking them on the loop held up every write for 30-40 ms per snapshot."""
        storage = self.raw_storage
        cut = index - self.opts.snapshot_catchup_entries
        first = storage.first_index()
        if cut <= first:
            return cut
        # (never below the first entry: first_index_within answers from first_index() on)
        return min(cut, storage.first_index_within(index + 1, self.opts.snapshot_catchup_bytes))

    @property
    def raw_storage(self):
        return self.storage.raft_storage

    # --- status ----------------------------------------------------------------------------

    def health_problem(self) -> str:
        """Why this node must not report healthy right now ("" when nothing is wrong beyond
        what NodeStatus.healthy checks: a known leader, applied up to commit)."""
        if self.failed.is_set():
            return f"RAFT LOOP FAILED: {self.failure}"
        for check in self.health_checks:
            problem = check()
            if problem:
                return problem
        err = self._step_error
        if err is not None and time.monotonic() - err[0] < STEP_ERROR_UNHEALTHY_S:
            return f"RAFT LOOP FAILING: {err[1]}"
        if (
            self.leader
            and not self.is_leader
            and self._confirmed_leader != (self.raw.raft.term, self.leader)
        ):
            return "RAFT LEADER NOT CONFIRMED"
        return ""

    def caught_up_voters(self) -> list[int]:
        """On the leader: the other voters whose log holds everything committed (a
        leadership transfer to one of them completes within a round trip); [] elsewhere.
        Reads the core's progress without changing it, as /metrics does."""
        if not self.is_leader:
            return []
        st = self.raw.status()
        voters = set(self.conf_state.voters)
        return sorted(
            peer
            for peer, pr in st.progress.items()
            if peer != self.id and peer in voters and pr.match >= st.hard_state.commit
        )

    @property
    def pending_proposals(self) -> int:
        return len(self._proposal_waiters)

    @property
    def is_leader(self) -> bool:
        return self.role == StateType.LEADER

    def status(self) -> dict:
        st = self.raw.status()
        return {
            "id": self.id,
            "leader": self.leader,
            "term": self.term,
            "role": str(self.role),
            "applied": self.applied,
            "committed": st.hard_state.commit,
            "snapshot_index": self.snapshot_index,
            "voters": list(self.conf_state.voters),
            "learners": list(self.conf_state.learners),
        }


def _mark_received(messages: list[Message]) -> None:
    """Stage marks of a peer's appends and acknowledgements (``kvserver.stages``)."""
    for m in messages:
        if m.type == MessageType.MsgApp and m.entries:
            stages.mark("peer.append_recv")
        elif m.type == MessageType.MsgAppResp and not m.reject:
            stages.mark("peer.ack_recv", m.frm)


def _mark_ready(rd: Ready, sent: list[Message], *, before_persist: bool) -> None:
    """Stage marks of a Ready: appends sent (before the write), the write done,
    acknowledgements sent and entries committed (after it)."""
    if before_persist:
        if any(m.type == MessageType.MsgApp and m.entries for m in sent):
            stages.mark("raft.append_sent")
        return
    if rd.entries:
        stages.mark("wal.persisted")
    if any(m.type == MessageType.MsgAppResp for m in sent):
        stages.mark("raft.ack_sent")
    if any(e.type == EntryType.NORMAL and e.data for e in rd.committed_entries):
        stages.mark("raft.committed")
