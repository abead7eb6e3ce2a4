"""Bounds and shape checks on raft messages from peers, before they reach the raft core.

The codec (``peer_codec``) guarantees types (every number an unsigned 64-bit integer, every
enum known). This module says which of those well-typed messages a member may send at all.
The transport runs ``check_message`` on every decoded message of a stream frame or snapshot
request; a message that fails is dropped with its whole frame, logged, and the stream closed,
so nothing a bad peer sends changes raft state. The rules follow what the raft core in this
repository (raft/raft.py, modelled on etcd's) can emit, so a correct member never trips them
(tests/kvserver/test_peer_validate.py runs the deterministic simulator and checks every
message it delivers):

- Sender. The message is addressed to this member (``to``). ``from`` is the stream's sender,
  except for the three requests a follower forwards to its leader unchanged (``MsgProp``,
  ``MsgReadIndex``, ``MsgTransferLeader``: raft.py ``_step_follower`` keeps the origin, and
  for ``MsgTransferLeader`` ``from`` is the transferee), whose ``from`` must be a member.
- Type. Local-only types (MsgHup, MsgBeat, MsgUnreachable, MsgSnapStatus, MsgCheckQuorum)
  never travel between members.
- Bounds. Terms and indexes are at most ``MAX_TERM`` = ``MAX_INDEX`` = 2**63 - 1. raft stores
  them as uint64 (etcd raftpb) and computes ``term + 1`` (a campaign, a pre-vote) and
  ``index + 1`` (the next entry); a bound of 2**63 - 1 on what a peer may send leaves 2**63
  elections and appends of headroom before anything can pass 2**64 - 1 (msgpack's limit:
  ``packb`` raises OverflowError beyond it), and every value stays a valid int64 for tools
  that read them signed. Real clusters never get near it (a term per second for 2.9e11 years).
- Term 0. raft treats a message of term 0 as local and skips every term check
  (raft.py ``step``), so only the forwarded requests above may carry term 0; every other
  message must carry a term (raft.py ``_msg`` always sets it).
- Entries. Only ``MsgApp`` and ``MsgProp`` carry entries, and ``MsgReadIndex`` /
  ``MsgReadIndexResp`` exactly one (the request context). A ``MsgProp`` carries at least one
  entry, each with term and index 0 (the leader assigns both). A ``MsgApp``'s entries have
  indexes ``index + 1, index + 2, ...``, terms that never decrease, the first not below
  ``log_term`` and none above the message term (log matching: a leader of term T sends
  entries of terms <= T after an entry of term ``log_term``), and ``log_term <= term``.
  At most ``MAX_ENTRIES_PER_MESSAGE``: the leader cuts messages at 1 MiB of entries
  (kvserver.assembly.member) and an entry counts at least 16 bytes (raft ``Entry.size_bytes``), so a
  legitimate message has at most 65,536; twice that is the bound.
- Commit. ``MsgApp`` commit is not bounded here: raft commits ``min(commit, index +
  len(entries))`` and a leader may send a commit beyond the entries it sends. A heartbeat's
  commit is bounded by raft itself (it is compared with the follower's log). Both stay within
  ``MAX_INDEX``.
- Votes. ``MsgVote``/``MsgPreVote`` carry ``log_term <= term``.
- Snapshots. Only ``MsgSnap`` carries one (and must), with term at most the message term, an
  index >= 1, and non-zero member ids in its configuration.

What this cannot catch: a message with plausible values from a process that presents a member's
ID (no authentication without peer TLS; see docs/security.md).
"""

from collections.abc import Callable

from kvserver.rafthttp.codec import MAX_ARRAY_ITEMS, PeerMessageError
from raft import Message, MessageType
from raft.types import LOCAL_MESSAGES

MAX_TERM = (1 << 63) - 1
MAX_INDEX = (1 << 63) - 1
MAX_ENTRIES_PER_MESSAGE = MAX_ARRAY_ITEMS  # the codec refuses longer arrays before this

