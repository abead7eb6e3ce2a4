"""Value types of the raft core: entries, states, messages, conf changes, Ready.

All are frozen, slotted dataclasses (enums for type fields). Their field sets equal etcd's
raftpb messages (and so raftpb/ in this repository), so a driver converts them 1:1:

    Entry            {term, index, type, data}
    HardState        {term, vote, commit}
    ConfState        {voters, learners, voters_outgoing, learners_next, auto_leave}
    SnapshotMetadata {conf_state, index, term}
    Snapshot         {data, metadata}
    ConfChange       {id=1 varint, type=2 varint, node_id=3 varint, context=4 bytes}

``ConfChange.encode`` writes the proto2 wire format with etcd's field numbers (gogoproto
non-nullable scalars always written; ``context`` written only when non-empty), so conf-change
entries written here decode with etcd's ``raftpb.ConfChange`` and vice versa.

``__str__`` is compact and stable: interaction traces print these values verbatim.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum

from raft.errors import ConfChangeError

NONE = 0  # "no node": the id used for "no leader" / "no vote"; real node ids are > 0
ENTRY_OVERHEAD_BYTES = 16  # approximate framing of one entry (term, index, type, length)


class MessageType(IntEnum):
    """etcd raftpb.MessageType numbering; ``str()`` is the etcd name, e.g. "MsgApp"."""

    MsgHup = 0
    MsgBeat = 1
    MsgProp = 2
    MsgApp = 3
    MsgAppResp = 4
    MsgVote = 5
    MsgVoteResp = 6
    MsgSnap = 7
    MsgHeartbeat = 8
    MsgHeartbeatResp = 9
    MsgUnreachable = 10
    MsgSnapStatus = 11
    MsgCheckQuorum = 12
    MsgTransferLeader = 13
    MsgTimeoutNow = 14
    MsgReadIndex = 15
    MsgReadIndexResp = 16
    MsgPreVote = 17
    MsgPreVoteResp = 18

    def __str__(self) -> str:
        return self.name


# Messages a node generates for itself; never accepted from the network.
LOCAL_MESSAGES = frozenset(
    {
        MessageType.MsgHup,
        MessageType.MsgBeat,
        MessageType.MsgUnreachable,
        MessageType.MsgSnapStatus,
        MessageType.MsgCheckQuorum,
    }
)
# Responses: only accepted from peers in the progress tracker (RawNode.step).
RESPONSE_MESSAGES = frozenset(
    {
        MessageType.MsgAppResp,
        MessageType.MsgVoteResp,
        MessageType.MsgHeartbeatResp,
        MessageType.MsgUnreachable,
        MessageType.MsgPreVoteResp,
    }
)


def vote_response_type(t: MessageType) -> MessageType:
    if t == MessageType.MsgVote:
        return MessageType.MsgVoteResp
    if t == MessageType.MsgPreVote:
        return MessageType.MsgPreVoteResp
    raise ValueError(f"not a vote message type: {t}")


class EntryType(IntEnum):
    NORMAL = 0
    CONF_CHANGE = 1
    CONF_CHANGE_V2 = 2

    def __str__(self) -> str:
        return ("EntryNormal", "EntryConfChange", "EntryConfChangeV2")[self.value]


class StateType(IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2
    PRE_CANDIDATE = 3

    def __str__(self) -> str:
        return ("StateFollower", "StateCandidate", "StateLeader", "StatePreCandidate")[self.value]


class ConfChangeType(IntEnum):
    ADD_NODE = 0
    REMOVE_NODE = 1
    UPDATE_NODE = 2
    ADD_LEARNER_NODE = 3

    def __str__(self) -> str:
        return self.name


def format_data(data: bytes, limit: int = 40) -> str:
    """Short, quoted, printable form of a payload for traces."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        if len(text) > limit:
            text = text[:limit] + "..."
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    hexed = data[: limit // 2].hex()
    return "0x" + hexed + ("..." if len(data) > limit // 2 else "")


@dataclass(frozen=True, slots=True)
class Entry:
    term: int
    index: int
    type: EntryType = EntryType.NORMAL
    data: bytes = b""

    def size_bytes(self) -> int:
        """Size used for message and Ready batching limits (payload + fixed overhead)."""
        return len(self.data) + ENTRY_OVERHEAD_BYTES

    def __str__(self) -> str:
        if self.type == EntryType.CONF_CHANGE:
            try:
                body = str(ConfChange.decode(self.data))
            except ConfChangeError:
                body = format_data(self.data)
        else:
            body = format_data(self.data)
        return f"{self.term}/{self.index} {self.type} {body}"


def payload_size_bytes(entries: Iterable[Entry]) -> int:
    """Sum of data lengths: what the uncommitted and inflight byte bounds count (as etcd)."""
    return sum(len(e.data) for e in entries)


def limit_size(entries: list[Entry], max_size_bytes: int | None) -> list[Entry]:
    """Longest prefix within ``max_size_bytes`` (None = no limit); never fewer than one entry."""
    if max_size_bytes is None or len(entries) <= 1:
        return entries
    size = entries[0].size_bytes()
    for n in range(1, len(entries)):
        size += entries[n].size_bytes()
        if size > max_size_bytes:
            return entries[:n]
    return entries


@dataclass(frozen=True, slots=True)
class HardState:
    """The state that must be durable before messages depending on it are sent."""

    term: int = 0
    vote: int = 0
    commit: int = 0

    def is_empty(self) -> bool:
        return self.term == 0 and self.vote == 0 and self.commit == 0

    def __str__(self) -> str:
        return f"Term:{self.term} Vote:{self.vote} Commit:{self.commit}"


def _ids(ids: Iterable[int]) -> str:
    return "[" + " ".join(str(i) for i in ids) + "]"


@dataclass(frozen=True, slots=True)
class ConfState:
    """Membership. Tuples are sorted. Joint consensus is not used by this core, so
    ``voters_outgoing``/``learners_next`` stay empty and ``auto_leave`` False; the fields exist
    so the value matches raftpb.ConfState."""

    voters: tuple[int, ...] = ()
    learners: tuple[int, ...] = ()
    voters_outgoing: tuple[int, ...] = ()
    learners_next: tuple[int, ...] = ()
    auto_leave: bool = False

    def __str__(self) -> str:
        s = f"Voters:{_ids(self.voters)} Learners:{_ids(self.learners)}"
        if self.voters_outgoing or self.learners_next or self.auto_leave:
            s += (
                f" VotersOutgoing:{_ids(self.voters_outgoing)}"
                f" LearnersNext:{_ids(self.learners_next)} AutoLeave:{self.auto_leave}"
            )
        return s


@dataclass(frozen=True, slots=True)
class SnapshotMetadata:
    conf_state: ConfState = field(default_factory=ConfState)
    index: int = 0
    term: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    data: bytes = b""
    metadata: SnapshotMetadata = field(default_factory=SnapshotMetadata)

    def is_empty(self) -> bool:
        return self.metadata.index == 0

    def __str__(self) -> str:
        m = self.metadata
        return f"Index:{m.index} Term:{m.term} ConfState:{m.conf_state}"


@dataclass(frozen=True, slots=True)
class Message:
    """One raft message. ``frm`` is etcd's ``From`` (``from`` is a Python keyword).

    Proposals and read requests forwarded by followers carry term 0 (etcd treats them as
    local). MsgTransferLeader's ``frm`` is the transferee, as in etcd. MsgReadIndex /
    MsgReadIndexResp carry the request context as the data of their single entry.
    """

    type: MessageType
    to: int
    frm: int
    term: int = 0
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    snapshot: Snapshot | None = None
    reject: bool = False
    reject_hint: int = 0
    context: bytes = b""

    def __str__(self) -> str:
        s = f"{self.frm}->{self.to} {self.type} Term:{self.term} Log:{self.log_term}/{self.index}"
        if self.reject:
            s += f" Rejected (Hint: {self.reject_hint})"
        if self.commit:
            s += f" Commit:{self.commit}"
        if self.context:
            s += f" Context:{format_data(self.context)}"
        if self.entries:
            s += " Entries:[" + ", ".join(str(e) for e in self.entries) + "]"
        if self.snapshot is not None and not self.snapshot.is_empty():
            s += f" Snapshot: {self.snapshot}"
        return s


# --- ConfChange and its proto2 encoding -------------------------------------------------

_MAX_U64 = (1 << 64) - 1


def _put_varint(out: bytearray, value: int) -> None:
    if value < 0 or value > _MAX_U64:
        raise ConfChangeError(f"value out of uint64 range: {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _get_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ConfChangeError("truncated varint")
        if shift >= 70:
            raise ConfChangeError("varint longer than 10 bytes")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    if result > _MAX_U64:
        raise ConfChangeError("varint overflows 64 bits")
    return result, pos


@dataclass(frozen=True, slots=True)
class ConfChange:
    """A single membership change (etcd raftpb.ConfChange, the "v1" form)."""

    type: ConfChangeType
    node_id: int
    context: bytes = b""
    id: int = 0

    def __str__(self) -> str:
        # etcd's compact notation: v2 add voter 2, l2 add learner, r2 remove, u2 update.
        letter = {
            ConfChangeType.ADD_NODE: "v",
            ConfChangeType.REMOVE_NODE: "r",
            ConfChangeType.UPDATE_NODE: "u",
            ConfChangeType.ADD_LEARNER_NODE: "l",
        }[self.type]
        return f"{letter}{self.node_id}"

    def encode(self) -> bytes:
        out = bytearray()
        out.append(0x08)  # field 1 (id), varint
        _put_varint(out, self.id)
        out.append(0x10)  # field 2 (type), varint
        _put_varint(out, int(self.type))
        out.append(0x18)  # field 3 (node_id), varint
        _put_varint(out, self.node_id)
        if self.context:
            out.append(0x22)  # field 4 (context), length-delimited
            _put_varint(out, len(self.context))
            out += self.context
        return bytes(out)

    @staticmethod
    def decode(data: bytes) -> ConfChange:
        """Decode; unknown fields are skipped; malformed input raises ConfChangeError."""
        fields = {1: 0, 2: 0, 3: 0}
        context = b""
        pos = 0
        buf = bytes(data)
        while pos < len(buf):
            key, pos = _get_varint(buf, pos)
            num, wire = key >> 3, key & 7
            if num == 0:
                raise ConfChangeError("field number 0")
            if wire == 0:
                value, pos = _get_varint(buf, pos)
                if num in fields:
                    fields[num] = value
            elif wire == 2:
                length, pos = _get_varint(buf, pos)
                if pos + length > len(buf):
                    raise ConfChangeError("truncated bytes field")
                if num == 4:
                    context = buf[pos : pos + length]
                elif num in fields:
                    raise ConfChangeError(f"field {num} has the wrong wire type")
                pos += length
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                raise ConfChangeError(f"unsupported wire type {wire}")
            if pos > len(buf):
                raise ConfChangeError("truncated fixed-width field")
        try:
            cc_type = ConfChangeType(fields[2])
        except ValueError:
            raise ConfChangeError(f"unknown conf change type {fields[2]}") from None
        return ConfChange(type=cc_type, node_id=fields[3], context=context, id=fields[1])


# --- RawNode output ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state, useful for logging and for the driver; never persisted."""

    lead: int
    raft_state: StateType

    def __str__(self) -> str:
        return f"Lead:{self.lead} State:{self.raft_state}"


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read point: once ``applied >= index``, the read ``request_ctx`` may
    be served from the local state machine."""

    index: int
    request_ctx: bytes

    def __str__(self) -> str:
        return f"Index:{self.index} RequestCtx:{format_data(self.request_ctx)}"


@dataclass(frozen=True, slots=True)
class Ready:
    """Work for the caller: what to persist, send and apply, then ``RawNode.advance()``.

    The contract, for each Ready, in this order:

    1. Persist ``snapshot`` (if not None), then append ``entries`` and save ``hard_state``
       (if not None) to stable storage. Fsync when ``must_sync``: it is True when entries or a
       snapshot are present or the term/vote changed; a commit-only change needs no sync.
    2. Send ``messages``. A leader may send its MsgApp / MsgSnap / MsgHeartbeat before its own
       write of step 1 completes (Raft thesis §10.2.1: the leader counts itself towards a
       commit quorum only once ``advance()`` reports its write as done) — unless this Ready's
       ``hard_state`` changes the term or vote (a one-voter leader elected within this
       Ready): then everything waits for the write. Every other message may depend on the
       write: MsgAppResp acknowledges entries, MsgVoteResp/MsgPreVoteResp grant votes
       recorded in ``hard_state``, a candidate's MsgVote carries its new term — so send them
       only after step 1 is durable.
    3. Apply ``snapshot`` (if any) and then ``committed_entries`` to the state machine, calling
       ``RawNode.apply_conf_change`` for each conf-change entry. ``read_states`` become
       servable once the applied index reaches their index.
    4. Call ``RawNode.advance()``.

    Only one Ready is outstanding at a time: ``ready()`` may not be called again before
    ``advance()``, and ``has_ready()`` is False meanwhile. ``step``/``tick``/``propose`` may be
    called while a Ready is outstanding (their output goes into the next Ready). A driver
    that does 1→2→3→4 sequentially is always correct.

    ``soft_state``/``hard_state`` are None when unchanged since the previous Ready.

    A leader builds its MsgApps when ``ready()`` is called, from its state at that moment:
    everything proposed or acknowledged since the previous Ready shares them (one MsgApp
    per follower for all new entries, within max_size_per_msg_bytes and the inflight
    window; at most one commit-only MsgApp per follower). So a driver should step and
    propose all it has queued before calling ``ready()``.
    """

    soft_state: SoftState | None = None
    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: Snapshot | None = None
    committed_entries: tuple[Entry, ...] = ()
    messages: tuple[Message, ...] = ()
    read_states: tuple[ReadState, ...] = ()
    must_sync: bool = False

    def __str__(self) -> str:
        lines: list[str] = []
        if self.soft_state is not None:
            lines.append(str(self.soft_state))
        if self.hard_state is not None:
            lines.append(f"HardState {self.hard_state}")
        if self.read_states:
            lines.append("ReadStates " + ", ".join(str(r) for r in self.read_states))
        if self.entries:
            lines.append("Entries:")
            lines.extend(str(e) for e in self.entries)
        if self.snapshot is not None:
            lines.append(f"Snapshot {self.snapshot}")
        if self.committed_entries:
            lines.append("CommittedEntries:")
            lines.extend(str(e) for e in self.committed_entries)
        if self.messages:
            lines.append("Messages:")
            lines.extend(str(m) for m in self.messages)
        if not lines:
            return "<empty Ready>"
        return f"Ready MustSync={str(self.must_sync).lower()}:\n" + "\n".join(lines)
