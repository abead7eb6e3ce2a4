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
