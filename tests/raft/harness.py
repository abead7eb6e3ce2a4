"""A small in-test network of RawNodes over MemoryStorage, for the raft unit/paper tests.

Every Ready is handled the way the contract says a simple driver must: persist (snapshot,
entries, hard state) into the node's MemoryStorage, queue the messages, apply committed
entries (conf changes via apply_conf_change), then advance. Messages sit in ``queue`` until
``deliver()``; filters drop traffic between chosen pairs or of chosen types. Deterministic:
node ids are visited in ascending order and each node's rng is seeded from ``seed``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from raft import (
    ConfChange,
    Config,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    RawNode,
    ReadState,
    Ready,
    StateType,
    StepPeerNotFoundError,
)


class ConfMemoryStorage(MemoryStorage):
    """MemoryStorage whose initial configuration can be given without a snapshot (etcd's
    test storage ``withPeers``), so logs can start at index 1 as in the paper's figures."""

    def __init__(self, conf_state: ConfState) -> None:
        super().__init__()
        self._initial_conf_state = conf_state

    def initial_state(self):
        hs, cs = super().initial_state()
        if self.snapshot().is_empty():
            cs = self._initial_conf_state
        return hs, cs


def make_storage(
    voters: Iterable[int],
    learners: Iterable[int] = (),
    entries: Iterable[Entry] = (),
    hard_state: HardState | None = None,
) -> ConfMemoryStorage:
    s = ConfMemoryStorage(ConfState(voters=tuple(sorted(voters)), learners=tuple(sorted(learners))))
    s.append(list(entries))
    if hard_state is not None:
        s.set_hard_state(hard_state)
    return s


def log_of_terms(terms: Iterable[int]) -> list[Entry]:
    """Entries at indexes 1.. with the given terms (data encodes the position)."""
    return [Entry(term=t, index=i + 1, data=f"e{i + 1}".encode()) for i, t in enumerate(terms)]


@dataclass
class Peer:
    id: int
    storage: MemoryStorage
    node: RawNode
    config_kw: dict
    applied: list[Entry] = field(default_factory=list)  # every committed entry applied
    read_states: list[ReadState] = field(default_factory=list)
    conf_state: ConfState | None = None
    snapshots_applied: int = 0


