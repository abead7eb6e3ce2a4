"""Deterministic discrete-event simulation of a raft cluster, checked after every step.

One ``Cluster`` runs one ``Scenario``. Everything random comes from one ``random.Random``
seeded by the scenario (raft nodes get their own ``Random`` drawn from it at each start), all
iteration is over lists or sorted ids, and nothing reads a clock, so (seed, nodes) replays
the exact same event sequence.

Time is an integer number of slots (``TICK_SLOTS`` per raft tick). A heap holds the events
(node ticks, message deliveries, client actions, nemesis actions) ordered by (slot, sequence
number). A *step* is one slot: its events run in order, then every node that got input runs
its Ready loop until ``has_ready()`` is False. The safety checkers run inside the Ready
handling, on exactly what the node persists, commits and applies, so every step is checked.

The driver follows the Ready contract of raft/types.py: (1) persist snapshot, entries, hard
state into the node's ``MemoryStorage`` and its ``Disk`` (sync when ``must_sync``); (2) send
messages (with ``sends_first``, a leader's MsgApp/MsgSnap/MsgHeartbeat leave before step 1,
as the Ready docstring allows); (3) apply the snapshot and the
committed entries to the node's ``KVStore``, calling ``apply_conf_change`` for conf changes;
(4) ``advance``. A crash may hit between these steps. With ``disk_latency_slots`` the write
of steps (1)-(4) completes some slots after ``ready()`` while the node keeps stepping and
ticking (one outstanding Ready, as a driver with a writer thread does).

Phases: during ``fault_ticks`` the nemesis partitions (random splits, isolated leader,
one-way links), crashes (possibly in the middle of a Ready), restarts, transfers leadership,
forces campaigns and, with ``membership``, cycles the configuration (add an empty node as a
learner, promote it, remove a random voter -- the leader too -- which is then shut down),
while clients write and read. Then the liveness phase heals
the network (no drops, duplicates, long delays or partitions), restarts every node that is
down (and, with ``full_restart``, every node), stops new client operations and requires,
within ``liveness_ticks``, one leader known to all nodes, every client write acknowledged and
every node applied up to the leader's commit index.
"""

from __future__ import annotations

import heapq
import random
import zlib
from collections.abc import Callable

from raft import (
    CompactedError,
    ConfChange,
    ConfChangeType,
    Config,
    ConfState,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    ProposalDroppedError,
    RawNode,
    Snapshot,
    SnapshotMetadata,
    StateType,
    StepPeerNotFoundError,
    UnavailableError,
)
from tests.sim.checkers import SafetyChecker, SafetyViolation
from tests.sim.disk import Disk
from tests.sim.history import History
from tests.sim.kv import KVStore, decode_put, encode_put
from tests.sim.scenario import TICK_SLOTS, Scenario

_MSG_SNAP = MessageType.MsgSnap
_APP_RESP = MessageType.MsgAppResp
_VOTE_RESP = MessageType.MsgVoteResp
_MSG_PROP = MessageType.MsgProp
_LEADER = StateType.LEADER
_CONF_CHANGE = EntryType.CONF_CHANGE
_REMOVE_NODE = ConfChangeType.REMOVE_NODE
MAX_JOINERS = 3  # membership cycles per run (each adds one node and removes one)

READY_ROUNDS_MAX = 10_000  # Readys in one flush; more is a livelock (a restarted node
# may need one Ready per committed entry when max_size_per_msg_bytes is 0)


class LivenessFailure(AssertionError):
    """The healed cluster did not elect a leader and commit pending writes in time."""


class ContractViolation(AssertionError):
    """The core broke the raft_api.md contract (e.g. entries without must_sync)."""


# What a leader may send before its own write of the same Ready (Ready docstring, thesis
# 10.2.1); every other message may depend on the persist.
_EARLY_TYPES = frozenset({MessageType.MsgApp, MessageType.MsgSnap, MessageType.MsgHeartbeat})


