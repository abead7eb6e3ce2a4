"""RawNode: the caller-facing API of the raft core (etcd's RawNode), plus Status.

The caller feeds it ticks, network messages and requests, and drains its output as Ready
values; see ``Ready``'s docstring for the persist -> send -> apply -> advance contract.
Nothing here does I/O; the caller owns the clock, the disk and the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raft.config import Config
from raft.errors import (
    ConfigError,
    ProposalDroppedError,
    RaftInvariantError,
    StepLocalMsgError,
    StepPeerNotFoundError,
)
from raft.progress import ProgressState
from raft.raft import Raft
from raft.types import (
    LOCAL_MESSAGES,
    NONE,
    RESPONSE_MESSAGES,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Ready,
    SoftState,
    StateType,
)


@dataclass(frozen=True, slots=True)
class ProgressStatus:
    match: int
    next: int
    state: ProgressState
    is_learner: bool
    recent_active: bool
    paused: bool
    pending_snapshot: int
    inflight_count: int
    inflight_bytes: int

    def __str__(self) -> str:
        s = f"{self.state} match={self.match} next={self.next}"
        if self.is_learner:
            s += " learner"
        if self.paused:
            s += " paused"
        if self.pending_snapshot:
            s += f" pendingSnap={self.pending_snapshot}"
        if self.inflight_count:
            s += f" inflight={self.inflight_count}"
        return s


@dataclass(frozen=True, slots=True)
class Status:
    id: int
    hard_state: HardState
    soft_state: SoftState
    applied: int
    conf_state: ConfState
    lead_transferee: int
    progress: dict[int, ProgressStatus] = field(default_factory=dict)  # leader only

    def __str__(self) -> str:
        lines = [
            f"id={self.id} {self.soft_state} {self.hard_state} Applied:{self.applied}",
            f"{self.conf_state}",
        ]
        if self.lead_transferee:
            lines.append(f"LeadTransferee:{self.lead_transferee}")
        lines.extend(f"{i}: {p}" for i, p in sorted(self.progress.items()))
        return "\n".join(lines)


class RawNode:
    def __init__(self, config: Config) -> None:
        self.raft = Raft(config)
        self._prev_soft = self.raft.soft_state()
        self._prev_hard = self.raft.hard_state()
        self._outstanding: Ready | None = None  # the Ready handed out, awaiting advance()

    @property
    def id(self) -> int:
        return self.raft.id

    def bootstrap(self, peers: list[int]) -> None:
        """Initialize a fresh cluster member, etcd-style: ADD_NODE conf-change entries for
        ``peers`` at term 1, indexes 1..n, already committed and applied to the
        configuration. The first Ready carries them (the app persists and applies them;
        applying again through apply_conf_change is harmless)."""
        if not peers:
            raise ConfigError("bootstrap needs at least one peer")
        storage = self.raft.log.storage
        if storage.last_index() != 0:
            raise ConfigError("cannot bootstrap a non-empty storage")
        self._prev_hard = HardState()  # nothing is persisted yet: emit the hard state
        self.raft.become_follower(1, NONE)
        ents = [
            Entry(
                term=1,
                index=i + 1,
                type=EntryType.CONF_CHANGE,
                data=ConfChange(ConfChangeType.ADD_NODE, p).encode(),
            )
            for i, p in enumerate(peers)
        ]
        self.raft.log.append(ents)
        self.raft.log.committed = len(ents)
        for p in peers:
            self.raft.apply_conf_change(ConfChange(ConfChangeType.ADD_NODE, p))

    # --- input ---

    def tick(self) -> None:
        """Advance the logical clock by one tick."""
        self.raft.tick()

    def campaign(self) -> None:
        """Start an election now (a pre-election first if pre_vote is on)."""
        self.raft.step(Message(type=MessageType.MsgHup, to=self.id, frm=self.id))

    def propose(self, data: bytes) -> None:
        """Propose ``data`` for the log; raises ProposalDroppedError if it cannot be taken.

        Success means appended (leader) or forwarded (follower), not committed.
        """
        self._propose(Entry(term=0, index=0, type=EntryType.NORMAL, data=bytes(data)))

    def propose_conf_change(self, cc: ConfChange) -> None:
        """Propose a membership change. The leader turns it into a no-op entry when another
        change is not yet applied (the one-pending-change rule)."""
        self._propose(Entry(term=0, index=0, type=EntryType.CONF_CHANGE, data=cc.encode()))

    def _propose(self, e: Entry) -> None:
        self.raft.step(Message(type=MessageType.MsgProp, to=self.id, frm=self.id, entries=(e,)))

    def step(self, m: Message) -> None:
        """Feed a message from the network.

        Raises StepLocalMsgError for local-only types and StepPeerNotFoundError for a
        response from a node not in the configuration. A forwarded proposal or read request
        that this node cannot serve is dropped silently (its origin times out and retries).
        """
        if m.type in LOCAL_MESSAGES:
            raise StepLocalMsgError(f"{m.type} is local-only")
        if m.type in RESPONSE_MESSAGES and m.frm not in self.raft.tracker.progress:
            raise StepPeerNotFoundError(f"{m.type} from unknown peer {m.frm}")
        try:
            self.raft.step(m)
        except ProposalDroppedError:
            pass

    def read_index(self, ctx: bytes) -> None:
        """Request a linearizable read point for ``ctx`` (unique per request); it arrives as a
        ReadState in a later Ready. Raises ProposalDroppedError when no leader is known."""
        self.raft.step(
            Message(
                type=MessageType.MsgReadIndex,
                to=self.id,
                frm=self.id,
                entries=(Entry(term=0, index=0, data=bytes(ctx)),),
            )
        )

    def transfer_leader(self, to: int) -> None:
        """Ask the leader (directly, or via this follower) to hand leadership to ``to``."""
        self.raft.step(Message(type=MessageType.MsgTransferLeader, to=self.id, frm=to))

    def report_unreachable(self, node_id: int) -> None:
        """The transport failed to reach ``node_id``: the leader stops streaming to it."""
        self.raft.step(Message(type=MessageType.MsgUnreachable, to=self.id, frm=node_id))

    def report_snapshot(self, node_id: int, failed: bool) -> None:
        """The transport finished (or failed) sending a snapshot to ``node_id``."""
        self.raft.step(
            Message(type=MessageType.MsgSnapStatus, to=self.id, frm=node_id, reject=failed)
        )

    def apply_conf_change(self, cc: ConfChange) -> ConfState:
        """Apply a committed conf change (from a committed entry) and return the new ConfState."""
        return self.raft.apply_conf_change(cc)

    # --- output ---

    def has_ready(self) -> bool:
        if self._outstanding is not None:
            return False
        r = self.raft
        ps, ph = self._prev_soft, self._prev_hard
        if r.lead != ps.lead or r.state != ps.raft_state:
            return True
        # (field by field: this runs often and building HardState values is not free)
        if (r.term, r.vote, r.log.committed) != (ph.term, ph.vote, ph.commit) and (
            r.term or r.vote or r.log.committed
        ):
            return True
        return bool(
            r.msgs
            or r.read_states
            or r.log.unstable.entries
            or r.log.has_pending_snapshot()
            or r.log.has_next_committed_entries()
            or r.has_appends_due()
        )

    def ready(self) -> Ready:
        if self._outstanding is not None:
            raise RaftInvariantError("ready() called again before advance()")
        r = self.raft
        r.flush_appends()  # the leader's MsgApps, built once per Ready (see Raft)
        soft = r.soft_state()
        hs = r.hard_state()
        entries = tuple(r.log.unstable.entries)
        snap = r.log.unstable.snapshot
        prev = self._prev_hard
        rd = Ready(
            soft_state=soft if soft != self._prev_soft else None,
            hard_state=hs if hs != prev else None,
            entries=entries,
            snapshot=snap,
            committed_entries=tuple(r.log.next_committed_entries()),
            messages=tuple(r.msgs),
            read_states=tuple(r.read_states),
            must_sync=bool(entries)
            or snap is not None
            or hs.term != prev.term
            or hs.vote != prev.vote,
        )
        r.msgs = []
        r.read_states = []
        self._prev_soft = soft
        self._prev_hard = hs
        self._outstanding = rd
        return rd

    def advance(self, rd: Ready | None = None) -> None:
        """Report the outstanding Ready as persisted, sent and applied."""
        if self._outstanding is None:
            raise RaftInvariantError("advance() without an outstanding Ready")
        if rd is not None and rd is not self._outstanding:
            raise RaftInvariantError("advance() with a Ready that is not the outstanding one")
        rd = self._outstanding
        self._outstanding = None
        r = self.raft
        if rd.committed_entries:
            r.reduce_uncommitted_size(rd.committed_entries)
            r.log.applied_to(rd.committed_entries[-1].index)
        elif rd.snapshot is not None:
            r.log.applied_to(rd.snapshot.metadata.index)
        if rd.snapshot is not None:
            r.log.stable_snap_to(rd.snapshot.metadata.index)
        if rd.entries:
            last = rd.entries[-1]
            r.log.stable_to(last.index, last.term)
            r.on_persisted(last.index, last.term)

    # --- introspection ---

    def status(self) -> Status:
        r = self.raft
        progress: dict[int, ProgressStatus] = {}
        if r.state == StateType.LEADER:
            for node_id, pr in r.tracker.items():
                progress[node_id] = ProgressStatus(
                    match=pr.match,
                    next=pr.next,
                    state=pr.state,
                    is_learner=pr.is_learner,
                    recent_active=pr.recent_active,
                    paused=pr.is_paused(),
                    pending_snapshot=pr.pending_snapshot,
                    inflight_count=pr.inflights.count(),
                    inflight_bytes=pr.inflights.bytes,
                )
        return Status(
            id=r.id,
            hard_state=r.hard_state(),
            soft_state=r.soft_state(),
            applied=r.log.applied,
            conf_state=r.tracker.conf_state(),
            lead_transferee=r.lead_transferee,
            progress=progress,
        )
