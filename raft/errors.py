"""Typed errors of the raft core.

Every error the core raises on purpose is one of these. ``RaftInvariantError`` marks a
broken internal invariant or a caller that broke the API contract (the Go library panics
in those places); it subclasses AssertionError so it is never mistaken for a normal
condition to retry.
"""


class RaftError(Exception):
    """Base class of the errors below."""


class ProposalDroppedError(RaftError):
    """A proposal (or a local read request) was not accepted.

    Raised when no leader is known, the leader is transferring leadership, the node was
    removed from the configuration, proposal forwarding is disabled, or the uncommitted-bytes
    bound would be exceeded. The caller may retry later.
    """


class CompactedError(RaftError):
    """The requested index is at or below the storage's compaction point."""


class UnavailableError(RaftError):
    """The requested index is beyond what the storage holds."""


class SnapOutOfDateError(RaftError):
    """The snapshot is not newer than the one the storage already has."""


class StepLocalMsgError(RaftError):
    """A local-only message type (MsgHup, MsgBeat, ...) was passed to ``RawNode.step``."""


class StepPeerNotFoundError(RaftError):
    """A response message came from a peer that is not in the progress tracker."""


class ConfigError(RaftError, ValueError):
    """The Config is invalid (see ``Config.validate``)."""


class ConfChangeError(RaftError, ValueError):
    """A conf change cannot be decoded or cannot be applied."""


class RaftInvariantError(AssertionError):
    """An internal invariant was broken, or the caller violated the API contract."""


class CommitOutOfRangeError(RaftInvariantError):
    """The leader says index ``commit`` is committed, but this node's log ends at
    ``last_index``: the node lost entries it had acknowledged (its log was truncated,
    corrupted or replaced after it answered). The leader only sends a commit index up to
    what the follower acknowledged, so no correct run reaches this. etcd panics here
    ("tocommit(N) is out of range [lastIndex(M)]. Was the raft log corrupted, truncated, or
    lost?"); the caller must stop the node, not drop the message."""

    def __init__(self, commit: int, last_index: int):
        super().__init__(
            f"commit {commit} is out of range [last index {last_index}]: "
            f"was the raft log corrupted, truncated, or lost?"
        )
        self.commit = commit
        self.last_index = last_index
