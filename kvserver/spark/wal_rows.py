"""One WAL segment's bytes as table rows (the ``raftkv-wal`` data source's decoder; no Spark).

``segment_rows(buf, segment=..., ...)`` walks the frames of one segment with the project's
own reader (``wal.decoder.iter_raw_records``, the same walk as ``raftkv wal dump``) and
returns one ``dict`` per record, keys ``COLUMNS``:

* every record: ``member``/``cluster`` (16 hex digits, from the segment's metadata record,
  or from the archive manifest, which must agree), ``segment``, ``offset`` (of the frame in
  the segment), ``record_type`` (``crc``, ``metadata``, ``entry``, ``state``, ``snapshot``
  or ``unknown(N)``, as ``wal dump`` names them);
* ``entry``: ``term``, ``index``, ``entry_type`` (``normal``, ``conf_change``,
  ``conf_change_v2``) and the decoded request (``decode_request``); ``state``: ``term``,
  ``vote`` (the member voted for, 16 hex digits; null: none), ``commit``; ``snapshot``: ``index``, ``term``.

The running CRC-32C is checked from the segment's first crc record on (the chain across
segments is ``raftkv wal verify``'s job); a mismatch or a frame that does not parse raises
``WalDecodeError`` naming the segment and offset, except a torn tail (``wal.decoder.is_torn``)
of the newest segment, which ends the data as ``wal.open_for_read`` does.

``committed=Committed(commit, later_min)`` keeps only ``entry`` rows that the wal reader
keeps: index <= ``commit`` (the last hard state's commit of the whole log) and not
overwritten, i.e. no later entry record — later in this segment, or in a later segment
(``later_min``: the smallest entry index in the segments after this one) — has an index
<= its own (a rewrite of an index drops the earlier tail, Raft figure 7).
``summarize(buf)`` gives what the planner needs for that: (smallest entry index, last
commit) of one segment.

Request decoding (``decode_request``): a normal entry is ``origin (8 bytes, random per
member process) | proposal sequence (8) | payload`` (``kvserver.server.node``); the payload is a
lease entry (``kvserver.lease.codec``) or an MVCC entry (``kvserver.mvcc.codec``) carrying the
client id and request id the client sent. ``operation`` is ``put``, ``delete_range``,
``txn``, ``compaction``, ``lease_grant``, ``lease_revoke``, ``lease_checkpoint``, ``empty``
(a new leader's no-op), ``conf_change``, ``conf_change_v2`` or ``undecodable`` (then
``request`` holds the decoder's error); ``keys`` lists the keys a write names (a txn: every
put and delete of both branches, nested txns included; compares are in ``request``);
``request`` is the whole request as JSON. Bytes that are not UTF-8 appear as ``\\xNN``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from typing import TypedDict

import raftpb
from kvserver.kvpb.kv import DeleteRangeRequest, PutRequest, TxnRequest
from kvserver.lease.codec import decode_lease_entry, is_lease_entry
from kvserver.membership.identity import decode_metadata
from kvserver.mvcc.codec import decode_entry
from raft.types import ConfChange
from raftpb import DecodeError
from wal.crc import crc32c_update
from wal.decoder import BadRecord, is_torn, iter_raw_records
from wal.frame import RecordType

COLUMNS = (
    "member",
    "cluster",
    "segment",
    "offset",
    "record_type",
    "term",
    "index",
    "entry_type",
    "vote",
    "commit",
    "origin",
    "operation",
    "keys",
    "client_id",
    "request_id",
    "request",
)

SCHEMA = (
    "member string, cluster string, segment string, offset long, record_type string, "
    "term long, index long, entry_type string, vote string, commit long, origin string, "
    "operation string, keys array<string>, client_id decimal(20,0), "
    "request_id decimal(20,0), request string"
)

ENTRY_TYPES = {0: "normal", 1: "conf_change", 2: "conf_change_v2"}
_HEADER_BYTES = 16  # origin | sequence (kvserver.server.node.PROPOSAL_HEADER_BYTES)


class WalDecodeError(ValueError):
    """A segment that does not read (the message names it and the offset)."""


@dataclass(frozen=True)
class Committed:
    commit: int
    later_min: int | None  # smallest entry index in later segments (None: no entries)


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="backslashreplace")


def _plain(obj):
    """JSON-ready form of a decoded request (bytes as text, enums by name)."""
    if isinstance(obj, bytes | bytearray):
        return _text(bytes(obj))
    if isinstance(obj, enum.Enum):
        return obj.name.lower()
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if v is None or v == () or v == b"" or v is False:
                continue  # defaults are noise in an audit record
            out[f.name] = _plain(v)
        return out
    if isinstance(obj, tuple | list):
        return [_plain(v) for v in obj]
    return obj


def _write_keys(req, out: list[str]) -> None:

    if isinstance(req, PutRequest | DeleteRangeRequest):
        out.append(_text(req.key))
    elif isinstance(req, TxnRequest):
        for op in (*req.success, *req.failure):
            inner = op.request_put or op.request_delete_range or op.request_txn
            if inner is not None:
                _write_keys(inner, out)


_OPERATIONS = {
    "PutRequest": "put",
    "DeleteRangeRequest": "delete_range",
    "TxnRequest": "txn",
    "CompactionRequest": "compaction",
    "RangeRequest": "range",
    "LeaseGrantRequest": "lease_grant",
    "LeaseRevokeRequest": "lease_revoke",
    "LeaseCheckpointRequest": "lease_checkpoint",
}


class RequestColumns(TypedDict):
    """The columns ``decode_request`` fills (None: not applicable to the entry)."""

    origin: str | None  # 16 hex digits
    operation: str | None
    keys: list[str] | None
    client_id: int | None
    request_id: int | None
    request: str | None  # JSON


def decode_request(entry_type: int, data: bytes | None) -> RequestColumns:
    """origin, operation, keys, client_id, request_id and request of one entry's data."""
    out: RequestColumns = {
        "origin": None,
        "operation": None,
        "keys": None,
        "client_id": None,
        "request_id": None,
        "request": None,
    }
    data = data or b""
    if entry_type == 1:
        out["operation"] = "conf_change"
        try:
            cc = ConfChange.decode(data)
            out["request"] = json.dumps(
                {
                    "type": cc.type.name.lower(),
                    "node_id": f"{cc.node_id:x}",
                    "id": cc.id,
                    "context": _text(cc.context),
                },
                sort_keys=True,
            )
        except Exception as exc:  # a damaged conf change is shown, not hidden
            out["operation"] = "undecodable"
            out["request"] = json.dumps({"error": f"conf change: {exc}"})
        return out
    if entry_type != 0:
        out["operation"] = ENTRY_TYPES.get(entry_type, f"entry_type_{entry_type}")
        return out
    if not data:
        out["operation"] = "empty"
        return out

    if len(data) < _HEADER_BYTES:
        out["operation"] = "undecodable"
        out["request"] = json.dumps({"error": f"{len(data)}-byte entry has no proposal header"})
        return out
    out["origin"] = data[:8].hex()
    payload = data[_HEADER_BYTES:]
    try:
        if is_lease_entry(payload):
            client_id, request_id, req = decode_lease_entry(payload)
        else:
            client_id, request_id, req = decode_entry(payload)
    except Exception as exc:  # CodecError and friends: the row says what is wrong
        out["operation"] = "undecodable"
        out["request"] = json.dumps({"error": str(exc)})
        return out
    keys: list[str] = []
    _write_keys(req, keys)
    out["operation"] = _OPERATIONS.get(type(req).__name__, type(req).__name__)
    out["keys"] = keys
    out["client_id"] = client_id
    out["request_id"] = request_id
    out["request"] = json.dumps(_plain(req), sort_keys=True)
    return out


