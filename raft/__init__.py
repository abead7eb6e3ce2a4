"""raft: a sans-I/O Raft consensus core modelled on etcd-io/raft.

A deterministic state machine: it never touches sockets, files, threads, clocks or the global
random generator. The caller ticks it, steps network messages into it, and drains ``Ready``
values (persist -> send -> apply -> ``advance()``; see ``Ready``'s docstring).

Modules: types (values, enums, Ready), errors, storage (Storage protocol, MemoryStorage),
config, unstable + log (the raft log), inflights + progress (per-follower flow control),
quorum + tracker (majorities, membership), confchange (single-node membership changes),
readonly (ReadIndex bookkeeping), raft (the state machine), rawnode (the API).
"""

from raft.config import NO_LIMIT, Config, ReadOnlyOption
from raft.errors import (
    CompactedError,
    ConfChangeError,
    ConfigError,
    ProposalDroppedError,
    RaftError,
    RaftInvariantError,
    SnapOutOfDateError,
    StepLocalMsgError,
    StepPeerNotFoundError,
    UnavailableError,
)
from raft.progress import ProgressState
from raft.rawnode import ProgressStatus, RawNode, Status
from raft.storage import MemoryStorage, Storage
from raft.types import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    ReadState,
    Ready,
    Snapshot,
    SnapshotMetadata,
    SoftState,
    StateType,
)

__all__ = [
    "NONE",
    "NO_LIMIT",
    "CompactedError",
    "ConfChange",
    "ConfChangeError",
    "ConfChangeType",
    "ConfState",
    "Config",
    "ConfigError",
    "Entry",
    "EntryType",
    "HardState",
    "MemoryStorage",
    "Message",
    "MessageType",
    "ProgressState",
    "ProgressStatus",
    "ProposalDroppedError",
    "RaftError",
    "RaftInvariantError",
    "RawNode",
    "ReadOnlyOption",
    "ReadState",
    "Ready",
    "SnapOutOfDateError",
    "Snapshot",
    "SnapshotMetadata",
    "SoftState",
    "StateType",
    "Status",
    "StepLocalMsgError",
    "StepPeerNotFoundError",
    "Storage",
    "UnavailableError",
]
