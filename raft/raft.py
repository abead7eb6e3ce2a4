"""The Raft state machine (etcd's ``raft`` struct), without any I/O.

Inputs are ``step(message)`` and ``tick()``; outputs accumulate in ``msgs`` and
``read_states`` and in the log's unstable part, and are collected by RawNode into a Ready.
Each role has its own step and tick functions, swapped on every role change
(``become_follower`` / ``become_pre_candidate`` / ``become_candidate`` / ``become_leader``).

Rules implemented here, by Raft paper/thesis section:

* §5.1 terms: a message with a higher term makes us a follower of that term (except the
  PreVote cases below); messages with a lower term are ignored (or answered, so that a stale
  leader or pre-candidate learns the newer term).
* §5.2 election: followers campaign after a randomized timeout in
  [election_tick, 2*election_tick); one vote per term, persisted in HardState before the
  MsgVoteResp leaves (Ready contract); a candidate wins with a majority of voters.
* §5.3 replication: MsgApp carries (log_term, index) of the preceding entry; followers
  reject on mismatch and the leader walks ``next`` back (with etcd's term-based hint);
  conflicting suffixes are truncated.
* §5.4.1 election restriction: votes only for candidates whose log is at least as
  up-to-date. §5.4.2: the leader commits by counting replicas only entries of its own term;
  it appends an empty entry on election to commit earlier ones.
* thesis §9.6 PreVote, §6.2 CheckQuorum + leader stickiness (votes ignored while a live
  leader is known), §6.4 ReadIndex (SAFE) and lease reads (LEASE_BASED), §3.10 leadership
  transfer (MsgTimeoutNow), §4.2.1 learners, §4.1 single-server membership changes with at
  most one uncommitted/unapplied change.

Messages per round: the leader builds most MsgApps in ``flush_appends()``, which
RawNode calls when it assembles a Ready, rather than where the need arises; each follower
owed one is visited once, with the progress and commit index as they are by then. So all
proposals made between two Readies reach a follower in one MsgApp (more only past
max_size_per_msg_bytes, fewer if the inflight window is full), a burst of acknowledgements
costs at most one commit-only MsgApp per follower per Ready, and
a commit-only MsgApp is skipped when the follower was already sent that commit index
(``Progress.sent_commit``). A heartbeat response from a replicating follower triggers an
empty MsgApp only if what was sent before that heartbeat is still unacknowledged
(``Progress.stalled``: lost messages), not merely because later MsgApps are in flight.

Deviations from etcd, on purpose:

* The leader counts itself towards commit only once its own write is reported durable
  (``on_persisted``, called from RawNode.advance; etcd v3.6 does the same).
* A leader that applies its own removal (or demotion) keeps leading — refusing proposals and
  reads — until a quorum of the new configuration has its whole log and has acknowledged a
  commit index covering the change; then it steps down and sends MsgTimeoutNow to one of
  those voters, so that a new leader is elected without waiting for an election timeout.
  (etcd keeps leading until its server stops it; stepping down at once can leave the rest
  unable to elect anyone.)
* A follower installs a snapshot even if the snapshot's configuration does not list it yet
  (etcd refuses): a joining node may be sent a snapshot taken before it was added; the conf
  change adding it follows in the log.
* A conf change that would leave no voters is ignored by every node (etcd panics).
  Joint consensus is not implemented: ConfChangeV2 proposals become no-op entries.
* Local proposals and read requests that cannot be served raise ProposalDroppedError
  (etcd silently drops a read request without a leader).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from enum import Enum
from random import Random
from typing import Any

from raft import confchange
from raft.config import Config, ReadOnlyOption
from raft.errors import (
    CompactedError,
    ConfChangeError,
    ProposalDroppedError,
    RaftInvariantError,
    UnavailableError,
)
from raft.log import RaftLog
from raft.progress import Progress, ProgressState
from raft.quorum import VoteResult, vote_result
from raft.readonly import ReadOnly
from raft.tracker import ProgressTracker
from raft.types import (
    NONE,
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    ReadState,
    Snapshot,
    SoftState,
    StateType,
    payload_size_bytes,
    vote_response_type,
)

CAMPAIGN_TRANSFER_CONTEXT = b"CampaignTransfer"  # marks MsgVote of a leadership transfer
LEAVING_CONTEXT_PREFIX = b"\x00leaving:"  # heartbeat context of a removed, leaving leader
MAX_PENDING_READ_REQUESTS = 4096  # bound on queued ReadIndex requests on a leader


class CampaignType(Enum):
    PRE_ELECTION = "CampaignPreElection"
    ELECTION = "CampaignElection"
    TRANSFER = "CampaignTransfer"


_CONF_TYPES = (EntryType.CONF_CHANGE, EntryType.CONF_CHANGE_V2)

# After a leader-unreachable hint, a pre-candidate repeats its pre-vote this often (ticks).
PRE_VOTE_RETRY_TICKS = 2


class Raft:
    def __init__(self, config: Config) -> None:
        config.validate()
        self.id = config.id
        self.config = config
        self.logger = config.logger
        self.rng = config.rng if config.rng is not None else Random(config.id)
        self.log = RaftLog(config.storage, config.committed_per_ready_bytes())

        # persistent state (HardState): written by the caller before dependent messages leave
        self.term = 0  # invariant: never decreases
        self.vote = NONE  # invariant: at most one vote per term (reset only on term change)

        self.state = StateType.FOLLOWER
        self.lead = NONE  # leader of the current term, if known
        self.is_learner = False
        self.tracker = ProgressTracker(config.max_inflight_msgs, config.inflight_limit_bytes())
        self.msgs: list[Message] = []  # outbox, drained by RawNode.ready()
        # Leader: followers owed a MsgApp, built by flush_appends() when RawNode assembles
        # the next Ready; id -> whether an empty MsgApp is wanted even if nothing is new.
        self.appends_due: dict[int, bool] = {}
        self.read_states: list[ReadState] = []  # drained by RawNode.ready()
        self.read_only = ReadOnly(config.read_only_option)
        self.pending_read_index_messages: list[Message] = []  # until a current-term commit
        self.lead_transferee = NONE
        # invariant: a conf change may be proposed only when pending_conf_index <= applied
        self.pending_conf_index = 0
        self.uncommitted_size_bytes = 0  # payload appended by this leader, not yet applied
        # A leader that applied its own removal (or demotion) keeps leading only to tell the
        # new configuration that the change committed: leaving_index is its commit index at
        # that point (0 = not leaving); informed holds who acknowledged a commit that high.
        self.leaving_index = 0
        self.informed: set[int] = set()

        self.election_elapsed = 0  # ticks since the last reset (leader: since quorum check)
        self.heartbeat_elapsed = 0  # leader only
        self.election_timeout = config.election_tick
        self.heartbeat_timeout = config.heartbeat_tick
        self.randomized_election_timeout = config.election_tick  # in [et, 2*et)
        # Set by a hint that our leader is unreachable (see _leader_unreachable), until the
        # next reset (a term change or a new role).
        self.leader_lost_hint = False
        self.max_msg_size_bytes = config.max_size_per_msg_bytes
        self.max_uncommitted_size_bytes = config.uncommitted_limit_bytes()
        self.check_quorum = config.check_quorum
        self.pre_vote = config.pre_vote
        self.disable_proposal_forwarding = config.disable_proposal_forwarding

        self._step_fn = self._step_follower
        self._tick_fn = self._tick_election

        hs, cs = config.storage.initial_state()
        confchange.restore(self.tracker, cs, self.log.last_index())
        self._switch_to_config()
        if not hs.is_empty():
            self._load_state(hs)
        if config.applied > 0:
            if self.log.committed < config.applied <= self.log.last_index():
                # The state machine applied entries whose commit index was not yet synced
                # (a commit-only HardState needs no fsync): they were committed, so the
                # commit index may safely catch up with what was applied.
                self.log.commit_to(config.applied)
            self.log.applied_to(config.applied)
        self.become_follower(self.term, NONE)

    # --- small helpers ---------------------------------------------------------------

    def _info(self, msg: str, *args: object) -> None:
        if self.logger is not None:
            self.logger.info("%x " + msg, self.id, *args)

    def soft_state(self) -> SoftState:
        return SoftState(lead=self.lead, raft_state=self.state)

    def hard_state(self) -> HardState:
        return HardState(term=self.term, vote=self.vote, commit=self.log.committed)

    def _load_state(self, hs: HardState) -> None:
        if hs.commit > self.log.last_index():
            raise RaftInvariantError(
                f"hard state commit {hs.commit} is beyond the last index {self.log.last_index()}"
            )
        # A commit index below the storage's snapshot is possible when the commit-only
        # HardState update (not fsynced) was lost: the snapshot itself proves its index is
        # committed, so keep the larger of the two.
        self.log.committed = max(self.log.committed, hs.commit)
        self.term = hs.term
        self.vote = hs.vote

    def _send(self, m: Message) -> None:
        self.msgs.append(m)

    def _msg(self, mtype: MessageType, to: int, **kw: Any) -> Message:
        """A message from us at our current term."""
        return Message(type=mtype, to=to, frm=self.id, term=self.term, **kw)

    def _promotable(self) -> bool:
        """Whether this node may campaign: a voter with no snapshot waiting to be applied."""
        pr = self.tracker.progress.get(self.id)
        return pr is not None and not pr.is_learner and not self.log.has_pending_snapshot()

    def _stable_last_index(self) -> int:
        """Last index of the log prefix that is already durable (in storage)."""
        if self.log.unstable.snapshot is not None:
            return 0
        return min(self.log.storage.last_index(), self.log.unstable.offset - 1)

    def _reset_randomized_election_timeout(self) -> None:
        self.randomized_election_timeout = self.election_timeout + self.rng.randrange(
            self.election_timeout
        )

    def _past_election_timeout(self) -> bool:
        return self.election_elapsed >= self.randomized_election_timeout

    def _committed_entry_in_current_term(self) -> bool:
        return self.log.term_or_zero(self.log.committed) == self.term

    # --- role changes -----------------------------------------------------------------

    def _reset(self, term: int) -> None:
        if self.term != term:
            self.term = term
            self.vote = NONE
        self.lead = NONE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self._reset_randomized_election_timeout()
        self.leader_lost_hint = False
        self.lead_transferee = NONE
        self.tracker.reset_votes()
        last = self.log.last_index()
        stable = self._stable_last_index()
        for node_id, pr in list(self.tracker.progress.items()):
            fresh = self.tracker.new_progress(0, last + 1, pr.is_learner)
            if node_id == self.id:
                fresh.match = stable  # more is acknowledged in on_persisted()
            self.tracker.progress[node_id] = fresh
        self.pending_conf_index = 0
        self.uncommitted_size_bytes = 0
        self.read_only = ReadOnly(self.read_only.option)
        self.pending_read_index_messages = []
        self.leaving_index = 0
        self.informed = set()
        self.appends_due = {}

    def become_follower(self, term: int, lead: int) -> None:
        self._step_fn = self._step_follower
        self._reset(term)
        self._tick_fn = self._tick_election
        self.lead = lead
        self.state = StateType.FOLLOWER
        self._info("became follower at term %d", self.term)

    def become_candidate(self) -> None:
        if self.state == StateType.LEADER:
            raise RaftInvariantError("invalid transition [leader -> candidate]")
        self._step_fn = self._step_candidate
        self._reset(self.term + 1)
        self._tick_fn = self._tick_election
        self.vote = self.id
        self.state = StateType.CANDIDATE
        self._info("became candidate at term %d", self.term)

    def become_pre_candidate(self) -> None:
        if self.state == StateType.LEADER:
            raise RaftInvariantError("invalid transition [leader -> pre-candidate]")
        # A pre-candidate keeps its term and vote: the pre-election changes nothing durable.
        self._step_fn = self._step_candidate
        self.tracker.reset_votes()
        self._tick_fn = self._tick_election
        self.lead = NONE
        self.state = StateType.PRE_CANDIDATE
        self._info("became pre-candidate at term %d", self.term)

    def become_leader(self) -> None:
        if self.state == StateType.FOLLOWER:
            raise RaftInvariantError("invalid transition [follower -> leader]")
        self._step_fn = self._step_leader
        self._reset(self.term)
        self._tick_fn = self._tick_heartbeat
        self.lead = self.id
        self.state = StateType.LEADER
        pr = self.tracker.progress[self.id]
        pr.become_replicate()  # the leader trivially has its own log
        pr.recent_active = True
        # Entries after our committed index may include a conf change we cannot see as
        # applied yet: conservatively block new conf changes until all of them are applied.
        self.pending_conf_index = self.log.last_index()
        # §5.4.2: an entry of the new term lets earlier-term entries commit. Not counted
        # towards the uncommitted-size bound (it is empty anyway).
        if not self._append_entries([Entry(term=0, index=0)]):
            raise RaftInvariantError("empty entry was dropped")
        self._info("became leader at term %d", self.term)

    # --- elections ------------------------------------------------------------------

    def _hup(self, t: CampaignType) -> None:
        if self.state == StateType.LEADER:
            self._info("ignoring MsgHup because already leader")
            return
        if not self._promotable():
            self._info("is unpromotable and can not campaign")
            return
        lo = max(self.log.applied + 1, self.log.first_index())
        if self.log.pending_conf_changes(lo, self.log.committed + 1):
            # Our configuration may be stale until those changes are applied.
            self._info("cannot campaign: committed but unapplied conf changes")
            return
        self._campaign(t)

    def _campaign(self, t: CampaignType) -> None:
        if not self._promotable():
            return
        if t == CampaignType.PRE_ELECTION:
            self.become_pre_candidate()
            vote_type = MessageType.MsgPreVote
            term = self.term + 1  # the term we would use; ours does not change yet
        else:
            self.become_candidate()
            vote_type = MessageType.MsgVote
            term = self.term
        if self._poll(self.id, True) == VoteResult.WON:
            # A single-voter configuration: we win immediately.
            if t == CampaignType.PRE_ELECTION:
                self._campaign(CampaignType.ELECTION)
            else:
                self.become_leader()
            return
        ctx = CAMPAIGN_TRANSFER_CONTEXT if t == CampaignType.TRANSFER else b""
        last_index = self.log.last_index()
        last_term = self.log.last_term()
        for node_id in sorted(self.tracker.voters):
            if node_id == self.id:
                continue
            self._send(
                Message(
                    type=vote_type,
                    to=node_id,
                    frm=self.id,
                    term=term,
                    index=last_index,
                    log_term=last_term,
                    context=ctx,
                )
            )

    def _poll(self, node_id: int, granted: bool) -> VoteResult:
        self.tracker.record_vote(node_id, granted)
        return self.tracker.tally_votes()[2]

    # --- ticks ----------------------------------------------------------------------

    def tick(self) -> None:
        self._tick_fn()

    def _tick_election(self) -> None:
        """Followers and (pre-)candidates: campaign when the randomized timeout passes."""
        self.election_elapsed += 1
        retry_pre_vote = (
            self.leader_lost_hint
            and self.state == StateType.PRE_CANDIDATE
            and self.election_elapsed >= PRE_VOTE_RETRY_TICKS
        )
        if self._promotable() and (self._past_election_timeout() or retry_pre_vote):
            self.election_elapsed = 0
            self.step(Message(type=MessageType.MsgHup, to=self.id, frm=self.id))

    def _tick_heartbeat(self) -> None:
        """Leader: heartbeats every heartbeat_tick; every election_tick check the quorum and
        give up a leadership transfer that did not finish."""
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.election_timeout:
            self.election_elapsed = 0
            # A leaving (removed) leader checks its quorum even without check_quorum: the new
            # configuration may have moved on to a higher term and never contact it again.
            if self.check_quorum or self.leaving_index:
                self.step(Message(type=MessageType.MsgCheckQuorum, to=self.id, frm=self.id))
            if self.state == StateType.LEADER and self.lead_transferee != NONE:
                self._info("leadership transfer to %x timed out", self.lead_transferee)
                self.lead_transferee = NONE
        if self.state != StateType.LEADER:
            return
        if self.heartbeat_elapsed >= self.heartbeat_timeout:
            self.heartbeat_elapsed = 0
            self.step(Message(type=MessageType.MsgBeat, to=self.id, frm=self.id))

    # --- step: term handling common to all roles ---------------------------------------

    def step(self, m: Message) -> None:
        if m.term == 0:
            pass  # local message (or a forwarded proposal / read request)
        elif m.term > self.term:
            if m.type in (MessageType.MsgVote, MessageType.MsgPreVote):
                force = m.context == CAMPAIGN_TRANSFER_CONTEXT
                in_lease = (
                    self.check_quorum
                    and self.lead != NONE
                    and self.election_elapsed < self.election_timeout
                )
                if not force and in_lease:
                    # Leader stickiness (thesis §4.2.3): we heard from a live leader within
                    # the minimum election timeout, so this candidate cannot be legitimate.
                    self._info("ignored %s from %x: lease not expired", m.type, m.frm)
                    return
            if m.type == MessageType.MsgPreVote:
                pass  # never change term because of a pre-vote request
            elif m.type == MessageType.MsgPreVoteResp and not m.reject:
                pass  # a granted pre-vote carries the term we will campaign at
            elif m.type in (MessageType.MsgApp, MessageType.MsgHeartbeat, MessageType.MsgSnap):
                self.become_follower(m.term, m.frm)
            else:
                self.become_follower(m.term, NONE)
        elif m.term < self.term:
            if (self.check_quorum or self.pre_vote) and m.type in (
                MessageType.MsgHeartbeat,
                MessageType.MsgApp,
            ):
                # A stale leader (e.g. just healed from a partition) would never learn our
                # term otherwise: with check_quorum/pre_vote nobody's term bumps it.
                self._send(self._msg(MessageType.MsgAppResp, m.frm))
            elif m.type == MessageType.MsgPreVote:
                # Tell the pre-candidate about our term so it gives up.
                self._send(self._msg(MessageType.MsgPreVoteResp, m.frm, reject=True))
            return

        t = m.type
        if t == MessageType.MsgHup:
            self._hup(CampaignType.PRE_ELECTION if self.pre_vote else CampaignType.ELECTION)
        elif t in (MessageType.MsgVote, MessageType.MsgPreVote):
            self._handle_vote_request(m)
        else:
            self._step_fn(m)

    def _handle_vote_request(self, m: Message) -> None:
        can_vote = (
            self.vote == m.frm  # a repeated request from the node we voted for
            or (self.vote == NONE and self.lead == NONE)  # no vote and no leader this term
            or (m.type == MessageType.MsgPreVote and m.term > self.term)  # a future-term pre-vote
        )
        resp_type = vote_response_type(m.type)
        if can_vote and self._pre_vote_tie_lost_by(m):
            # Not answered (as a voter in its lease does): the rival stays a pre-candidate
            # until our MsgVote makes it a follower, or its own timeout passes.
            self._info(
                "ignored %s from %x: a rival pre-candidate with an equal log; the "
                "lower id goes first",
                m.type,
                m.frm,
            )
            return
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # The response carries the candidate's term: for a pre-vote our term is lower.
            self._send(Message(type=resp_type, to=m.frm, frm=self.id, term=m.term))
            if m.type == MessageType.MsgVote:
                self.election_elapsed = 0
                self.vote = m.frm
        else:
            self._send(self._msg(resp_type, m.frm, reject=True))

    def _pre_vote_tie_lost_by(self, m: Message) -> bool:
        """Whether to withhold a pre-vote from a rival pre-candidate of the same round.

        Two followers of a dead leader that campaign at about the same time would grant each
        other's pre-votes, both win the pre-election, both vote for themselves in the real
        one and split it, and the cluster waits a whole new randomized timeout. Between two
        pre-candidates for the same term whose logs are equally up to date, only the lower id
        gets the pre-vote, so one of them goes on. A rival with a longer log still gets it
        (it is the better leader), one with a shorter log is refused by §5.4.1 anyway.
        Pre-votes decide nothing durable, so this changes timing only, never safety."""
        return (
            m.type == MessageType.MsgPreVote
            and self.state == StateType.PRE_CANDIDATE
            and m.term == self.term + 1
            and m.frm > self.id
            and m.log_term == self.log.last_term()
            and m.index == self.log.last_index()
        )

    # --- leader -----------------------------------------------------------------------

    def _step_leader(self, m: Message) -> None:
        t = m.type
        if t == MessageType.MsgBeat:
            for node_id, peer in self.tracker.progress.items():
                if node_id != self.id and peer.state == ProgressState.REPLICATE:
                    peer.inflight_at_beat = peer.next - 1  # see _handle_heartbeat_response
            self._bcast_heartbeat()
            return
        if t == MessageType.MsgCheckQuorum:
            own = self.tracker.progress.get(self.id)
            if own is not None:
                own.recent_active = True
            if not self.tracker.quorum_active():
                self._info("stepped down to follower since quorum is not active")
                self.become_follower(self.term, NONE)
            for node_id, peer in self.tracker.progress.items():
                if node_id != self.id:
                    peer.recent_active = False
            return
        if t == MessageType.MsgProp:
            self._leader_propose(m)
            return
        if t == MessageType.MsgReadIndex:
            self._leader_read_index(m)
            return

        pr = self.tracker.progress.get(m.frm)
        if pr is None:
            return
        if t == MessageType.MsgAppResp:
            self._handle_append_response(m, pr)
        elif t == MessageType.MsgHeartbeatResp:
            self._handle_heartbeat_response(m, pr)
        elif t == MessageType.MsgSnapStatus:
            if pr.state != ProgressState.SNAPSHOT:
                return
            if m.reject:
                pr.pending_snapshot = 0
            pr.become_probe()
            # Wait for the follower's MsgAppResp (success) or a heartbeat interval (failure)
            # before the next MsgApp.
            pr.msg_app_flow_paused = True
        elif t == MessageType.MsgUnreachable:
            # The transport failed to deliver a MsgApp: stop streaming optimistically.
            if pr.state == ProgressState.REPLICATE:
                pr.become_probe()
        elif t == MessageType.MsgTransferLeader:
            self._handle_transfer_leader(m, pr)

    def _leader_propose(self, m: Message) -> None:
        if not m.entries:
            raise RaftInvariantError("stepped empty MsgProp")
        if self.leaving_index:
            raise ProposalDroppedError("this leader was removed from the configuration")
        if self.lead_transferee != NONE:
            raise ProposalDroppedError(f"leadership is being transferred to {self.lead_transferee}")
        ents = list(m.entries)
        for i, e in enumerate(ents):
            if e.type not in _CONF_TYPES:
                continue
            refuse = ""
            if e.type == EntryType.CONF_CHANGE_V2:
                refuse = "ConfChangeV2 (joint consensus) is not supported"
            elif self.pending_conf_index > self.log.applied:
                refuse = (
                    f"possible unapplied conf change at index {self.pending_conf_index} "
                    f"(applied to {self.log.applied})"
                )
            if refuse:
                # As etcd: keep the slot (so indexes stay as the proposer expects) but make
                # it a no-op; the proposer sees its change never applied.
                self._info("ignoring conf change %s: %s", e, refuse)
                ents[i] = Entry(term=0, index=0)
            else:
                self.pending_conf_index = self.log.last_index() + i + 1
        if not self._append_entries(ents):
            raise ProposalDroppedError("too many uncommitted entry bytes")
        # Sent at the next Ready, together with every other proposal made until then.
        self._bcast_append()

    def _append_entries(self, ents: list[Entry]) -> bool:
        last = self.log.last_index()
        ents = [
            Entry(term=self.term, index=last + 1 + i, type=e.type, data=e.data)
            for i, e in enumerate(ents)
        ]
        if not self._increase_uncommitted_size(ents):
            return False
        self.log.append(ents)
        # The leader acknowledges its own entries once they are durable: on_persisted().
        return True

    def _increase_uncommitted_size(self, ents: list[Entry]) -> bool:
        size = payload_size_bytes(ents)
        if (
            self.uncommitted_size_bytes > 0
            and size > 0
            and self.uncommitted_size_bytes + size > self.max_uncommitted_size_bytes
        ):
            # Always admit a proposal when nothing is uncommitted, so a single large entry
            # cannot block the leader forever.
            return False
        self.uncommitted_size_bytes += size
        return True

    def reduce_uncommitted_size(self, ents: Iterable[Entry]) -> None:
        if self.state != StateType.LEADER:
            return
        size = payload_size_bytes(ents)
        self.uncommitted_size_bytes = max(0, self.uncommitted_size_bytes - size)

    def _maybe_commit(self) -> bool:
        """Advance commit to the quorum-replicated index if it is of our term (§5.4.2)."""
        return self.log.maybe_commit(self.tracker.committed(), self.term)

    def on_persisted(self, index: int, term: int) -> None:
        """The caller made entries up to ``index`` (term ``term``) durable (RawNode.advance).

        A leader counts its own copy towards the commit quorum only now.
        """
        if self.state != StateType.LEADER or not self.log.match_term(index, term):
            return
        pr = self.tracker.progress.get(self.id)
        if pr is not None and pr.maybe_update(index) and self._maybe_commit():
            self._release_pending_read_index_messages()
            self._bcast_append()

    def _handle_append_response(self, m: Message, pr: Progress) -> None:
        pr.recent_active = True
        if m.reject:
            next_probe = m.reject_hint
            if m.log_term > 0:
                # Skip every entry of ours whose term is above the follower's term at the
                # hint: they cannot match (etcd's fast backtracking).
                next_probe = self.log.find_conflict_by_term(m.reject_hint, m.log_term)
            if pr.maybe_decr_to(m.index, next_probe):
                if pr.state == ProgressState.REPLICATE:
                    pr.become_probe()
                self._want_append(m.frm, probe=True)
            return
        # An acknowledgement of exactly ``match`` carries no news about the log, except for a
        # probing follower: it answers a probe sent at ``match``, so the follower has our log
        # up to there and replication can stream again (etcd v3.6; otherwise a caught-up
        # follower that fell back to StateProbe, e.g. after report_unreachable, would stay
        # there and get one MsgApp per round trip).
        recovered = pr.state == ProgressState.PROBE and m.index == pr.match
        if not pr.maybe_update(m.index) and not recovered:
            return
        if pr.state == ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state == ProgressState.SNAPSHOT and pr.match + 1 >= self.log.first_index():
            # The follower caught up past our compaction point (via the snapshot or not):
            # resume normal replication.
            pr.become_probe()
            pr.become_replicate()
        elif pr.state == ProgressState.REPLICATE:
            pr.inflights.free_le(m.index)
        if self._maybe_commit():
            self._release_pending_read_index_messages()
            self._bcast_append()
        else:
            # Flow control may now admit more (size-limited) messages; or the follower may
            # lack the commit index for what it just acknowledged.
            self._want_append(m.frm)
        if m.frm == self.lead_transferee and pr.match == self.log.last_index():
            self._info("sends MsgTimeoutNow to %x after it caught up", m.frm)
            self._flush_append(m.frm)  # keep the order: the commit index first
            self._send(self._msg(MessageType.MsgTimeoutNow, m.frm))

    def _handle_heartbeat_response(self, m: Message, pr: Progress) -> None:
        pr.recent_active = True
        pr.msg_app_flow_paused = False
        if pr.state == ProgressState.PROBE:
            # A probing follower gets a probe (empty if it is caught up): its answer returns
            # it to StateReplicate (see _handle_append_response).
            self._want_append(m.frm, probe=True)
        elif pr.state == ProgressState.REPLICATE:
            if pr.stalled():
                # What we sent before the last heartbeat is still unacknowledged although the
                # follower answers in order: MsgApps (or their answers) may have been lost.
                # Probe with an empty MsgApp at next (a follower lacking what came before
                # rejects it and we back up), making room in a full window for it. Once per
                # heartbeat interval: other heartbeats (reads) may be answered meanwhile.
                pr.inflight_at_beat = 0
                if pr.inflights.full():
                    pr.inflights.free_first_one()
                self._want_append(m.frm, probe=True)
            elif pr.match < self.log.last_index():
                # Acknowledgements are flowing: only entries not yet sent, if any, go out.
                self._want_append(m.frm)
        if self.leaving_index:
            self._leaving_ack(m)
            return
        if self.read_only.option != ReadOnlyOption.SAFE or not m.context:
            return
        acks = self.read_only.recv_ack(m.frm, m.context)
        if acks is None:
            return
        if vote_result(self.tracker.voters, dict.fromkeys(acks, True)) != VoteResult.WON:
            return
        for rs in self.read_only.advance(m.context):
            self._respond_to_read_index(rs.req, rs.index)

    def _handle_transfer_leader(self, m: Message, pr: Progress) -> None:
        transferee = m.frm
        if pr.is_learner:
            self._info("ignored transferring leadership to learner %x", transferee)
            return
        if self.lead_transferee != NONE:
            if self.lead_transferee == transferee:
                return  # already in progress
            self.lead_transferee = NONE  # abort the previous transfer
        if transferee == self.id:
            return  # already leader
        # The transfer must finish within one election timeout (else _tick_heartbeat aborts).
        self.election_elapsed = 0
        self.lead_transferee = transferee
        if pr.match == self.log.last_index():
            self._flush_append(transferee)
            self._send(self._msg(MessageType.MsgTimeoutNow, transferee))
        else:
            # Catch it up first; see _handle_append_response.
            self._want_append(transferee, probe=True)

    # --- leader: sending ----------------------------------------------------------------
    #
    # Most MsgApps are not built where the need arises but by flush_appends(), when RawNode
    # assembles the next Ready: each follower owed one is visited once, with its progress
    # and the commit index as they are by then. A burst of acknowledgements that moves the
    # commit index several times thus costs one commit-only MsgApp per follower, not one per
    # move. Nothing is delayed by this: messages leave only through a Ready anyway.

    def _want_append(self, to: int, probe: bool = False) -> None:
        """Owe ``to`` a MsgApp at the next flush: the entries it lacks (as many messages as
        the size cap and the inflight window allow), else the commit index if that can move
        its commit index, else — with ``probe`` — an empty MsgApp anyway (the answer tells
        us where its log is)."""
        if to != self.id:
            self.appends_due[to] = probe or self.appends_due.get(to, False)

    def _bcast_append(self, probe: bool = False) -> None:
        for node_id in self.tracker.ids():
            self._want_append(node_id, probe)

    def has_appends_due(self) -> bool:
        """Whether flush_appends() would send something (a follower that needs a snapshot
        the storage cannot produce yet is counted although nothing goes out)."""
        last = self.log.last_index()
        committed = self.log.committed
        for to, probe in self.appends_due.items():
            pr = self.tracker.progress.get(to)
            if pr is None or pr.is_paused():
                continue
            if probe or pr.next <= last or pr.can_bump_commit(committed):
                return True
        return False

    def flush_appends(self) -> None:
        """Build the MsgApps owed to followers (RawNode.ready() calls this first)."""
        due, self.appends_due = self.appends_due, {}
        for to in sorted(due):
            self._send_due_append(to, due[to])

    def _flush_append(self, to: int) -> None:
        """Build the MsgApp owed to ``to`` now, ahead of a message that must follow it."""
        probe = self.appends_due.pop(to, None)
        if probe is not None:
            self._send_due_append(to, probe)

    def _send_due_append(self, to: int, probe: bool) -> None:
        pr = self.tracker.progress.get(to)
        if pr is None:
            return  # removed from the configuration meanwhile
        sent = False
        while self._maybe_send_append(to, send_if_empty=False):
            sent = True
        if not sent and (probe or pr.can_bump_commit(self.log.committed)):
            self._maybe_send_append(to, send_if_empty=True)

    def _maybe_send_append(self, to: int, send_if_empty: bool) -> bool:
        """Send entries from ``next`` (or a snapshot) to ``to``; False if nothing was sent."""
        pr = self.tracker.progress[to]
        if pr.is_paused():
            return False
        prev_index = pr.next - 1
        try:
            prev_term = self.log.term(prev_index)
            ents = self.log.entries(pr.next, self.max_msg_size_bytes)
        except CompactedError:
            return self._maybe_send_snapshot(to, pr)
        if not ents and not send_if_empty:
            return False
        self._send(
            self._msg(
                MessageType.MsgApp,
                to,
                index=prev_index,
                log_term=prev_term,
                entries=tuple(ents),
                commit=self.log.committed,
            )
        )
        if ents:
            pr.sent_entries(ents[-1].index, len(ents), payload_size_bytes(ents))
        else:
            pr.sent_entries(prev_index, 0, 0)
        pr.record_sent_commit(self.log.committed)
        return True

    def _maybe_send_snapshot(self, to: int, pr: Progress) -> bool:
        if not pr.recent_active:
            # Do not send a (large) snapshot to a node we have not heard from.
            return False
        try:
            snap = self.log.snapshot()
        except UnavailableError:
            return False  # the caller's storage is still producing one
        if snap.is_empty():
            raise RaftInvariantError("need a non-empty snapshot")
        pr.become_snapshot(snap.metadata.index)
        self._info("sends snapshot at index %d to %x", snap.metadata.index, to)
        self._send(self._msg(MessageType.MsgSnap, to, snapshot=snap))
        return True

    def _bcast_heartbeat(self, ctx: bytes | None = None) -> None:
        if ctx is None:
            ctx = self.read_only.last_pending_request_ctx()
        for node_id, pr in self.tracker.items():
            if node_id == self.id:
                continue
            # Never tell a follower to commit beyond what it is known to have.
            commit = min(pr.match, self.log.committed)
            pr.record_sent_commit(commit)
            if self.leaving_index:
                # The echoed context tells us which commit index the follower has seen.
                ctx = LEAVING_CONTEXT_PREFIX + str(commit).encode()
            self._send(self._msg(MessageType.MsgHeartbeat, node_id, commit=commit, context=ctx))

    # --- leader: reads --------------------------------------------------------------------

    def _leader_read_index(self, m: Message) -> None:
        if len(m.entries) != 1:
            raise RaftInvariantError("MsgReadIndex must carry exactly one entry (the context)")
        if self.leaving_index:
            raise ProposalDroppedError("this leader was removed from the configuration")
        if self.tracker.is_singleton() and self.id in self.tracker.voters:
            self._respond_to_read_index(m, self.log.committed)
            return
        if not self._committed_entry_in_current_term():
            # §6.4 step 1: until an entry of our term commits we may not know the latest
            # commit index. Park the request; released in _release_pending_...().
            if len(self.pending_read_index_messages) >= MAX_PENDING_READ_REQUESTS:
                raise ProposalDroppedError("too many pending read requests")
            self.pending_read_index_messages.append(m)
            return
        self._send_read_index_response(m)

    def _send_read_index_response(self, m: Message) -> None:
        if self.read_only.option == ReadOnlyOption.SAFE:
            if len(self.read_only.queue) >= MAX_PENDING_READ_REQUESTS:
                raise ProposalDroppedError("too many pending read requests")
            ctx = m.entries[0].data
            self.read_only.add_request(self.log.committed, m)
            self.read_only.recv_ack(self.id, ctx)
            self._bcast_heartbeat(ctx)
        else:  # LEASE_BASED: valid while check_quorum keeps our lease
            self._respond_to_read_index(m, self.log.committed)

    def _respond_to_read_index(self, req: Message, index: int) -> None:
        if req.frm in (NONE, self.id):
            self.read_states.append(ReadState(index=index, request_ctx=req.entries[0].data))
        else:
            self._send(
                self._msg(MessageType.MsgReadIndexResp, req.frm, index=index, entries=req.entries)
            )

    def _release_pending_read_index_messages(self) -> None:
        if not self.pending_read_index_messages or not self._committed_entry_in_current_term():
            return
        msgs, self.pending_read_index_messages = self.pending_read_index_messages, []
        for m in msgs:
            try:
                self._send_read_index_response(m)
            except ProposalDroppedError:
                self._info("dropped read request: too many pending")

    def _leaving_ack(self, m: Message) -> None:
        if not m.context.startswith(LEAVING_CONTEXT_PREFIX):
            return
        try:
            seen = int(m.context[len(LEAVING_CONTEXT_PREFIX) :])
        except ValueError:
            return
        if seen >= self.leaving_index:
            self.informed.add(m.frm)
        last = self.log.last_index()
        ready = {
            i
            for i in self.informed
            if i in self.tracker.voters and self.tracker.progress[i].match == last
        }
        if vote_result(self.tracker.voters, dict.fromkeys(ready, True)) == VoteResult.WON:
            # Hand over rather than leave the others to wait an election timeout: each voter
            # in ``ready`` has our whole log, so it can win; it campaigns at once (a
            # transfer). Should it refuse (e.g. it has not applied the change yet), the
            # others time out as usual.
            to = min(ready)
            self._info("new configuration knows it committed; stepping down, %x takes over", to)
            self._send(self._msg(MessageType.MsgTimeoutNow, to))
            self.become_follower(self.term, NONE)

    # --- candidate ------------------------------------------------------------------------

    def _step_candidate(self, m: Message) -> None:
        # Only answers to our current kind of campaign count (a stale MsgVoteResp must not
        # count in a pre-election and vice versa).
        my_resp = (
            MessageType.MsgPreVoteResp
            if self.state == StateType.PRE_CANDIDATE
            else MessageType.MsgVoteResp
        )
        t = m.type
        if t == MessageType.MsgProp:
            raise ProposalDroppedError("no leader (campaigning)")
        if t == MessageType.MsgApp:
            self.become_follower(m.term, m.frm)  # §5.2: a leader of our term exists
            self._handle_append_entries(m)
        elif t == MessageType.MsgHeartbeat:
            self.become_follower(m.term, m.frm)
            self._handle_heartbeat(m)
        elif t == MessageType.MsgSnap:
            self.become_follower(m.term, m.frm)
            self._handle_snapshot(m)
        elif t == my_resp:
            result = self._poll(m.frm, not m.reject)
            if result == VoteResult.WON:
                if self.state == StateType.PRE_CANDIDATE:
                    self._campaign(CampaignType.ELECTION)
                else:
                    self.become_leader()
                    self._bcast_append(probe=True)
            elif result == VoteResult.LOST:
                # A MsgPreVoteResp with a higher term already made us a follower in step();
                # here our term is unchanged.
                self.become_follower(self.term, NONE)
        elif t == MessageType.MsgReadIndex:
            raise ProposalDroppedError("no leader (campaigning)")
        # MsgTimeoutNow and anything else: ignored.

    # --- follower -------------------------------------------------------------------------

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t == MessageType.MsgProp:
            if self.lead == NONE:
                raise ProposalDroppedError("no leader")
            if self.disable_proposal_forwarding:
                raise ProposalDroppedError("proposal forwarding is disabled")
            self._send(replace(m, to=self.lead))
        elif t == MessageType.MsgApp:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_append_entries(m)
        elif t == MessageType.MsgHeartbeat:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_heartbeat(m)
        elif t == MessageType.MsgSnap:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_snapshot(m)
        elif t == MessageType.MsgTransferLeader:
            if self.lead == NONE:
                self._info("no leader; dropping leader transfer request")
                return
            self._send(replace(m, to=self.lead))
        elif t == MessageType.MsgTimeoutNow:
            # A transfer: campaign now, without pre-vote (we know the leader is alive and
            # wants us to take over, so there is no partition to protect against).
            self._info("received MsgTimeoutNow from %x; campaigning", m.frm)
            self._hup(CampaignType.TRANSFER)
        elif t == MessageType.MsgReadIndex:
            if self.lead == NONE:
                raise ProposalDroppedError("no leader")
            self._send(replace(m, to=self.lead))
        elif t == MessageType.MsgReadIndexResp:
            if len(m.entries) != 1:
                self._info("invalid MsgReadIndexResp from %x", m.frm)
                return
            self.read_states.append(ReadState(index=m.index, request_ctx=m.entries[0].data))
        elif t == MessageType.MsgUnreachable:
            if self.lead != NONE and m.frm == self.lead:
                self._leader_unreachable()

    def _leader_unreachable(self) -> None:
        """The transport lost its connection to our leader (its process most likely died).

        Campaign as soon as the voters' leases allow, instead of waiting out a randomized
        timeout of up to two election timeouts: the timeout becomes ``et + 1 + j`` ticks with
        ``j`` drawn below ``et / 2``. The ``+ 1`` lets the other followers, which heard the
        same last heartbeat, leave their lease (CheckQuorum: a voter refuses pre-votes for
        ``et`` ticks after hearing from a leader); the jitter keeps two followers of a dead
        leader from campaigning on the same tick (a split vote costs a whole new timeout).

        Only timing changes, so no safety property depends on it. A spurious hint (the
        leader is alive, the connection just broke) disrupts nothing: the leader's next
        heartbeat resets ``election_elapsed``, and a premature pre-vote is refused by voters
        that still hear from the leader."""
        quick = self.election_timeout + 1 + self.rng.randrange(max(1, self.election_timeout // 2))
        self.randomized_election_timeout = min(self.randomized_election_timeout, quick)
        # A pre-vote that reaches a voter still in its lease is ignored, not answered: after
        # the hint, a pre-candidate asks again every PRE_VOTE_RETRY_TICKS instead of waiting
        # out another whole timeout. Pre-votes change no term and no vote, so asking often
        # while there is no leader disturbs nobody.
        self.leader_lost_hint = True

    def _handle_append_entries(self, m: Message) -> None:
        if m.index < self.log.committed:
            # Everything up to our commit index matches the leader's log already.
            self._send(self._msg(MessageType.MsgAppResp, m.frm, index=self.log.committed))
            return
        last_new = self.log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self._send(self._msg(MessageType.MsgAppResp, m.frm, index=last_new))
            return
        # §5.3: reject; hint the leader at the last index that could match, and our term
        # there, so it can skip a whole term of mismatching entries per round trip.
        hint_index = min(m.index, self.log.last_index())
        hint_index = self.log.find_conflict_by_term(hint_index, m.log_term)
        hint_term = self.log.term_or_zero(hint_index)
        self._send(
            self._msg(
                MessageType.MsgAppResp,
                m.frm,
                index=m.index,
                reject=True,
                reject_hint=hint_index,
                log_term=hint_term,
            )
        )

    def _handle_heartbeat(self, m: Message) -> None:
        self.log.commit_to(m.commit)
        self._send(self._msg(MessageType.MsgHeartbeatResp, m.frm, context=m.context))

    def _handle_snapshot(self, m: Message) -> None:
        if m.snapshot is not None and self._restore(m.snapshot):
            self._send(self._msg(MessageType.MsgAppResp, m.frm, index=self.log.last_index()))
        else:
            self._send(self._msg(MessageType.MsgAppResp, m.frm, index=self.log.committed))

    def _restore(self, snap: Snapshot) -> bool:
        """Install ``snap`` if it is ahead of our commit index; True if installed."""
        meta = snap.metadata
        if meta.index <= self.log.committed:
            return False
        if self.state != StateType.FOLLOWER:
            # Only a leader sends snapshots and we step down on its messages: unreachable.
            self.become_follower(self.term + 1, NONE)
            return False
        # Unlike etcd we accept a snapshot whose configuration does not include us: a node
        # that is joining may be sent a snapshot taken before it was added; the conf change
        # that adds it follows in the log. (Nothing here needs us in the tracker.)
        cs = meta.conf_state
        if self.log.match_term(meta.index, meta.term):
            # We already have the snapshot's last entry: just fast-forward the commit index.
            self.log.commit_to(meta.index)
            return False
        self.log.restore(snap)
        confchange.restore(self.tracker, cs, self.log.last_index())
        self._switch_to_config()
        self._info("restored snapshot at index %d term %d", meta.index, meta.term)
        return True

    # --- membership -----------------------------------------------------------------------

    def apply_conf_change(self, cc: ConfChange) -> ConfState:
        """Apply a committed conf change to the configuration; returns the new ConfState.

        A change that would leave no voters is ignored (every node ignores it alike).
        """
        try:
            confchange.apply_change(self.tracker, cc, self.log.last_index())
        except ConfChangeError as e:
            self._info("ignoring conf change %s: %s", cc, e)
            return self.tracker.conf_state()
        return self._switch_to_config()

    def _switch_to_config(self) -> ConfState:
        cs = self.tracker.conf_state()
        pr = self.tracker.progress.get(self.id)
        self.is_learner = pr is not None and pr.is_learner
        if self.state != StateType.LEADER:
            return cs
        if (pr is None or self.is_learner) and not self.leaving_index:
            # This leader was removed (or demoted). The remaining voters cannot use the new
            # configuration before they learn that it committed, and only we can tell them:
            # stepping down now could leave them unable to elect anyone (our log may be
            # longer than theirs, and we no longer campaign). So keep leading, refusing
            # proposals and reads, until a quorum of the new configuration has our whole log
            # and has acknowledged our commit index; then step down (_leaving_ack).
            self._maybe_commit()
            self.leaving_index = self.log.committed
            self.lead_transferee = NONE
            self._info("removed from the configuration; leaving once it is known committed")
            self._bcast_append()
            self._bcast_heartbeat()
            return cs
        # The quorum may have shrunk (entries may now be committed); a new follower needs
        # everything.
        self._maybe_commit()
        self._bcast_append()
        if self.lead_transferee != NONE and self.lead_transferee not in self.tracker.voters:
            self.lead_transferee = NONE
        return cs