def _type_name(t: int) -> str:
    try:
        return RecordType(t).name.lower()
    except ValueError:
        return f"unknown({t})"


def summarize(buf, where: str = "segment") -> tuple[int | None, int | None]:
    """(smallest entry index, last hard-state commit) of one segment (None: none there)."""
    low = commit = None
    try:
        for rec in iter_raw_records(buf):
            if rec.type == RecordType.ENTRY and rec.data is not None:
                i = raftpb.decode_entry(rec.data).index
                low = i if low is None else min(low, i)
            elif rec.type == RecordType.STATE and rec.data is not None:
                commit = raftpb.decode_hard_state(rec.data).commit
    except BadRecord:
        pass  # segment_rows reports (or tolerates) it when the segment is read
    except DecodeError as exc:
        raise WalDecodeError(f"{where}: {exc}") from None
    return low, commit


def segment_rows(
    buf,
    *,
    segment: str,
    where: str,
    newest: bool,
    member: int | None = None,
    cluster: int | None = None,
    committed: Committed | None = None,
) -> list[dict]:
    """The rows of one segment (see the module docstring)."""

    rows: list[dict] = []
    running = None
    meta = None
    try:
        for raw in iter_raw_records(buf):
            data = raw.data
            if raw.type == RecordType.CRC:
                if running is not None and raw.crc != running:
                    raise WalDecodeError(
                        f"{where}: crc record at offset {raw.offset} says "
                        f"{raw.crc:08x}, the records before it {running:08x}"
                    )
                running = raw.crc
            else:
                running = crc32c_update(data or b"", running or 0)
                if raw.crc != running:
                    raise WalDecodeError(
                        f"{where}: CRC mismatch at offset {raw.offset} "
                        f"(raftkv wal verify tells more)"
                    )
            row = {"segment": segment, "offset": raw.offset, "record_type": _type_name(raw.type)}
            try:
                if raw.type == RecordType.ENTRY and data is not None:
                    e = raftpb.decode_entry(data)
                    row.update(
                        term=e.term, index=e.index, entry_type=ENTRY_TYPES.get(e.type, str(e.type))
                    )
                    row.update(decode_request(e.type, e.data))
                elif raw.type == RecordType.STATE and data is not None:
                    hs = raftpb.decode_hard_state(data)
                    row.update(
                        term=hs.term, vote=f"{hs.vote:016x}" if hs.vote else None, commit=hs.commit
                    )
                elif raw.type == RecordType.SNAPSHOT and data is not None:
                    s = raftpb.decode_wal_snapshot(data)
                    row.update(term=s.term, index=s.index)
                elif raw.type == RecordType.METADATA and meta is None:
                    meta = decode_metadata(data or b"")
            except DecodeError as exc:
                raise WalDecodeError(
                    f"{where}: record at offset {raw.offset} does not decode: {exc}"
                ) from None
            rows.append(row)
    except BadRecord as bad:
        if not (newest and is_torn(buf, bad.offset, bad.kind)):
            raise WalDecodeError(
                f"{where}: bad record at offset {bad.offset}: {bad.reason} "
                f"(raftkv wal verify tells more)"
            ) from None
        # a torn tail of the newest segment: never acknowledged, the data ends here
    if meta is not None:
        if member is not None and (meta[0], meta[1]) != (member, cluster):
            raise WalDecodeError(
                f"{where}: its metadata names member {meta[0]:x} of cluster "
                f"{meta[1]:x}, not {member:x} of {cluster:x}"
            )
        member, cluster = meta
    m = None if member is None else f"{member:016x}"
    c = None if cluster is None else f"{cluster:016x}"
    for row in rows:
        row["member"] = m
        row["cluster"] = c
    if committed is not None:
        rows = _committed_entries(rows, committed)
    return rows


def _committed_entries(rows: list[dict], committed: Committed) -> list[dict]:
    kept = []
    low = committed.later_min
    for row in reversed(rows):  # suffix minimum of entry indexes: what a later write drops
        if row["record_type"] != "entry":
            continue
        i = row["index"]
        if i <= committed.commit and (low is None or i < low):
            kept.append(row)
        low = i if low is None else min(low, i)
    kept.reverse()
    return kept