class SimNode:
    """A node as the simulator sees it: the raft core plus its driver's state and disk."""

    __slots__ = (
        "applied_conf",
        "commit",
        "conf_state",
        "crash_point",
        "disk",
        "id",
        "incarnation",
        "joiner",
        "kv",
        "last_snap_index",
        "lead",
        "leader_term",
        "pending_reads",
        "outstanding",
        "raw",
        "ready_reads",
        "retired",
        "role",
        "storage",
        "term",
        "tick_slots",
        "vote",
        "waiting_writes",
    )

    def __init__(self, node_id: int, disk: Disk, tick_slots: int, joiner: bool = False) -> None:
        self.id = node_id
        self.joiner = joiner  # added by a conf change: starts empty, never bootstraps
        self.retired = False  # removed by a conf change and shut down for good
        self.disk = disk
        self.tick_slots = tick_slots
        self.incarnation = 0
        self.raw: RawNode | None = None  # None while crashed
        self.storage: MemoryStorage | None = None
        self.kv = KVStore()
        self.conf_state = ConfState()
        self.applied_conf = 0
        self.last_snap_index = 0
        self.term = 0
        self.vote = 0
        self.commit = 0  # highest commit index this incarnation reported (checked entries)
        self.lead = 0
        self.leader_term = 0  # the term in which this node last became leader
        self.role = StateType.FOLLOWER
        self.crash_point: int | None = None  # crash at this step of the next Ready
        self.outstanding = False  # a Ready's write is in flight (no ready() until it ends)
        self.pending_reads: dict[bytes, tuple[int, int, str]] = {}  # ctx -> (rid, client, key)
        self.ready_reads: list[tuple[int, int, int, str]] = []  # (index, rid, client, key)
        self.waiting_writes: dict[int, int] = {}  # op id -> client id


class Client:
    __slots__ = ("busy", "id", "key", "node", "op", "rid", "token")

    def __init__(self, cid: int) -> None:
        self.id = cid
        self.busy = False
        self.op = 0  # write op id in progress (0: none)
        self.rid = 0  # read id in progress (0: none)
        self.key = ""
        self.node = 0
        self.token = 0  # invalidates timeouts of earlier attempts


