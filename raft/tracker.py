"""The membership and per-peer progress a node tracks (etcd tracker.ProgressTracker).

Every node keeps the configuration (voters, learners); the Progress values only mean
something on the leader. Votes of the current election are recorded here too. Iteration is
always in ascending id order so that output is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator

from raft.inflights import Inflights
from raft.progress import Progress
from raft.quorum import VoteResult, committed_index, vote_result
from raft.types import ConfState


class ProgressTracker:
    def __init__(self, max_inflight_msgs: int, max_inflight_bytes: int) -> None:
        # invariant: voters and learners are disjoint; progress has exactly their ids
        self.voters: set[int] = set()
        self.learners: set[int] = set()
        self.progress: dict[int, Progress] = {}
        self.votes: dict[int, bool] = {}  # id -> granted, for the current election
        self.max_inflight_msgs = max_inflight_msgs
        self.max_inflight_bytes = max_inflight_bytes

    def new_progress(self, match: int, next_index: int, is_learner: bool) -> Progress:
        return Progress(
            match,
            next_index,
            Inflights(self.max_inflight_msgs, self.max_inflight_bytes),
            is_learner,
        )

    def conf_state(self) -> ConfState:
        return ConfState(voters=tuple(sorted(self.voters)), learners=tuple(sorted(self.learners)))

    def is_singleton(self) -> bool:
        return len(self.voters) == 1

    def ids(self) -> list[int]:
        return sorted(self.progress)

    def items(self) -> Iterator[tuple[int, Progress]]:
        for i in sorted(self.progress):
            yield i, self.progress[i]

    def committed(self) -> int:
        """Largest index replicated on a majority of voters."""
        prs = self.progress
        return committed_index(self.voters, lambda i: prs[i].match if i in prs else 0)

    def quorum_active(self) -> bool:
        """True if a majority of voters was recently active (check quorum)."""
        votes = {i: pr.recent_active for i, pr in self.progress.items() if not pr.is_learner}
        return vote_result(self.voters, votes) == VoteResult.WON

    def reset_votes(self) -> None:
        self.votes = {}

    def record_vote(self, node_id: int, granted: bool) -> None:
        """Record a vote; the first answer of each node in an election counts."""
        self.votes.setdefault(node_id, granted)

    def tally_votes(self) -> tuple[int, int, VoteResult]:
        granted = sum(1 for i in self.voters if self.votes.get(i) is True)
        rejected = sum(1 for i in self.voters if self.votes.get(i) is False)
        return granted, rejected, vote_result(self.voters, self.votes)
