"""The interaction environment: RawNodes over MemoryStorage, one message queue, printed output.

Every node is driven exactly as the Ready contract says a simple driver must be
(``process_ready``): persist the snapshot, entries and hard state into the node's
MemoryStorage; put the messages on the environment's queue; apply the snapshot and the
committed entries (conf changes through ``RawNode.apply_conf_change``); ``advance()``.
Messages wait in the queue, in the order they were sent, until a command delivers or drops
them, so a trace decides every interleaving explicitly.

Determinism: nodes are visited in ascending id order, the queue is FIFO, and each node's
randomness is injected through ``Config.rng``. By default that source has no jitter
(``NoJitterRandom``): every randomized election timeout equals ``election_tick`` exactly, so
``tick-election`` on a follower makes it campaign. ``jitter-seed=N`` gives node ``i`` a
``random.Random(N * 1000 + i)`` instead.

The node's own log lines (``Config.logger``) are printed as ``INFO ...`` lines at the point
where they happen, indented like the surrounding output. ``log-level none`` silences all
output (useful for a long setup section; every block then prints ``ok``) until
``log-level info``.

The state machine is a list of the applied payloads; a snapshot's data is that list, one
payload per line. For each applied index the environment remembers the configuration, so a
snapshot taken at any applied index (``compact``) carries the right ConfState.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from raft import (
    ConfChange,
    Config,
    ConfState,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    RaftError,
    RawNode,
    Snapshot,
    SnapshotMetadata,
)

MAX_STABILIZE_ROUNDS = 1_000  # a trace that needs more is looping (e.g. endless probes)
MAX_NODES = 32
INDENT = "  "


class NoJitterRandom(random.Random):
    """A random source that always yields its minimum (0, 0.0), so that randomized election
    timeouts are exactly ``election_tick``. Deterministic and easy to reason about in a trace.
    Both primitives are overridden, so every derived method (randrange, randint, choice,
    uniform, ...) yields its minimum too."""

    def random(self) -> float:
        return 0.0

    def getrandbits(self, k: int) -> int:
        return 0


class EnvError(Exception):
    """A command cannot be carried out (bad node id, bad argument): printed as 'error: ...'."""


@dataclass
class TraceNode:
    id: int
    storage: MemoryStorage
    rawnode: RawNode
    config: Config
    applied_index: int = 0
    payloads: list[bytes] = field(default_factory=list)  # the state machine
    # (applied index, ConfState from then on), ascending; index 0 = the initial state
    conf_history: list[tuple[int, ConfState]] = field(default_factory=list)

    def conf_state_at(self, index: int) -> ConfState:
        cs = ConfState()
        for i, c in self.conf_history:
            if i > index:
                break
            cs = c
        return cs

    def conf_state(self) -> ConfState:
        return self.conf_history[-1][1] if self.conf_history else ConfState()


class _TraceLogger:
    """Config.logger: turns the core's log calls into output lines."""

    def __init__(self, env: InteractionEnv) -> None:
        self._env = env

    def _log(self, level: str, fmt: str, *args) -> None:
        self._env.write(f"{level} " + (fmt % args if args else fmt))

    def debug(self, fmt: str, *args) -> None:  # quieter than info: never printed
        pass

    def info(self, fmt: str, *args) -> None:
        self._log("INFO", fmt, *args)

    def warning(self, fmt: str, *args) -> None:
        self._log("WARN", fmt, *args)

    def error(self, fmt: str, *args) -> None:
        self._log("ERROR", fmt, *args)


