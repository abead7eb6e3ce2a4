"""Configuration of one raft node (mirrors etcd raft.Config).

All timing is in ticks: the caller decides how long a tick is. Randomness (the election
timeout jitter) comes only from ``rng``; two nodes built with equal configs and equal rng
seeds behave identically, which is what makes the simulator reproducible.

``applied`` (restart only): entries up to it are not handed out again. The configuration is
read from ``storage.initial_state()`` (the snapshot's ConfState); conf changes applied after
the snapshot are not replayed when ``applied`` skips them, so the caller must either leave
``applied`` at the snapshot index (and re-apply, idempotently) or call
``RawNode.apply_conf_change`` again for those entries after construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from random import Random
from typing import Any

from raft.errors import ConfigError
from raft.storage import Storage

NO_LIMIT = 1 << 63  # stands for "unlimited" in size/byte bounds


class ReadOnlyOption(IntEnum):
    SAFE = 0  # ReadIndex confirmed by a quorum heartbeat round
    LEASE_BASED = 1  # leader answers from its lease; relies on bounded clock drift

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Config:
    id: int
    storage: Storage
    election_tick: int = 10  # followers campaign after [election_tick, 2*election_tick) ticks
    heartbeat_tick: int = 1  # the leader sends heartbeats every heartbeat_tick ticks
    applied: int = 0  # last applied index when restarting (0 = from the storage's snapshot)
    max_size_per_msg_bytes: int = 1 << 20  # MsgApp entry bytes cap (0: one entry per message)
    max_committed_size_per_ready_bytes: int = 0  # 0 = max_size_per_msg_bytes
    max_uncommitted_entries_size_bytes: int = 0  # leader's bound on unapplied payload; 0 = none
    max_inflight_msgs: int = 256  # MsgApps in flight per follower in replicate state
    max_inflight_bytes: int = 0  # payload bytes in flight per follower; 0 = unlimited
    check_quorum: bool = False  # leader steps down without a recently active quorum
    pre_vote: bool = False  # run a pre-election before disrupting the cluster with a new term
    read_only_option: ReadOnlyOption = ReadOnlyOption.SAFE
    disable_proposal_forwarding: bool = False  # followers refuse proposals instead
    rng: Random | None = None  # None -> Random(id)
    logger: Any = None  # a logging.Logger-like object, or None for silence

    def validate(self) -> None:
        """Raise ConfigError when the configuration cannot work."""
        if self.id <= 0:
            raise ConfigError("id must be a positive integer (0 means 'none')")
        if self.storage is None:
            raise ConfigError("storage is required")
        if self.heartbeat_tick <= 0:
            raise ConfigError("heartbeat_tick must be greater than 0")
        if self.election_tick <= self.heartbeat_tick:
            raise ConfigError("election_tick must be greater than heartbeat_tick")
        if self.applied < 0:
            raise ConfigError("applied must not be negative")
        for name in (
            "max_size_per_msg_bytes",
            "max_committed_size_per_ready_bytes",
            "max_uncommitted_entries_size_bytes",
            "max_inflight_bytes",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        if self.max_inflight_msgs <= 0:
            raise ConfigError("max_inflight_msgs must be greater than 0")
        if 0 < self.max_inflight_bytes < self.max_size_per_msg_bytes:
            raise ConfigError("max_inflight_bytes must be >= max_size_per_msg_bytes")
        if self.read_only_option == ReadOnlyOption.LEASE_BASED and not self.check_quorum:
            raise ConfigError("read_only_option LEASE_BASED requires check_quorum")
        if self.rng is not None and not isinstance(self.rng, Random):
            raise ConfigError("rng must be a random.Random instance")

    # Resolved views used by the core (0 meaning "unlimited"/"default" turned into numbers).

    def uncommitted_limit_bytes(self) -> int:
        return self.max_uncommitted_entries_size_bytes or NO_LIMIT

    def committed_per_ready_bytes(self) -> int:
        return self.max_committed_size_per_ready_bytes or self.max_size_per_msg_bytes

    def inflight_limit_bytes(self) -> int:
        return self.max_inflight_bytes or NO_LIMIT
