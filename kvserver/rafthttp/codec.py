"""Encoding of raft messages between peers (msgpack), with strict validation on decode.

A message is one msgpack array:

    [type, to, from, term, log_term, index, entries, commit, snapshot, reject, reject_hint,
     context]
    entries  = [[term, index, type, data], ...]
    snapshot = nil | [data, index, term, [voters], [learners], [voters_outgoing],
                      [learners_next], auto_leave]

A batch on the peer stream is an array of messages. ``decode_batch`` never raises anything
but ``PeerMessageError`` on any input, so a bad peer cannot crash a node: the transport drops
the connection and logs the error. Decoding is bounded before any object is built: no array
holds more than ``MAX_ARRAY_ITEMS`` items, and maps, strings and extension types (never
written by ``encode_*``) are refused. The codec checks types only; which values a member may
send is ``kvserver.rafthttp.validate``'s job.
"""

import msgpack

from raft import (
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMetadata,
)

_U64 = (1 << 64) - 1
# Largest array in a message or batch: the entries of one MsgApp (see peer_validate for why
# a legitimate message has at most 65,536) or the messages of one batch (at most the sender's
# queue, 4,096 by default).
MAX_ARRAY_ITEMS = 1 << 17
_UNPACK_LIMITS = dict(
    raw=False,
    use_list=True,
    strict_map_key=True,
    max_array_len=MAX_ARRAY_ITEMS,
    max_map_len=0,
    max_str_len=0,
    max_ext_len=0,
)


class PeerMessageError(ValueError):
    """A peer sent bytes that are not a valid raft message batch."""


def _entry_fields(e: Entry) -> list:
    return [e.term, e.index, int(e.type), e.data]


def _snapshot_fields(s: Snapshot | None):
    if s is None:
        return None
    md = s.metadata
    cs = md.conf_state
    return [
        s.data,
        md.index,
        md.term,
        list(cs.voters),
        list(cs.learners),
        list(cs.voters_outgoing),
        list(cs.learners_next),
        cs.auto_leave,
    ]


def message_fields(m: Message) -> list:
    return [
        int(m.type),
        m.to,
        m.frm,
        m.term,
        m.log_term,
        m.index,
        [_entry_fields(e) for e in m.entries],
        m.commit,
        _snapshot_fields(m.snapshot),
        m.reject,
        m.reject_hint,
        m.context,
    ]


def encode_batch(messages) -> bytes:
    return msgpack.packb([message_fields(m) for m in messages], use_bin_type=True)


def encode_message(m: Message) -> bytes:
    return msgpack.packb(message_fields(m), use_bin_type=True)


def _u64(value, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _U64:
        raise PeerMessageError(f"{what}: want an unsigned 64-bit integer, got {value!r}")
    return value


def _bytes(value, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise PeerMessageError(f"{what}: want bytes, got {type(value).__name__}")
    return value


def _ids(value, what: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise PeerMessageError(f"{what}: want a list of ids")
    return tuple(_u64(v, what) for v in value)


def _entry(fields) -> Entry:
    if not isinstance(fields, list) or len(fields) != 4:
        raise PeerMessageError("entry: want [term, index, type, data]")
    term, index, etype, data = fields
    try:
        etype = EntryType(etype)
    except ValueError:
        raise PeerMessageError(f"entry: unknown type {etype!r}") from None
    return Entry(
        _u64(term, "entry term"), _u64(index, "entry index"), etype, _bytes(data, "entry data")
    )


def _snapshot(fields) -> Snapshot | None:
    if fields is None:
        return None
    if not isinstance(fields, list) or len(fields) != 8:
        raise PeerMessageError("snapshot: want 8 fields")
    data, index, term, voters, learners, outgoing, learners_next, auto_leave = fields
    if type(auto_leave) is not bool:
        raise PeerMessageError("snapshot: auto_leave must be a boolean")
    cs = ConfState(
        _ids(voters, "voters"),
        _ids(learners, "learners"),
        _ids(outgoing, "voters_outgoing"),
        _ids(learners_next, "learners_next"),
        auto_leave,
    )
    return Snapshot(
        _bytes(data, "snapshot data"),
        SnapshotMetadata(cs, _u64(index, "snapshot index"), _u64(term, "snapshot term")),
    )


def _message(fields) -> Message:
    if not isinstance(fields, list) or len(fields) != 12:
        raise PeerMessageError("message: want 12 fields")
    (
        mtype,
        to,
        frm,
        term,
        log_term,
        index,
        entries,
        commit,
        snapshot,
        reject,
        reject_hint,
        context,
    ) = fields
    try:
        mtype = MessageType(mtype)
    except ValueError:
        raise PeerMessageError(f"message: unknown type {mtype!r}") from None
    if not isinstance(entries, list):
        raise PeerMessageError("message: entries must be a list")
    if type(reject) is not bool:
        raise PeerMessageError("message: reject must be a boolean")
    return Message(
        type=mtype,
        to=_u64(to, "to"),
        frm=_u64(frm, "from"),
        term=_u64(term, "term"),
        log_term=_u64(log_term, "log_term"),
        index=_u64(index, "index"),
        entries=tuple(_entry(e) for e in entries),
        commit=_u64(commit, "commit"),
        snapshot=_snapshot(snapshot),
        reject=reject,
        reject_hint=_u64(reject_hint, "reject_hint"),
        context=_bytes(context, "context"),
    )


def decode_message(buf: bytes) -> Message:
    try:
        fields = msgpack.unpackb(buf, **_UNPACK_LIMITS)
    except PeerMessageError:
        raise
    except Exception as exc:  # msgpack raises several types for garbage
        raise PeerMessageError(f"not msgpack: {exc}") from None
    return _message(fields)


def decode_batch(buf: bytes) -> list[Message]:
    try:
        items = msgpack.unpackb(buf, **_UNPACK_LIMITS)
    except Exception as exc:
        raise PeerMessageError(f"not msgpack: {exc}") from None
    if not isinstance(items, list):
        raise PeerMessageError("batch: want a list of messages")
    return [_message(item) for item in items]