class InteractionEnv:
    def __init__(self) -> None:
        self.nodes: dict[int, TraceNode] = {}
        self.messages: list[Message] = []  # sent, not yet delivered or dropped; FIFO
        self.silent = False  # log-level none
        self._out: list[str] = []
        self._indent = 0
        self.logger = _TraceLogger(self)

    # --- output ---

    def write(self, text: str) -> None:
        if self.silent:
            return
        pad = INDENT * self._indent
        for line in text.split("\n"):
            self._out.append(pad + line)

    @contextmanager
    def indented(self) -> Iterator[None]:
        self._indent += 1
        try:
            yield
        finally:
            self._indent -= 1

    def take_output(self) -> str:
        out, self._out = self._out, []
        self._indent = 0
        return "\n".join(out)

    # --- nodes ---

    def node(self, node_id: int) -> TraceNode:
        n = self.nodes.get(node_id)
        if n is None:
            raise EnvError(f"no node {node_id}")
        return n

    def add_node(self, conf_state: ConfState, index: int, config_kw: dict) -> TraceNode:
        """Add node ``len(nodes)+1``. With a non-empty ``conf_state`` its storage starts from
        a snapshot at ``index`` (term 1) holding that configuration and a HardState at term 1
        committed to ``index``, as if the cluster had been bootstrapped and compacted (the
        first election is then at term 2); otherwise the storage is empty (a node that joins
        later and receives a snapshot from the leader)."""
        node_id = len(self.nodes) + 1
        if node_id > MAX_NODES:
            raise EnvError(f"at most {MAX_NODES} nodes")
        storage = MemoryStorage()
        history: list[tuple[int, ConfState]] = [(0, ConfState())]
        applied = 0
        if conf_state.voters or conf_state.learners:
            if index < 1:
                raise EnvError("index must be at least 1")
            storage.apply_snapshot(
                Snapshot(metadata=SnapshotMetadata(conf_state=conf_state, index=index, term=1))
            )
            # Term 1, as a bootstrapped etcd node: a node's term is never below its last log
            # term. (At term 0 the first leader would have term 1 and mistake the snapshot's
            # term-1 index for an entry committed in its own term, e.g. serving ReadIndex
            # before its empty entry commits.)
            storage.set_hard_state(HardState(term=1, vote=0, commit=index))
            history.append((index, conf_state))
            applied = index
        kw = dict(config_kw)
        jitter_seed = kw.pop("jitter_seed", None)
        rng = (
            NoJitterRandom() if jitter_seed is None else random.Random(jitter_seed * 1000 + node_id)
        )
        config = Config(id=node_id, storage=storage, rng=rng, logger=self.logger, **kw)
        try:
            rawnode = RawNode(config)
        except RaftError as e:
            raise EnvError(f"cannot create node {node_id}: {type(e).__name__}: {e}") from None
        node = TraceNode(
            node_id, storage, rawnode, config, applied_index=applied, conf_history=history
        )
        self.nodes[node_id] = node
        return node

    def restart(self, node_id: int) -> None:
        """Crash and restart ``node_id``: a new RawNode over the same MemoryStorage.

        Everything the node handed out in Readies was persisted (process_ready does it all),
        so nothing durable is lost; volatile state (role, leader, progress, pending reads) is.
        The state machine is volatile too: it restarts from the storage's snapshot, and the
        new RawNode hands out the committed entries after it again (Config.applied = the
        snapshot index), re-applying their conf changes — the way config.py asks a driver to.
        Messages already in the queue stay there, like packets in flight.
        """
        n = self.node(node_id)
        snap = n.storage.snapshot()
        config = replace(n.config, applied=snap.metadata.index)
        try:
            rawnode = RawNode(config)
        except RaftError as e:
            raise EnvError(f"cannot restart node {node_id}: {type(e).__name__}: {e}") from None
        n.rawnode = rawnode
        n.config = config
        self._apply_snapshot(n, snap)

    # --- the driver loop ---

    def process_ready(self, node_id: int) -> None:
        """Handle one Ready of ``node_id`` (persist -> send -> apply -> advance), printing it."""
        n = self.node(node_id)
        rd = n.rawnode.ready()
        self.write(str(rd))
        # 1. persist
        if rd.snapshot is not None:
            n.storage.apply_snapshot(rd.snapshot)
        if rd.entries:
            n.storage.append(rd.entries)
        if rd.hard_state is not None:
            n.storage.set_hard_state(rd.hard_state)
        # 2. send
        self.messages.extend(rd.messages)
        # 3. apply
        if rd.snapshot is not None:
            self._apply_snapshot(n, rd.snapshot)
        for e in rd.committed_entries:
            if e.index <= n.applied_index:
                raise AssertionError(
                    f"node {n.id}: committed entry {e} handed out again (applied {n.applied_index})"
                )
            if e.type == EntryType.CONF_CHANGE:
                cs = n.rawnode.apply_conf_change(ConfChange.decode(e.data))
                n.conf_history.append((e.index, cs))
            elif e.type == EntryType.NORMAL and e.data:
                n.payloads.append(e.data)
            n.applied_index = e.index
        # 4. advance
        n.rawnode.advance(rd)

    def _apply_snapshot(self, n: TraceNode, snap: Snapshot) -> None:
        meta = snap.metadata
        n.payloads = [p.encode() for p in snap.data.decode().split("\n") if p]
        n.conf_history = [(i, cs) for i, cs in n.conf_history if i < meta.index]
        n.conf_history.append((meta.index, meta.conf_state))
        n.applied_index = meta.index

    def compact(self, node_id: int, index: int) -> None:
        """Snapshot the state machine as of applied index ``index`` and compact the log up to
        it (what a driver does periodically)."""
        n = self.node(node_id)
        if index > n.applied_index:
            raise EnvError(f"cannot compact node {node_id} to {index}: applied {n.applied_index}")
        data = self._state_at(n, index)
        try:
            n.storage.create_snapshot(index, n.conf_state_at(index), data)
            n.storage.compact(index)
        except RaftError as e:
            raise EnvError(f"{type(e).__name__}: {e}") from None

    def _state_at(self, n: TraceNode, index: int) -> bytes:
        # The payloads applied up to ``index``: the ones from the storage snapshot plus the
        # normal entries in (snapshot, index] still in the log.
        snap = n.storage.snapshot()
        payloads = [p for p in snap.data.decode().split("\n") if p]
        lo = snap.metadata.index + 1
        if index >= lo:
            for e in n.storage.entries(lo, index + 1):
                if e.type == EntryType.NORMAL and e.data:
                    payloads.append(e.data.decode("utf-8", "backslashreplace"))
        return "\n".join(payloads).encode()

    # --- the network ---

    def _split(self, to: int, mtype: MessageType | None) -> list[Message]:
        """Remove and return the queued messages to ``to`` (of ``mtype``), in queue order."""
        taken: list[Message] = []
        rest: list[Message] = []
        for m in self.messages:
            if m.to == to and (mtype is None or m.type == mtype):
                taken.append(m)
            else:
                rest.append(m)
        self.messages = rest
        return taken

    def pending_for(self, to: int) -> bool:
        return any(m.to == to for m in self.messages)

    def deliver(self, to: int, drop: bool = False, mtype: MessageType | None = None) -> int:
        """Deliver (or drop) every queued message to ``to``; print each; return the count."""
        if not drop:
            self.node(to)
        msgs = self._split(to, mtype)
        for m in msgs:
            if drop:
                self.write(f"dropped: {m}")
                continue
            self.write(str(m))
            try:
                self.nodes[to].rawnode.step(m)
            except RaftError as e:
                self.write(f"error: {type(e).__name__}: {e}")
        return len(msgs)

    def stabilize(self, ids: list[int]) -> None:
        """Handle Readies of and deliver messages to ``ids`` until nothing changes."""
        for i in ids:
            self.node(i)
        for _ in range(MAX_STABILIZE_ROUNDS):
            done = True
            for i in ids:
                if self.nodes[i].rawnode.has_ready():
                    done = False
                    self.write(f"> {i} handling Ready")
                    with self.indented():
                        self.process_ready(i)
            for i in ids:
                if self.pending_for(i):
                    done = False
                    self.write(f"> {i} receiving messages")
                    with self.indented():
                        self.deliver(i)
            if done:
                return
        raise AssertionError(f"nodes {ids} did not stabilize in {MAX_STABILIZE_ROUNDS} rounds")
