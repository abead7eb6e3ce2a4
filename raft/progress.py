"""A leader's view of one follower's log (etcd tracker.Progress).

States:

* PROBE — the leader does not know where the follower's log ends; it sends one MsgApp per
  heartbeat interval (``msg_app_flow_paused`` after each) and walks ``next`` back on rejects.
* REPLICATE — the follower accepted entries; the leader streams MsgApps optimistically
  (``next`` advances on send), limited by the inflight window.
* SNAPSHOT — the follower needs a snapshot; nothing else is sent until it reports back.

Two marks let the leader skip messages that would tell the follower nothing new:
``sent_commit`` is the highest commit index sent to it (etcd's sentCommit; lowered again
when ``next`` moves back, as those messages were probably lost), so a commit-only MsgApp
is sent only when it can move the follower's commit index (``can_bump_commit``);
``inflight_at_beat`` is the last index that was in flight when the latest periodic heartbeat
went out, so a heartbeat response probes a replicating follower with an empty MsgApp only
if what was sent before that heartbeat is still unacknowledged (``stalled``). A follower
answers messages in order, so those acknowledgements normally arrive before the heartbeat
response; MsgApps sent after the heartbeat are simply still in flight.
"""

from __future__ import annotations

from enum import IntEnum

from raft.inflights import Inflights


class ProgressState(IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2

    def __str__(self) -> str:
        return ("StateProbe", "StateReplicate", "StateSnapshot")[self.value]


class Progress:
    __slots__ = (
        "match",
        "next",
        "state",
        "pending_snapshot",
        "recent_active",
        "msg_app_flow_paused",
        "inflights",
        "is_learner",
        "sent_commit",
        "inflight_at_beat",
    )

    def __init__(
        self, match: int, next_index: int, inflights: Inflights, is_learner: bool = False
    ) -> None:
        # invariant: 0 <= match < next
        self.match = match  # highest index known replicated on the follower
        self.next = next_index  # next index to send
        self.state = ProgressState.PROBE
        self.pending_snapshot = 0  # index of the snapshot being sent (SNAPSHOT state)
        self.recent_active = False  # heard from since the last check-quorum round
        self.msg_app_flow_paused = False  # PROBE: a probe is out, wait for an answer
        self.inflights = inflights
        self.is_learner = is_learner
        self.sent_commit = 0  # highest commit index sent (MsgApp, MsgHeartbeat, MsgSnap)
        self.inflight_at_beat = 0  # REPLICATE: next - 1 when the last heartbeat went out

    def __str__(self) -> str:
        s = f"{self.state} match={self.match} next={self.next}"
        if self.is_learner:
            s += " learner"
        if self.is_paused():
            s += " paused"
        if self.pending_snapshot:
            s += f" pendingSnap={self.pending_snapshot}"
        if not self.recent_active:
            s += " inactive"
        n = self.inflights.count()
        if n:
            s += f" inflight={n}"
            if self.inflights.full():
                s += "[full]"
        return s

    def _reset_state(self, state: ProgressState) -> None:
        self.msg_app_flow_paused = False
        self.pending_snapshot = 0
        self.state = state
        self.inflights.reset()
        self.inflight_at_beat = 0

    def become_probe(self) -> None:
        if self.state == ProgressState.SNAPSHOT:
            # Resume after the snapshot even if the follower has not confirmed it yet.
            pending = self.pending_snapshot
            self._reset_state(ProgressState.PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self._reset_state(ProgressState.PROBE)
            self.next = self.match + 1
        # What was sent beyond next probably did not arrive, nor the commit index it carried.
        self.sent_commit = min(self.sent_commit, self.next - 1)

    def become_replicate(self) -> None:
        self._reset_state(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, snapshot_index: int) -> None:
        self._reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index
        self.sent_commit = snapshot_index  # a snapshot is committed up to its index

    def maybe_update(self, n: int) -> bool:
        """An acknowledgement of index ``n``; True if it raised ``match``."""
        updated = False
        if self.match < n:
            self.match = n
            updated = True
            self.msg_app_flow_paused = False
        self.next = max(self.next, n + 1)
        return updated

    def sent_entries(self, last_index: int, entries: int, size_bytes: int) -> None:
        """Account for a MsgApp carrying ``entries`` entries ending at ``last_index``."""
        if self.state == ProgressState.REPLICATE:
            if entries:
                self.next = last_index + 1
                self.inflights.add(last_index, size_bytes)
        elif self.state == ProgressState.PROBE:
            self.msg_app_flow_paused = True

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of the MsgApp whose previous index was ``rejected``; True if it was
        not stale and ``next`` moved back (to at most ``match_hint + 1``)."""
        if self.state == ProgressState.REPLICATE:
            if rejected <= self.match:
                return False  # stale: we already know the follower has it
            self.next = self.match + 1
        else:
            if self.next - 1 != rejected:
                return False  # stale: not the probe we are waiting for
            self.next = max(min(rejected, match_hint + 1), self.match + 1, 1)
            self.msg_app_flow_paused = False
        self.sent_commit = min(self.sent_commit, self.next - 1)  # as in become_probe
        return True

    def record_sent_commit(self, commit: int) -> None:
        """A message carrying commit index ``commit`` was sent."""
        self.sent_commit = max(self.sent_commit, commit)

    def can_bump_commit(self, commit: int) -> bool:
        """Whether an empty MsgApp with ``commit`` could raise the follower's commit index:
        it moves it to at most ``next - 1``, and what we sent so far may already do that."""
        return commit > self.sent_commit and self.sent_commit < self.next - 1

    def stalled(self) -> bool:
        """Whether entries sent before the latest periodic heartbeat are still unacknowledged
        (REPLICATE): those MsgApps or their answers may have been lost."""
        return self.match < self.inflight_at_beat

    def is_paused(self) -> bool:
        if self.state == ProgressState.PROBE:
            return self.msg_app_flow_paused
        if self.state == ProgressState.REPLICATE:
            return self.inflights.full()
        return True  # SNAPSHOT