class Cluster:
    def __init__(self, sc: Scenario, log: Callable[[str], None] | None = None) -> None:
        self.sc = sc
        self.rng = random.Random(sc.seed * 8 + sc.nodes + 1)
        self.log = log
        self.now = 0
        self._seq = 0
        self._events: list = []
        self.safety = SafetyChecker()
        self.history = History()
        self.ids = list(range(1, sc.nodes + 1))  # the initial voters
        self.members = list(self.ids)  # nodes in service (joiners in, retired nodes out)
        self.joining: int | None = None  # the node the membership cycle is adding
        self._next_id = sc.nodes + 1
        self.nodes: dict[int, SimNode] = {}
        self.dirty: set[int] = set()
        self.blocked: set[tuple[int, int]] = set()  # directed links (frm, to) that drop
        self.drop_rate = sc.drop_rate
        self.dup_rate = sc.dup_rate
        self.long_delay_rate = sc.long_delay_rate
        self.liveness = False
        self.liveness_start = 0
        self.clients = [Client(i) for i in range(1, sc.clients + 1)]
        self.keys = [chr(ord("a") + i) for i in range(sc.keys)]
        self._next_op = 0
        self._next_rid = 0
        self.stats = {
            "steps": 0,
            "msgs": 0,
            "dropped": 0,
            "crashes": 0,
            "snapshots_sent": 0,
            "app_snapshots": 0,
            "elections": 0,
            "writes": 0,
            "reads": 0,
            "unknown_peer": 0,
            "joiners": 0,
            "removed": 0,
        }
        for nid in self.ids:
            disk = Disk(torn=sc.torn_writes)
            if not sc.bootstrap:
                # Every node starts from the same durable snapshot at index 1 (raft_api.md).
                kv = KVStore()
                kv.applied = 1
                disk.save_app_snapshot(
                    Snapshot(
                        data=kv.to_bytes(),
                        metadata=SnapshotMetadata(
                            conf_state=ConfState(voters=tuple(self.ids)), index=1, term=1
                        ),
                    )
                )
            self.nodes[nid] = SimNode(nid, disk, TICK_SLOTS + self.rng.choice((-1, 0, 0, 1)))

    # -- event loop ---------------------------------------------------------------------
    def _at(self, slot: int, fn, *args) -> None:
        self._seq += 1
        heapq.heappush(self._events, (slot, self._seq, fn, args))

    def _say(self, text: str) -> None:
        self.log(f"[{self.now // TICK_SLOTS:4d}.{self.now % TICK_SLOTS}] {text}")

    def run(self) -> dict:
        """Run the scenario; raise SafetyViolation / LinearizabilityViolation / ... on failure."""
        sc = self.sc
        for nid in self.ids:
            self._start(self.nodes[nid])
        for c in self.clients:
            self._at(self.rng.randrange(1, 3 * TICK_SLOTS), self._client_next, c)
        self._at(
            self.rng.randrange(sc.nemesis_min_ticks, sc.nemesis_max_ticks) * TICK_SLOTS,
            self._nemesis,
        )
        fault_end = sc.fault_ticks * TICK_SLOTS
        self._at(fault_end, self._begin_liveness)
        deadline = fault_end + sc.liveness_ticks * TICK_SLOTS
        events = self._events
        history = self.history
        pop = heapq.heappop
        while events:
            slot = events[0][0]
            if slot > deadline:
                raise LivenessFailure(self._liveness_report())
            self.now = slot
            history.advance_to(slot)
            while events and events[0][0] == slot:
                _, _, fn, args = pop(events)
                fn(*args)
            self._flush()
            self.stats["steps"] += 1
            if self.liveness and self._converged():
                break
        self._final_checks()
        self.stats["liveness_ticks"] = (self.now - self.liveness_start) // TICK_SLOTS
        self.stats["ticks"] = self.now // TICK_SLOTS
        self.stats["committed"] = self.safety.max_committed
        return self.stats

    def _flush(self) -> None:
        nodes = self.nodes
        while self.dirty:
            ids = sorted(self.dirty)
            self.dirty.clear()
            for nid in ids:
                n = nodes[nid]
                rounds = 0
                while n.raw is not None and not n.outstanding and n.raw.has_ready():
                    rounds += 1
                    if rounds > READY_ROUNDS_MAX:
                        raise ContractViolation(f"node {nid}: Ready loop does not settle")
                    self._handle_ready(n, n.raw.ready())

    def digest(self, error: str | None = None) -> int:
        """A fingerprint of the run's outcome (the determinism test compares these)."""
        d = zlib.crc32(repr((self.now, error, sorted(self.stats.items()))).encode())
        for i in sorted(self.safety.committed):
            d = zlib.crc32(str(self.safety.committed[i]).encode(), d)
        return d

    # -- nodes: start, crash ------------------------------------------------------------
    def _start(self, n: SimNode) -> None:
        """Start (or restart) a node from its durable disk only."""
        sc = self.sc
        disk = n.disk
        storage = MemoryStorage()
        snap = disk.snapshot
        snap_index = 0
        if snap is not None:
            storage.apply_snapshot(snap)
            snap_index = snap.metadata.index
        hs = disk.hard_state or HardState()
        if disk.hard_state is not None:
            storage.set_hard_state(hs)
        ents = [e for e in disk.entries if e.index > snap_index]
        if ents:
            storage.append(ents)
        n.kv = KVStore.from_bytes(snap.data) if snap is not None else KVStore()
        if n.kv.applied != snap_index:
            raise SafetyViolation(f"node {n.id}: snapshot {snap_index} holds state {n.kv.applied}")
        n.conf_state = snap.metadata.conf_state if snap is not None else ConfState()
        n.applied_conf = snap_index
        n.last_snap_index = snap_index
        n.term, n.vote = hs.term, hs.vote
        n.commit = max(hs.commit, snap_index)
        last = ents[-1].index if ents else snap_index
        if n.commit > last:
            raise SafetyViolation(
                f"node {n.id}: durable commit {hs.commit} beyond its durable log ({last})"
            )
        for e in ents:
            if e.index > n.commit:
                break
            self.safety.commit(n.id, e)  # committed entries survive the crash unchanged
        cfg = Config(
            id=n.id,
            storage=storage,
            election_tick=sc.election_tick,
            heartbeat_tick=sc.heartbeat_tick,
            applied=snap_index,
            max_size_per_msg_bytes=sc.max_size_per_msg_bytes,
            max_inflight_msgs=sc.max_inflight_msgs,
            max_uncommitted_entries_size_bytes=sc.max_uncommitted_entries_size_bytes,
            disable_proposal_forwarding=sc.disable_proposal_forwarding,
            check_quorum=sc.check_quorum,
            pre_vote=sc.pre_vote,
            rng=random.Random(self.rng.getrandbits(64)),
        )
        raw = RawNode(cfg)
        if sc.bootstrap and disk.is_empty() and not n.joiner:
            raw.bootstrap(list(self.ids))
        n.raw = raw
        n.storage = storage
        n.incarnation += 1
        n.lead = 0
        n.role = StateType.FOLLOWER
        n.crash_point = None
        self.dirty.add(n.id)
        if self.log:
            self._say(
                f"node {n.id} starts (incarnation {n.incarnation}) term={hs.term} "
                f"vote={hs.vote} commit={hs.commit} snap={snap_index} last={last}"
            )
        self._at(self.now + self.rng.randrange(1, n.tick_slots + 1), self._tick, n, n.incarnation)

    def _crash(self, n: SimNode, where: str = "") -> None:
        if n.raw is None:
            return
        self.stats["crashes"] += 1
        n.raw = None
        n.storage = None
        n.outstanding = False
        n.disk.crash(self.rng)
        n.lead = 0
        n.role = StateType.FOLLOWER
        n.crash_point = None
        # Clients waiting on this node learn nothing; their timeouts fire and they retry.
        n.pending_reads.clear()
        n.ready_reads.clear()
        n.waiting_writes.clear()
        self.dirty.discard(n.id)
        if self.log:
            self._say(f"node {n.id} CRASHES {where}")

    def _tick(self, n: SimNode, incarnation: int) -> None:
        if n.raw is None or n.incarnation != incarnation:
            return
        n.raw.tick()
        self.dirty.add(n.id)
        self._at(self.now + n.tick_slots, self._tick, n, incarnation)

    # -- the Ready loop -----------------------------------------------------------------
    def _handle_ready(self, n: SimNode, rd) -> None:
        """Checks on the Ready as produced, early sends, then the write (now or later)."""
        safety = self.safety
        became_leader = False
        if rd.soft_state is not None:
            n.lead = rd.soft_state.lead
            n.role = rd.soft_state.raft_state
        hs = rd.hard_state
        term_vote_changed = False
        if hs is not None:
            safety.hard_state(n.id, n.term, n.vote, hs.term, hs.vote)
            if hs.commit < n.commit:
                raise SafetyViolation(f"node {n.id}: commit went down {n.commit} -> {hs.commit}")
            term_vote_changed = hs.term != n.term or hs.vote != n.vote
            n.term, n.vote = hs.term, hs.vote
        if n.role == _LEADER and n.leader_term != n.term:
            became_leader = True
            n.leader_term = n.term
            self.stats["elections"] += 1
            safety.leader(n.id, n.term)
        snap = rd.snapshot
        has_snap = snap is not None and not snap.is_empty()
        if (rd.entries or has_snap or term_vote_changed) and not rd.must_sync:
            raise ContractViolation(
                f"node {n.id}: Ready with entries, a snapshot or a new term/vote "
                f"but must_sync=False"
            )
        msgs = rd.messages
        crash_point = n.crash_point
        if self.sc.sends_first and msgs and not term_vote_changed:
            # (a new term or vote in this Ready makes every message wait for the write)
            early = self._early_messages(n, msgs)
            if early:
                self._send(n, early)
                sent = {id(m) for m in early}
                msgs = [m for m in msgs if id(m) not in sent]
        if crash_point == 0:
            self._crash(n, "before persisting a Ready")
            return
        latency = self.sc.disk_latency_slots
        if latency and (rd.entries or has_snap or hs is not None):
            # The write runs "in the background": the node keeps stepping messages and
            # ticking meanwhile (only this Ready is outstanding), as the real driver does.
            n.outstanding = True
            done = self.now + self.rng.randrange(1, latency + 1)
            self._at(done, self._finish_ready, n, n.incarnation, rd, msgs, became_leader)
        else:
            self._finish_ready(n, n.incarnation, rd, msgs, became_leader)

    def _finish_ready(self, n: SimNode, incarnation: int, rd, msgs, became_leader: bool) -> None:
        """Steps (1)-(4) of the Ready contract once the write completes."""
        if n.raw is None or n.incarnation != incarnation:
            return  # crashed while the write was in flight: it never happened
        n.outstanding = False
        self.dirty.add(n.id)
        safety = self.safety
        storage = n.storage
        hs = rd.hard_state
        snap = rd.snapshot
        has_snap = snap is not None and not snap.is_empty()
        crash_point = n.crash_point

        # (1) persist
        if has_snap:
            storage.apply_snapshot(snap)
            n.disk.write_snapshot(snap)
            if snap.metadata.index > n.commit:
                n.commit = snap.metadata.index
        if rd.entries:
            first = rd.entries[0].index
            prev_index = first - 1
            try:
                prev_term = storage.term(prev_index) if prev_index > 0 else 0
            except CompactedError:
                raise SafetyViolation(
                    f"node {n.id}: persisting {rd.entries[0]} inside its snapshot"
                ) from None
            except UnavailableError:
                raise SafetyViolation(
                    f"node {n.id}: persisting {rd.entries[0]} after a gap "
                    f"(last index {storage.last_index()})"
                ) from None
            safety.append(n.id, prev_term, rd.entries, n.commit)
            storage.append(rd.entries)
            n.disk.write_entries(rd.entries)
        if hs is not None:
            storage.set_hard_state(hs)
            n.disk.write_hard_state(hs)
            if hs.commit > n.commit:
                last = storage.last_index()
                if hs.commit > last:
                    raise SafetyViolation(
                        f"node {n.id}: commit {hs.commit} beyond its last index {last}"
                    )
                lo = max(n.commit + 1, storage.first_index())
                if lo <= hs.commit:
                    for e in storage.entries(lo, hs.commit + 1):
                        safety.commit(n.id, e)
                n.commit = hs.commit
        if rd.must_sync:
            n.disk.sync()
        if became_leader:
            snap_index = storage.first_index() - 1
            last = storage.last_index()
            safety.leader_log(
                n.id,
                lambda i: None if i <= snap_index else (-1 if i > last else storage.term(i)),
            )
            if self.log:
                self._say(f"node {n.id} becomes LEADER of term {n.term} (last index {last})")
        if crash_point == 1:
            self._crash(n, "after persisting, before sending")
            return

        # (2) send
        if msgs:
            self._send(n, msgs)
        if crash_point == 2:
            self._crash(n, "after sending, before applying")
            return

        # (3) apply
        if has_snap:
            kv = KVStore.from_bytes(snap.data)
            md = snap.metadata
            if kv.applied != md.index:
                raise SafetyViolation(
                    f"node {n.id}: snapshot {md.term}/{md.index} holds state {kv.applied}"
                )
            safety.apply_snapshot(n.id, n.kv.applied, md.index, md.term, kv.chain)
            n.kv = kv
            n.conf_state = md.conf_state
            n.applied_conf = md.index
            n.last_snap_index = md.index
            if self.log:
                self._say(f"node {n.id} restores snapshot {md.term}/{md.index}")
        if rd.committed_entries:
            self._apply_entries(n, rd.committed_entries)
        for rs in rd.read_states:
            pending = n.pending_reads.pop(rs.request_ctx, None)
            if pending is not None:
                rid, cid, key = pending
                n.ready_reads.append((rs.index, rid, cid, key))
        if n.ready_reads:
            self._serve_reads(n)
        if n.kv.applied - n.last_snap_index >= self.sc.snapshot_every:
            self._app_snapshot(n)

        # (4) advance
        n.raw.advance(rd)

    def _early_messages(self, n: SimNode, msgs) -> list[Message]:
        """The messages this Ready may send before persisting (only a leader's, contract)."""
        if n.role != _LEADER:
            return []
        return [m for m in msgs if m.type in _EARLY_TYPES]

    def _apply_entries(self, n: SimNode, entries) -> None:
        safety = self.safety
        kv = n.kv
        history = self.history
        for e in entries:
            before = kv.applied
            op = kv.apply(e.index, e.term, e.type, e.data)
            safety.apply(n.id, before, n.commit, e, kv.chain)
            if e.type == _CONF_CHANGE:
                cc = ConfChange.decode(e.data)
                n.conf_state = n.raw.apply_conf_change(cc)
                n.applied_conf = e.index
                if cc.type == _REMOVE_NODE:
                    self._on_removed(cc.node_id)
            elif e.data:
                if op is not None:
                    history.write_applied(op, e.index)
                op_id = decode_put(e.data)[0]
                cid = n.waiting_writes.pop(op_id, None)
                if cid is not None:
                    self._write_done(self.clients[cid - 1], op_id)

    def _serve_reads(self, n: SimNode) -> None:
        applied = n.kv.applied
        keep = []
        for item in n.ready_reads:
            index, rid, cid, key = item
            if index > applied:
                keep.append(item)
                continue
            op, rev = n.kv.get(key)
            c = self.clients[cid - 1]
            if c.rid == rid:
                self.history.read_done(rid, op, rev)
                if self.log:
                    self._say(
                        f"client {cid} read {rid} {key!r} at node {n.id} "
                        f"(index {index}) -> op {op} rev {rev}"
                    )
                self._client_idle(c)
        n.ready_reads = keep

    def _app_snapshot(self, n: SimNode) -> None:
        """Snapshot the state machine and compact the log (etcd's snapshot + compaction)."""
        if not n.conf_state.voters:
            return  # bootstrap conf changes not applied yet
        index = n.kv.applied
        snap = n.storage.create_snapshot(index, n.conf_state, n.kv.to_bytes())
        n.disk.save_app_snapshot(snap)
        n.last_snap_index = index
        compact_to = index - self.sc.keep_entries
        if compact_to >= n.storage.first_index():
            n.storage.compact(compact_to)
        self.stats["app_snapshots"] += 1

    # -- network ------------------------------------------------------------------------
    def _send(self, n: SimNode, msgs) -> None:
        rng = self.rng
        stats = self.stats
        inc = n.incarnation
        for m in msgs:
            stats["msgs"] += 1
            if not m.reject and (m.type == _APP_RESP or m.type == _VOTE_RESP):
                self._check_ack_durable(n, m)
            if self.log:
                self._say(f"send {m}")
            if m.type == _MSG_SNAP:
                stats["snapshots_sent"] += 1
            if self.drop_rate and rng.random() < self.drop_rate:
                stats["dropped"] += 1
                if self.log:
                    self._say(f"lose {m}")
                if m.type == _MSG_SNAP:
                    self._at(self.now + 1, self._report_snapshot, m.frm, inc, m.to, True)
                continue
            self._at(self.now + self._delay(), self._deliver, m, inc, True)
            if self.dup_rate and rng.random() < self.dup_rate:
                self._at(self.now + self._delay(), self._deliver, m, inc, False)

    @staticmethod
    def _check_ack_durable(n: SimNode, m: Message) -> None:
        """An acknowledgement leaves only after what it acknowledges is durable (contract):
        a granted vote after the vote, a MsgAppResp after the entries up to its index.

        A later durable term covers an older acknowledgement: one Ready may grant a vote in
        term 6 and then move to term 7 (only term 7's vote is persisted, and the node never
        votes in term 6 again), or ack entries of term 6 and then let a term-7 leader
        truncate them; neither can be used against the node.
        """
        hs = n.disk.hard_state
        if hs is None or hs.term < m.term:
            raise ContractViolation(f"node {n.id} sent {m} but its durable hard state is {hs}")
        if hs.term > m.term:
            return
        if m.type == _VOTE_RESP:
            if hs.vote != m.to:
                raise ContractViolation(
                    f"node {n.id} grants its vote to {m.to} in term {m.term}, but its durable "
                    f"hard state is {hs}"
                )
        elif m.index > n.disk.durable_last_index():
            raise ContractViolation(
                f"node {n.id} acknowledges index {m.index} ({m}) but its durable log ends at "
                f"{n.disk.durable_last_index()}"
            )

    def _delay(self) -> int:
        rng = self.rng
        if self.long_delay_rate and rng.random() < self.long_delay_rate:
            return rng.randrange(1, 2 * self.sc.election_tick * TICK_SLOTS)
        return rng.randrange(1, self.sc.max_delay_slots + 1)

    def _deliver(self, m: Message, sender_inc: int, report: bool) -> None:
        target = self.nodes[m.to]
        if (m.frm, m.to) in self.blocked or target.raw is None:
            self.stats["dropped"] += 1
            if self.log:
                self._say(f"drop ({'partition' if target.raw else 'node down'}) {m}")
            if report:
                self._report_unreachable(m.frm, sender_inc, m.to, m.type == _MSG_SNAP)
            return
        if self.log:
            self._say(f"deliver {m}")
        try:
            target.raw.step(m)
        except ProposalDroppedError:
            if m.type != _MSG_PROP:
                raise
            # a forwarded proposal reached a node that no longer leads: the client retries
        except StepPeerNotFoundError:
            # A response from a peer this node does not know (yet): a restarted node learns
            # its membership by re-applying the bootstrap conf changes. Drivers ignore these.
            self.stats["unknown_peer"] += 1
        self.dirty.add(m.to)
        if report and m.type == _MSG_SNAP:
            self._report_snapshot(m.frm, sender_inc, m.to, False)

    def _report_unreachable(self, frm: int, inc: int, to: int, snap: bool) -> None:
        sender = self.nodes[frm]
        if sender.raw is None or sender.incarnation != inc:
            return
        sender.raw.report_unreachable(to)
        if snap:
            sender.raw.report_snapshot(to, True)
        self.dirty.add(frm)

    def _report_snapshot(self, frm: int, inc: int, to: int, failed: bool) -> None:
        sender = self.nodes[frm]
        if sender.raw is None or sender.incarnation != inc:
            return
        sender.raw.report_snapshot(to, failed)
        self.dirty.add(frm)

    # -- clients ------------------------------------------------------------------------
    def _alive_ids(self) -> list[int]:
        return [nid for nid in self.members if self.nodes[nid].raw is not None]

    def _client_idle(self, c: Client) -> None:
        c.busy = False
        c.op = c.rid = 0
        c.token += 1
        think = self.rng.randrange(1, self.sc.think_max_ticks * TICK_SLOTS + 1)
        self._at(self.now + think, self._client_next, c)

    def _client_next(self, c: Client) -> None:
        if c.busy or self.liveness:
            return
        c.busy = True
        c.key = self.rng.choice(self.keys)
        if self.rng.random() < self.sc.write_ratio:
            self._next_op += 1
            c.op = self._next_op
            self.stats["writes"] += 1
            self.history.invoke_write(c.op, c.key)
            self._client_write(c)
        else:
            self._next_rid += 1
            c.rid = self._next_rid
            self.stats["reads"] += 1
            self.history.invoke_read(c.rid, c.key)
            self._client_read(c)

    def _client_write(self, c: Client) -> None:
        """(Re)propose the client's write to a random live node (same op id every time)."""
        c.token += 1
        alive = self._alive_ids()
        backoff = self.now + self.rng.randrange(TICK_SLOTS, 3 * TICK_SLOTS)
        if not alive:
            self._at(backoff, self._client_retry, c, c.token)
            return
        n = self.nodes[self.rng.choice(alive)]
        c.node = n.id
        if self.log:
            self._say(f"client {c.id} proposes write {c.op} {c.key!r} at node {n.id}")
        try:
            n.raw.propose(encode_put(c.op, c.key))
        except ProposalDroppedError:
            self._at(backoff, self._client_retry, c, c.token)
            return
        finally:
            self.dirty.add(n.id)
        n.waiting_writes[c.op] = c.id
        timeout = self.now + self.sc.client_timeout_ticks * TICK_SLOTS
        self._at(timeout, self._client_retry, c, c.token)

    def _client_retry(self, c: Client, token: int) -> None:
        if c.token != token or not c.op:
            return
        n = self.nodes[c.node]
        if n.waiting_writes.get(c.op) == c.id:
            del n.waiting_writes[c.op]
        self._client_write(c)

    def _write_done(self, c: Client, op: int) -> None:
        if c.op != op:
            return
        self.history.write_done(op)
        if self.log:
            self._say(f"client {c.id} write {op} {c.key!r} acknowledged by node {c.node}")
        self._client_idle(c)

    def _client_read(self, c: Client) -> None:
        alive = self._alive_ids()
        c.token += 1
        if alive:
            n = self.nodes[self.rng.choice(alive)]
            c.node = n.id
            ctx = b"r%d" % c.rid
            if self.log:
                self._say(f"client {c.id} starts read {c.rid} {c.key!r} at node {n.id}")
            try:
                n.raw.read_index(ctx)
            except ProposalDroppedError:
                pass  # no leader known: the read times out and fails
            else:
                n.pending_reads[ctx] = (c.rid, c.id, c.key)
            self.dirty.add(n.id)
        timeout = self.now + self.sc.client_timeout_ticks * TICK_SLOTS
        self._at(timeout, self._client_read_timeout, c, c.token)

    def _client_read_timeout(self, c: Client, token: int) -> None:
        if c.token != token or not c.rid:
            return
        n = self.nodes[c.node]
        ctx = b"r%d" % c.rid
        n.pending_reads.pop(ctx, None)
        n.ready_reads = [r for r in n.ready_reads if r[1] != c.rid]
        self.history.read_failed(c.rid)
        self._client_idle(c)

    # -- nemesis ------------------------------------------------------------------------
    def _nemesis(self) -> None:
        if self.liveness:
            return
        sc = self.sc
        rng = self.rng
        alive = self._alive_ids()
        members = self.members
        down = [nid for nid in members if nid not in alive]
        leader = self._leader()
        actions = ["heal", "partition", "one_way", "campaign", "transfer"]
        weights = [3, 2, 1, 1, 1]
        if len(down) < sc.max_down and alive:
            actions.append("crash")
            weights.append(3)
        if down:
            actions.append("restart")
            weights.append(3)
        if leader:
            actions.append("isolate_leader")
            weights.append(2)
            if sc.membership and self._next_id <= sc.nodes + MAX_JOINERS:
                actions.append("membership")
                weights.append(8)
        action = rng.choices(actions, weights)[0]
        if action == "heal":
            self.blocked.clear()
            if self.log:
                self._say("nemesis: heal network")
        elif action == "partition":
            side = set(rng.sample(members, rng.randrange(1, len(members))))
            self._partition(side)
        elif action == "isolate_leader":
            self._partition({leader})
        elif action == "one_way":
            victim = rng.choice(members)
            links = [(victim, o) for o in members if o != victim]
            if rng.random() < 0.5:
                links = [(o, v) for v, o in links]
            self.blocked.update(links)
            if self.log:
                self._say(f"nemesis: one-way block {sorted(links)}")
        elif action == "campaign":
            if alive:
                nid = rng.choice(alive)
                self.nodes[nid].raw.campaign()
                self.dirty.add(nid)
                if self.log:
                    self._say(f"nemesis: node {nid} campaigns")
        elif action == "transfer":
            if leader:
                to = rng.choice([i for i in members if i != leader])
                self.nodes[leader].raw.transfer_leader(to)
                self.dirty.add(leader)
                if self.log:
                    self._say(f"nemesis: leader {leader} transfers to {to}")
        elif action == "crash":
            # Leaders are the interesting victims (new elections with divergent logs).
            target = leader if leader and rng.random() < 0.5 else rng.choice(alive)
            n = self.nodes[target]
            if rng.random() < sc.mid_ready_crash_rate:
                n.crash_point = rng.randrange(3)
                # if no Ready comes soon, crash anyway
                self._at(self.now + 2 * TICK_SLOTS, self._crash_if, n, n.incarnation)
            else:
                self._crash(n)
        elif action == "membership":
            self._membership(leader)
        else:
            nid = rng.choice(down)
            self._start(self.nodes[nid])
        self._at(
            self.now + rng.randrange(sc.nemesis_min_ticks, sc.nemesis_max_ticks + 1) * TICK_SLOTS,
            self._nemesis,
        )

    def _partition(self, side: set[int]) -> None:
        other = [i for i in self.members if i not in side]
        self.blocked.clear()
        for a in sorted(side):
            for b in other:
                self.blocked.add((a, b))
                self.blocked.add((b, a))
        if self.log:
            self._say(f"nemesis: partition {sorted(side)} | {other}")

    def _crash_if(self, n: SimNode, incarnation: int) -> None:
        if self.liveness:
            return  # the liveness phase keeps every node up
        if n.raw is not None and n.incarnation == incarnation:
            self._crash(n, "(mid-Ready crash did not happen)")

    def _leader(self) -> int:
        """The live leader with the highest term (0: none)."""
        best, term = 0, -1
        for n in self.nodes.values():
            if n.raw is not None and n.role == _LEADER and n.term > term:
                best, term = n.id, n.term
        return best

    # -- membership: add a learner, promote it, remove a voter, repeat -------------------
    def _membership(self, leader: int) -> None:
        """One step of the membership cycle, decided from the leader's applied config.

        Proposals may be lost or refused (one pending change at a time); the next step
        retries whatever the leader's config says is still missing.
        """
        ln = self.nodes[leader]
        cs = ln.conf_state
        j = self.joining
        if j is not None and j not in cs.voters:
            kind = ConfChangeType.ADD_NODE if j in cs.learners else ConfChangeType.ADD_LEARNER_NODE
            self._propose_conf_change(ln, ConfChange(kind, j))
            return
        self.joining = None
        if len(cs.voters) > self.sc.nodes:
            victim = self.rng.choice(cs.voters)
            self._propose_conf_change(ln, ConfChange(_REMOVE_NODE, victim))
            return
        nid = self._next_id
        self._next_id += 1
        n = SimNode(nid, Disk(torn=self.sc.torn_writes), TICK_SLOTS, joiner=True)
        self.nodes[nid] = n
        self.members.append(nid)
        self.joining = nid
        self.stats["joiners"] += 1
        self._start(n)
        self._propose_conf_change(ln, ConfChange(ConfChangeType.ADD_LEARNER_NODE, nid))

    def _propose_conf_change(self, ln: SimNode, cc: ConfChange) -> None:
        if self.log:
            self._say(f"nemesis: leader {ln.id} proposes {cc}")
        try:
            ln.raw.propose_conf_change(cc)
        except ProposalDroppedError:
            pass
        self.dirty.add(ln.id)

    def _on_removed(self, nid: int) -> None:
        """A removal committed: the operator shuts the node down, soon or a bit later."""
        n = self.nodes.get(nid)
        if n is None or n.retired or nid not in self.members:
            return
        self.members.remove(nid)
        self.stats["removed"] += 1
        delay = self.rng.randrange(0, 2 * self.sc.election_tick * TICK_SLOTS)
        self._at(self.now + delay + 1, self._retire, n)

    def _retire(self, n: SimNode) -> None:
        n.retired = True
        self._crash(n, "(removed from the cluster: shut down for good)")

    def _conf_members(self, leader: int) -> list[int]:
        cs = self.nodes[leader].conf_state
        return sorted(set(cs.voters) | set(cs.learners))

    # -- liveness -----------------------------------------------------------------------
    def _begin_liveness(self) -> None:
        self.liveness = True
        self.liveness_start = self.now
        self.blocked.clear()
        self.drop_rate = self.dup_rate = self.long_delay_rate = 0.0
        if self.log:
            self._say("LIVENESS PHASE: network healed, every node up")
        if self.sc.full_restart:
            for nid in self.members:
                self._crash(self.nodes[nid], "(full restart)")
        for nid in self.members:
            n = self.nodes[nid]
            if n.raw is None:
                self._start(n)
            elif n.crash_point is not None:
                n.crash_point = None

    def _converged(self) -> bool:
        if any(c.busy and c.op for c in self.clients):
            return False
        leader = self._leader()
        if not leader:
            return False
        ln = self.nodes[leader]
        for nid in self._conf_members(leader):
            n = self.nodes[nid]
            if n.raw is None or n.lead != leader or n.kv.applied != ln.commit:
                return False
        return not self.history.pending_writes()

    def _liveness_report(self) -> str:
        parts = []
        for nid in self.members:
            n = self.nodes[nid]
            parts.append(
                f"node {nid}: {'up' if n.raw else 'down'} {n.role.name} term={n.term} "
                f"lead={n.lead} commit={n.commit} applied={n.kv.applied}"
            )
        leader = self._leader()
        if leader:
            status = str(self.nodes[leader].raw.status()).replace("\n", "; ")
            parts.append(f"leader status: {status}")
        pending = self.history.pending_writes()
        return (
            f"no convergence {self.sc.liveness_ticks} ticks after healing: "
            f"pending writes {pending[:10]}; " + "; ".join(parts)
        )

    def _final_checks(self) -> None:
        ids = self._conf_members(self._leader())
        first = self.nodes[ids[0]].kv.data
        for nid in ids[1:]:
            if self.nodes[nid].kv.data != first:
                raise SafetyViolation(f"nodes {ids[0]} and {nid} end with different data")
