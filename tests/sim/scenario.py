"""Scenario: every knob of one simulated run, derived from (seed, nodes) and nothing else.

``Scenario.from_seed(seed, nodes)`` draws the knobs from ``random.Random`` seeded with an
integer built from both arguments, so a run is replayed exactly by the same two numbers.
Times are in ticks unless the name says ``slots`` (a tick is ``TICK_SLOTS`` slots; message
delays are in slots so that messages overtake each other within a tick).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

TICK_SLOTS = 10  # simulation time units (slots) per raft tick


@dataclass(frozen=True, slots=True)
class Scenario:
    seed: int
    nodes: int
    # raft configuration
    election_tick: int
    heartbeat_tick: int
    check_quorum: bool
    pre_vote: bool
    bootstrap: bool  # True: RawNode.bootstrap(peers); False: start from a snapshot at index 1
    max_size_per_msg_bytes: int
    max_inflight_msgs: int
    max_uncommitted_entries_size_bytes: int
    disable_proposal_forwarding: bool
    membership: bool  # the nemesis adds learners, promotes them and removes voters
    # network
    drop_rate: float
    dup_rate: float
    max_delay_slots: int
    long_delay_rate: float  # share of messages delayed up to two election timeouts
    # faults (fault phase), then liveness
    fault_ticks: int
    nemesis_min_ticks: int
    nemesis_max_ticks: int
    max_down: int  # nodes down at once during the fault phase (a minority, or all)
    torn_writes: bool  # a crash keeps a random prefix of the unsynced writes
    disk_latency_slots: int  # 0: persist inside ready(); else writes finish 1..N slots later
    sends_first: bool  # send messages that need no persist before persisting (thesis 10.2.1)
    mid_ready_crash_rate: float  # share of crashes that happen in the middle of a Ready
    full_restart: bool  # the liveness phase crashes and restarts every node first
    liveness_ticks: int
    # application
    snapshot_every: int  # entries applied between application snapshots
    keep_entries: int  # entries kept in the log behind a snapshot (for slow followers)
    # clients
    clients: int
    keys: int
    write_ratio: float
    think_max_ticks: int
    client_timeout_ticks: int

    @classmethod
    def from_seed(cls, seed: int, nodes: int) -> Scenario:
        r = random.Random(seed * 8 + nodes)
        election = r.choice((5, 8, 10))
        quiet = r.random() < 0.1  # a share of runs without network faults
        return cls(
            seed=seed,
            nodes=nodes,
            election_tick=election,
            heartbeat_tick=r.choice((1, 2, 2)),
            check_quorum=r.random() < 0.8,
            pre_vote=r.random() < 0.8,
            bootstrap=r.random() < 0.5,
            max_size_per_msg_bytes=r.choice((0, 64, 256, 1 << 20)),
            max_inflight_msgs=r.choice((1, 2, 4, 256)),
            max_uncommitted_entries_size_bytes=r.choice((0, 0, 0, 128)),
            disable_proposal_forwarding=r.random() < 0.1,
            membership=r.random() < 0.3,
            drop_rate=0.0 if quiet else r.choice((0.0, 0.02, 0.05, 0.1)),
            dup_rate=0.0 if quiet else r.choice((0.0, 0.02, 0.05)),
            max_delay_slots=r.choice((2, 5, 10, 20)),
            long_delay_rate=0.0 if quiet else r.choice((0.0, 0.0, 0.01)),
            fault_ticks=r.randrange(100, 180),
            nemesis_min_ticks=election,
            nemesis_max_ticks=4 * election,
            max_down=nodes if r.random() < 0.3 else (nodes - 1) // 2,
            torn_writes=r.random() < 0.5,
            disk_latency_slots=r.choice((0, 0, 5, 20)),
            sends_first=r.random() < 0.5,
            mid_ready_crash_rate=r.choice((0.0, 0.5)),
            full_restart=r.random() < 0.3,
            liveness_ticks=20 * election + 50,
            snapshot_every=r.choice((4, 8, 16, 1000)),
            keep_entries=r.choice((0, 2, 5)),
            clients=r.randrange(3, 7),
            keys=r.randrange(1, 4),
            write_ratio=r.choice((0.5, 0.7)),
            think_max_ticks=r.choice((1, 2, 4)),
            client_timeout_ticks=3 * election,
        )

    def describe(self) -> str:
        return " ".join(f"{name}={getattr(self, name)}" for name in self.__slots__)
