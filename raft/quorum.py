"""Majority quorums: the committed index and the outcome of a vote.

Only simple majority configurations are used (no joint consensus). An empty voter set
behaves as etcd's: it commits everything and wins every vote, so callers must not ask an
empty configuration to decide anything real.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from enum import IntEnum

NO_LIMIT_INDEX = (1 << 64) - 1


class VoteResult(IntEnum):
    PENDING = 0
    LOST = 1
    WON = 2

    def __str__(self) -> str:
        return ("VotePending", "VoteLost", "VoteWon")[self.value]


def majority(n: int) -> int:
    return n // 2 + 1


def committed_index(voters: Collection[int], acked: Callable[[int], int]) -> int:
    """Largest index acknowledged by a majority of ``voters`` (missing acks count as 0)."""
    if not voters:
        return NO_LIMIT_INDEX
    indexes = sorted((acked(v) for v in voters), reverse=True)
    # The majority(n)-th highest index is held by at least majority(n) voters.
    return indexes[majority(len(indexes)) - 1]


def vote_result(voters: Collection[int], votes: Mapping[int, bool]) -> VoteResult:
    """WON when a majority granted, LOST when a majority can no longer grant, else PENDING."""
    if not voters:
        return VoteResult.WON
    granted = rejected = 0
    for v in voters:
        vote = votes.get(v)
        if vote is None:
            continue
        if vote:
            granted += 1
        else:
            rejected += 1
    q = majority(len(voters))
    if granted >= q:
        return VoteResult.WON
    if len(voters) - rejected < q:
        return VoteResult.LOST
    return VoteResult.PENDING