# Requests a follower forwards to its leader with the origin's ``from`` (raft.py).
FORWARDED = frozenset(
    {MessageType.MsgProp, MessageType.MsgReadIndex, MessageType.MsgTransferLeader}
)
_ONE_ENTRY = frozenset({MessageType.MsgReadIndex, MessageType.MsgReadIndexResp})
_WITH_ENTRIES = frozenset({MessageType.MsgApp, MessageType.MsgProp}) | _ONE_ENTRY


class PeerValidationError(PeerMessageError):
    """A well-formed message that a member may not send (out of bounds, wrong sender...)."""


def _fail(m: Message, why: str) -> None:
    raise PeerValidationError(f"{m.type} {m.frm:x}->{m.to:x} term {m.term}: {why}")


def check_message(  # noqa: C901 - one flat check per rule a peer message must meet
    m: Message, *, local_id: int, sender: int, is_member: Callable[[int], bool]
) -> None:
    """Raise ``PeerValidationError`` unless ``m``, received on a stream (or snapshot request)
    from ``sender``, is a message a correct member could have sent to ``local_id``."""
    t = m.type
    if t in LOCAL_MESSAGES:
        _fail(m, "a local-only message type")
    if m.to != local_id:
        _fail(m, f"addressed to {m.to:x}, not to this member")
    if t in FORWARDED:
        if m.frm == 0 or not is_member(m.frm):
            _fail(m, "forwarded from a member id that is not in the cluster")
    elif m.frm != sender:
        _fail(m, f"'from' differs from the stream's sender {sender:x}")
    if m.term > MAX_TERM or m.log_term > MAX_TERM:
        _fail(m, f"term or log term above {MAX_TERM}")
    if max(m.index, m.commit, m.reject_hint) > MAX_INDEX:
        _fail(m, f"index, commit or reject hint above {MAX_INDEX}")
    if m.term == 0 and t not in FORWARDED:
        _fail(m, "term 0 (raft would treat it as a local message)")
    if t in FORWARDED and m.term != 0:
        _fail(m, "a forwarded request carries no term")

    entries = m.entries
    if entries:
        if t not in _WITH_ENTRIES:
            _fail(m, "this message type carries no entries")
        if len(entries) > MAX_ENTRIES_PER_MESSAGE:
            _fail(m, f"{len(entries)} entries, more than {MAX_ENTRIES_PER_MESSAGE}")
    if t in _ONE_ENTRY and len(entries) != 1:
        _fail(m, "must carry exactly one entry (the request context)")
    if t == MessageType.MsgProp:
        if not entries:
            _fail(m, "a proposal without entries")
        if any(e.term or e.index for e in entries):
            _fail(m, "a proposed entry carries a term or index (the leader assigns them)")
    elif t == MessageType.MsgApp:
        _check_append(m)
    elif t in (MessageType.MsgVote, MessageType.MsgPreVote) and m.log_term > m.term:
        _fail(m, "last log term above the campaign term")

    if (m.snapshot is not None) != (t == MessageType.MsgSnap):
        _fail(m, "only MsgSnap carries a snapshot, and it must")
    if m.snapshot is not None:
        md = m.snapshot.metadata
        if md.index == 0 or md.index > MAX_INDEX:
            _fail(m, f"snapshot index {md.index} out of range")
        if md.term == 0 or md.term > m.term:
            _fail(m, f"snapshot term {md.term} not in 1..{m.term}")
        cs = md.conf_state
        ids = (*cs.voters, *cs.learners, *cs.voters_outgoing, *cs.learners_next)
        if not cs.voters or 0 in ids:
            _fail(m, "snapshot configuration without voters or with member id 0")


def _check_append(m: Message) -> None:
    if m.log_term > m.term:
        _fail(m, "previous entry's term above the message term")
    prev_term = m.log_term
    for i, e in enumerate(m.entries):
        if e.index != m.index + 1 + i:
            _fail(
                m,
                f"entry {i} has index {e.index}, want {m.index + 1 + i} (consecutive "
                "from index + 1)",
            )
        if e.term < prev_term or e.term > m.term:
            _fail(m, f"entry {e.index} has term {e.term}, want {prev_term}..{m.term}")
        prev_term = e.term
    if m.entries and m.entries[-1].index > MAX_INDEX:
        _fail(m, f"entry index above {MAX_INDEX}")