class Cluster:
    def __init__(
        self,
        voters: Iterable[int],
        learners: Iterable[int] = (),
        *,
        logs: dict[int, list[Entry]] | None = None,
        hard_states: dict[int, HardState] | None = None,
        seed: int = 1,
        **config_kw,
    ) -> None:
        self.voters = tuple(sorted(voters))
        self.learners = tuple(sorted(learners))
        self.seed = seed
        self.peers: dict[int, Peer] = {}
        self.queue: list[Message] = []
        self.delivered: list[Message] = []
        self.dropped_pairs: set[tuple[int, int]] = set()
        self.dropped_types: set[MessageType] = set()
        self.msg_filter: Callable[[Message], bool] | None = None  # True = drop
        # Act like a transport: tell the sender whether each MsgSnap arrived.
        self.report_snapshots = False
        for i in self.voters + self.learners:
            storage = make_storage(
                self.voters,
                self.learners,
                (logs or {}).get(i, ()),
                (hard_states or {}).get(i),
            )
            self.add_peer(i, storage, **config_kw)

    # --- membership of the test network ---

    def add_peer(self, node_id: int, storage: MemoryStorage | None = None, **config_kw) -> Peer:
        if storage is None:
            storage = MemoryStorage()  # a brand-new node that joins by conf change
        kw = dict(config_kw)
        kw.setdefault("election_tick", 10)
        kw.setdefault("heartbeat_tick", 1)
        rng = random.Random(self.seed * 1000 + node_id)
        node = RawNode(Config(id=node_id, storage=storage, rng=rng, **kw))
        peer = Peer(node_id, storage, node, kw, conf_state=storage.initial_state()[1])
        self.peers[node_id] = peer
        return peer

    def restart(self, node_id: int, **overrides) -> RawNode:
        """Rebuild a node from what it persisted (its MemoryStorage); volatile state is lost."""
        peer = self.peers[node_id]
        kw = dict(peer.config_kw, **overrides)
        applied = peer.applied[-1].index if peer.applied else 0
        applied = max(applied, peer.storage.snapshot().metadata.index)
        rng = random.Random(self.seed * 1000 + node_id + 7)
        peer.node = RawNode(
            Config(id=node_id, storage=peer.storage, rng=rng, applied=applied, **kw)
        )
        # The storage only knows the configuration as of its snapshot; conf changes applied
        # after it are not re-delivered (Config.applied), so restore them, as a driver must.
        snap_index = peer.storage.snapshot().metadata.index
        for e in peer.applied:
            if e.index > snap_index and e.type == EntryType.CONF_CHANGE:
                peer.node.apply_conf_change(ConfChange.decode(e.data))
        return peer.node

    def compact(self, node_id: int, data: bytes = b"state") -> None:
        """Snapshot node_id's state machine at its applied index and compact its log (what a
        driver does periodically; the snapshot carries the current configuration)."""
        peer = self.peers[node_id]
        applied = peer.node.raft.log.applied
        peer.storage.create_snapshot(applied, peer.conf_state, data)
        peer.storage.compact(applied)

    def node(self, node_id: int) -> RawNode:
        return self.peers[node_id].node

    def raft(self, node_id: int):
        return self.peers[node_id].node.raft

    # --- Ready handling ---

    def process_ready(self, node_id: int) -> Ready:
        peer = self.peers[node_id]
        rd = peer.node.ready()
        if rd.snapshot is not None:
            peer.storage.apply_snapshot(rd.snapshot)
        peer.storage.append(rd.entries)
        if rd.hard_state is not None:
            peer.storage.set_hard_state(rd.hard_state)
        self.queue.extend(rd.messages)
        if rd.snapshot is not None:
            peer.snapshots_applied += 1
            peer.conf_state = rd.snapshot.metadata.conf_state
        for e in rd.committed_entries:
            if e.type == EntryType.CONF_CHANGE:
                peer.conf_state = peer.node.apply_conf_change(ConfChange.decode(e.data))
            peer.applied.append(e)
        peer.read_states.extend(rd.read_states)
        peer.node.advance(rd)
        return rd

    def process_all_ready(self) -> bool:
        progressed = False
        for i in sorted(self.peers):
            while self.peers[i].node.has_ready():
                self.process_ready(i)
                progressed = True
        return progressed

    # --- the network ---

    def _drops(self, m: Message) -> bool:
        if (m.frm, m.to) in self.dropped_pairs or m.type in self.dropped_types:
            return True
        return self.msg_filter is not None and self.msg_filter(m)

    def deliver(self, only: Callable[[Message], bool] | None = None) -> list[Message]:
        """Deliver the queued messages (those matching ``only``, if given); return them."""
        batch = [m for m in self.queue if only is None or only(m)]
        self.queue = [m for m in self.queue if not (only is None or only(m))]
        out = []
        for m in batch:
            lost = self._drops(m) or m.to not in self.peers
            if self.report_snapshots and m.type == MessageType.MsgSnap and m.frm in self.peers:
                self.peers[m.frm].node.report_snapshot(m.to, failed=lost)
            if lost:
                continue
            out.append(m)
            self.delivered.append(m)
            try:
                self.peers[m.to].node.step(m)
            except StepPeerNotFoundError:
                pass
        return out

    def stabilize(self, max_rounds: int = 500) -> None:
        """Handle Readies and deliver messages until nothing is left to do."""
        for _ in range(max_rounds):
            progressed = self.process_all_ready()
            if self.queue:
                self.deliver()
                progressed = True
            if not progressed:
                return
        raise AssertionError("cluster did not stabilize")

    def isolate(self, node_id: int) -> None:
        for j in self.peers:
            if j != node_id:
                self.dropped_pairs.add((node_id, j))
                self.dropped_pairs.add((j, node_id))

    def cut(self, a: int, b: int) -> None:
        self.dropped_pairs.update({(a, b), (b, a)})

    def heal(self) -> None:
        self.dropped_pairs.clear()
        self.dropped_types.clear()
        self.msg_filter = None

    # --- driving ---

    def tick(self, node_id: int, n: int = 1) -> None:
        for _ in range(n):
            self.peers[node_id].node.tick()

    def tick_all(self, n: int = 1, stabilize: bool = True) -> None:
        for _ in range(n):
            for i in sorted(self.peers):
                self.peers[i].node.tick()
            if stabilize:
                self.stabilize()

    def elect(self, node_id: int) -> None:
        self.node(node_id).campaign()
        self.stabilize()
        assert self.raft(node_id).state == StateType.LEADER, self.raft(node_id).state

    def propose(self, node_id: int, data: bytes) -> None:
        self.node(node_id).propose(data)

    # --- observation ---

    def leaders(self) -> list[int]:
        return [i for i, p in self.peers.items() if p.node.raft.state == StateType.LEADER]

    def applied_data(self, node_id: int) -> list[bytes]:
        return [
            e.data for e in self.peers[node_id].applied if e.type == EntryType.NORMAL and e.data
        ]

    def log_entries(self, node_id: int) -> list[Entry]:
        return self.raft(node_id).log.all_entries()

    def log_terms(self, node_id: int) -> list[tuple[int, int]]:
        return [(e.index, e.term) for e in self.log_entries(node_id)]

    def take_queue(self) -> list[Message]:
        msgs, self.queue = self.queue, []
        return msgs


# --- helpers shared by the tests ---


def drain(c: Cluster, node_id: int) -> list[Message]:
    """Handle node_id's Readies; return (and take off the network) the messages it sent."""
    out = []
    while c.node(node_id).has_ready():
        out.extend(c.process_ready(node_id).messages)
    sent = set(map(id, out))
    c.queue = [m for m in c.queue if id(m) not in sent]
    return out


def of_type(msgs, t):
    return [m for m in msgs if m.type == t]


def assert_log_matching(c: Cluster) -> None:
    logs = {i: {e.index: e for e in c.log_entries(i)} for i in c.peers}
    for i in logs:
        for j in logs:
            for idx, e in logs[i].items():
                f = logs[j].get(idx)
                if f is not None and f.term == e.term:
                    for k in range(1, idx + 1):
                        if k in logs[i] and k in logs[j]:
                            assert logs[i][k] == logs[j][k], (i, j, k)
