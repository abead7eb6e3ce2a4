"""Snapshot stream of the MVCC store: chunked msgpack, exact round trip.

Byte layout
-----------
The stream is a sequence of msgpack objects, cut into chunks of about ``chunk_size_bytes``
(a chunk boundary may fall anywhere inside an object; concatenating the chunks gives the
stream):

1. header map ``{"magic": "raftkv-mvcc-snapshot", "version": 2, "revision": R,
   "compact_revision": C}``
2. ``["base", batch]`` zero or more times: for each key (in key order) whose oldest
   retained version is below ``C``, that version. (After a compaction at ``C`` a key keeps at
   most one version below ``C`` and it is never a tombstone; versions the store's background
   compaction has not cut yet are not written, so the stream does not depend on its progress.)
3. ``["log", batch]`` zero or more times: every version with ``mod_revision >= C``
   in the order it was applied (tombstones included, except those at exactly ``C``, which
   compaction removed).
4. ``["dedup", [[client_id, [[request_id, outcome], ...]], ...]]`` zero or more times: the
   deduplication table in least-recently-used-first order; ``outcome`` is a response or
   error in ``codec`` form.
5. ``["end", {"base": n, "log": n, "dedup_clients": n}]``: counts, so truncation is caught.

A batch holds up to ``_BATCH_MAX_RECORDS`` records, each a ``KeyValue`` (key, value,
create_revision, mod_revision, version, lease; a tombstone has ``create_revision == 0``). In
format version 2, written now, a batch is its columns: ``[[key, ...], [value, ...], creates,
mods, versions, leases]``, each integer column one msgpack binary of little-endian signed
integers, all of one width: 2, 4 or 8 bytes, the narrowest that holds the column (every such
field is validated to int64 on its way in; the width is the binary's length divided by the
number of keys). A million records then decode as a few thousand binaries and lists instead
of a million six-field arrays: a restart restores its snapshot sooner. Version 1, whose
batch is a list of records ``[key, value, create_revision, mod_revision, version, lease]``,
is still read (snapshot files written before).

Serializing while the store applies
------------------------------------
``serialize`` reads a ``SnapshotView``: references to the store's own key index and change
log, with the revision, compact revision and log length fixed when the view was taken, and a
copy of the (bounded) deduplication table. Nothing is copied per key, so taking the view is
O(1) and each chunk costs about ``chunk_size_bytes`` of work, however large the store is (it
also yields after ``_KEYS_PER_STEP`` keys scanned without output). The store may keep
applying between chunks: a history list is only appended to, with versions above the view's
revision, which the stream ignores; a new key's versions are all above it; the log is only
appended to or replaced by a new list. The one thing that would change what the stream
reads, cutting old versions, is held off by the store while a stream is open
(``MVCCStore.serialize``). ``SnapshotLoader`` accepts chunks incrementally
(``feed``) so an event loop can restore as bytes arrive; ``finish`` checks the trailer and
returns the parts ``MVCCStore.from_parts`` builds the store from.
"""

from __future__ import annotations

import dataclasses
import sys
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice, repeat
from operator import attrgetter, le, lt
from typing import Any

import msgpack

from kvserver.kvpb.errors import CodecError, SnapshotFormatError
from kvserver.kvpb.kv import KeyValue
from kvserver.mvcc.codec import from_plain, to_plain


@dataclass(frozen=True, slots=True)
class SnapshotView:
    """What ``serialize`` reads: the store's live structures plus the revisions and log end
    fixed when the view was taken (see "Serializing while the store applies")."""

    revision: int
    compact_revision: int
    index: Any  # the store's KeyIndex: key -> history list (read, never written)
    log: list[KeyValue]
    log_start: int
    log_end: int
    dedup: list[tuple[int, list[tuple[int, Any]]]]


@dataclass(frozen=True, slots=True)
class SnapshotParts:
    """A decoded, checked snapshot: what ``MVCCStore.from_parts`` builds a store from."""

    revision: int
    compact_revision: int
    # each key's retained version below the compact revision, in key order (a list: a dict
    # of two million keys took 0.5 s to build, and the store builds its own index)
    base: list[KeyValue]
    log: list[KeyValue]  # every record from the compact revision on, in revision order
    dedup: list[tuple[int, list[tuple[int, Any]]]]


_MOD = attrgetter("mod_revision")
MAGIC = "raftkv-mvcc-snapshot"
FORMAT_VERSION = 2  # columnar batches; version 1 (a batch of records) is still read
_READABLE_VERSIONS = (1, 2)
DEFAULT_CHUNK_SIZE_BYTES = 64 * 1024
_BATCH_MAX_RECORDS = 1024
_KEYS_PER_STEP = 4096  # keys the base section scans between two yields
_RECORD_OVERHEAD_BYTES = 24  # msgpack framing + four integers, roughly
_MAX_BUFFER_BYTES = 256 * 1024 * 1024  # one msgpack object (a batch) never exceeds this


_KEY = attrgetter("key")
_CREATE = attrgetter("create_revision")
_VALUE = attrgetter("value")
_INT_FIELDS = tuple(
    attrgetter(name) for name in ("create_revision", "mod_revision", "version", "lease")
)
_BIG_ENDIAN = sys.byteorder == "big"


# The array type code of each integer width a column may use, checked on this platform.
_TYPECODES = {array(code).itemsize: code for code in ("h", "i", "q")}
assert sorted(_TYPECODES) == [2, 4, 8], "needs 16-, 32- and 64-bit array type codes"


def _width(lo: int, hi: int) -> int:
    """The narrowest width of a column whose values lie in [lo, hi]."""
    if -(1 << 15) <= lo and hi < 1 << 15:
        return 2
    return 4 if -(1 << 31) <= lo and hi < 1 << 31 else 8


def _int_column(values: list[int]) -> bytes:
    column = array(_TYPECODES[_width(min(values), max(values))], values)
    if _BIG_ENDIAN:
        column.byteswap()
    return column.tobytes()


def _columns(kvs: list[KeyValue]) -> list:
    """A batch of records as format version 2 writes it (see the module docstring)."""
    return [
        list(map(_KEY, kvs)),
        list(map(_VALUE, kvs)),
        *(_int_column(list(map(field, kvs))) for field in _INT_FIELDS),
    ]


def serialize(
    view: SnapshotView, chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES
) -> Iterator[bytes]:
    """Yield the snapshot of ``view`` in chunks of about ``chunk_size_bytes``."""
    out = _StreamWriter(view, chunk_size_bytes)
    yield from out.batches("base", _base_records(view))
    yield from out.batches("log", _log_records(view, view.log_start))
    yield from out.tail(base=0, log=0)


def serialize_records(
    revision: int,
    compact_revision: int,
    base: Iterable[KeyValue],
    log: Iterable[KeyValue],
    chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES,
) -> Iterator[bytes]:
    """A stream of a store that is not in memory as an ``MVCCStore`` (an imported file):
    ``base`` (each key's retained version below ``compact_revision``, in key order) and
    ``log`` (every record from ``compact_revision`` on, in revision order), as ``serialize``
    would write that store; no deduplication table. ``SnapshotLoader.finish`` checks it."""
    view = SnapshotView(revision, compact_revision, None, [], 0, 0, [])
    out = _StreamWriter(view, chunk_size_bytes)
    yield from out.batches("base", iter(base))
    yield from out.batches("log", iter(log))
    yield from out.tail(base=0, log=0)


def serialize_after(
    view: SnapshotView,
    prev_stream: bytes | memoryview,
    prev: StreamLayout,
    chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES,
    on_layout: Callable[[StreamLayout], None] | None = None,
) -> Iterator[bytes | memoryview]:
    """The snapshot of ``view`` as a continuation of ``prev_stream``, an earlier snapshot of
    the same store whose layout is ``prev`` (``read_layout``): a new header, then the earlier
    stream's base and log sections as they are (one memoryview of ``prev_stream``, not
    copied), then log batches of the versions applied since, the deduplication table and
    the counts. Its cost is that of the versions since ``prev.revision``, not of the store.

    Only valid while no compaction has run since (``view.compact_revision`` equals
    ``prev.compact_revision``): the base section and the log's start are then unchanged, and
    every version since is in the log after the ones ``prev_stream`` holds. Decoded, the
    result equals ``serialize(view)`` (its batches may be cut at other records).

    ``on_layout``, if given, is called with the new stream's layout once the last chunk
    has been handed out: what ``read_layout`` would find in it, known here without reading
    the stream back (at a million keys that read is tens of milliseconds of the interpreter
    lock after every snapshot)."""
    if view.compact_revision != prev.compact_revision or view.revision < prev.revision:
        raise ValueError("the earlier stream is not a prefix of this view's")
    out = _StreamWriter(view, chunk_size_bytes)
    body_start = out.written
    yield bytes(out.buf)
    out.buf = bytearray()
    yield memoryview(prev_stream)[prev.body_start : prev.body_end]
    since = bisect_right(view.log, prev.revision, lo=view.log_start, hi=view.log_end, key=_MOD)
    yield from out.batches("log", _log_records(view, since))
    # the body: the header's end, the earlier body, the new log batches packed after it
    body_end = out.written + (prev.body_end - prev.body_start)
    yield from out.tail(base=prev.base_count, log=prev.log_count)
    if on_layout is not None:
        on_layout(
            StreamLayout(
                view.revision,
                view.compact_revision,
                body_start,
                body_end,
                prev.base_count + out.counts["base"],
                prev.log_count + out.counts["log"],
            )
        )


class _StreamWriter:
    """The header on construction, then sections of batches, buffered into chunks."""

    def __init__(self, view: SnapshotView, chunk_size_bytes: int) -> None:
        if chunk_size_bytes < 1:
            raise ValueError("chunk_size_bytes must be positive")
        self.view = view
        self.chunk_size_bytes = chunk_size_bytes
        self.batch_budget = max(1, chunk_size_bytes // 2)
        self.packer = msgpack.Packer(use_bin_type=True)
        self.counts = {"base": 0, "log": 0, "dedup_clients": 0}
        self.buf = bytearray(
            self.packer.pack(
                {
                    "magic": MAGIC,
                    "version": FORMAT_VERSION,
                    "revision": view.revision,
                    "compact_revision": view.compact_revision,
                }
            )
        )
        self.written = len(self.buf)  # bytes packed so far, the header's included

    def batches(self, section: str, records: Iterator[KeyValue | None]) -> Iterator[bytes]:
        batch: list[KeyValue] = []
        size = 0
        for kv in records:
            if kv is None:  # a yield point: hand out what is buffered, even nothing
                yield bytes(self.buf)
                self.buf = bytearray()
                continue
            batch.append(kv)
            size += len(kv.key) + len(kv.value) + _RECORD_OVERHEAD_BYTES
            if size >= self.batch_budget or len(batch) >= _BATCH_MAX_RECORDS:
                self._pack(section, _columns(batch), len(batch))
                batch, size = [], 0
                if len(self.buf) >= self.chunk_size_bytes:
                    yield bytes(self.buf)
                    self.buf = bytearray()
        if batch:
            self._pack(section, _columns(batch), len(batch))

    def tail(self, base: int, log: int) -> Iterator[bytes]:
        """The deduplication table and the counts (``base`` and ``log`` records written
        before this writer's own)."""
        clients: list[Any] = []
        size = 0
        for cid, items in self.view.dedup:
            clients.append([cid, [[rid, to_plain(outcome)] for rid, outcome in items]])
            size += 64 * len(items)
            if size >= self.batch_budget:
                self._pack("dedup", clients, len(clients), "dedup_clients")
                clients, size = [], 0
                if len(self.buf) >= self.chunk_size_bytes:
                    yield bytes(self.buf)
                    self.buf = bytearray()
        if clients:
            self._pack("dedup", clients, len(clients), "dedup_clients")
        counts = dict(self.counts)
        counts["base"] += base
        counts["log"] += log
        self._append(self.packer.pack(["end", counts]))
        yield bytes(self.buf)

    def _pack(self, section: str, body: list, n: int, counted_as: str = "") -> None:
        self.counts[counted_as or section] += n
        self._append(self.packer.pack([section, body]))

    def _append(self, packed: bytes) -> None:
        self.buf += packed
        self.written += len(packed)


@dataclass(frozen=True, slots=True)
class StreamLayout:
    """Where the parts of a format-2 stream lie (offsets from the stream's start): what
    ``serialize_after`` continues from."""

    revision: int
    compact_revision: int
    body_start: int  # the first base or log batch (the header ends here)
    body_end: int  # after the last log batch (the deduplication table or the end)
    base_count: int
    log_count: int


class _ViewReader:
    """A file-like reader over a buffer, for ``msgpack.Unpacker``: a MiB per read, so the
    unpacker's buffer stays small whatever the stream's size."""

    def __init__(self, data: bytes | memoryview) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def read(self, n: int) -> bytes:
        piece = bytes(self._view[self._pos : self._pos + n])
        self._pos += len(piece)
        return piece


def read_layout(stream: bytes | memoryview) -> StreamLayout:
    """The layout of a stream ``serialize`` or ``serialize_after`` wrote in format version 2,
    found by skipping over its batches without decoding them (a 270 MiB stream of a million
    keys in about 30 ms). Raises ``SnapshotFormatError`` for anything else: another version,
    sections out of order, a missing trailer."""
    unpacker = msgpack.Unpacker(
        _ViewReader(stream), raw=False, read_size=1 << 20, max_buffer_size=_MAX_BUFFER_BYTES
    )
    try:
        header = unpacker.unpack()
        if (
            type(header) is not dict
            or header.get("magic") != MAGIC
            or header.get("version") != FORMAT_VERSION
            or type(header.get("revision")) is not int
            or type(header.get("compact_revision")) is not int
        ):
            raise SnapshotFormatError("not a raftkv MVCC snapshot of the current version")
        body_start = body_end = unpacker.tell()
        stage = 0
        while True:
            if unpacker.read_array_header() != 2:
                raise SnapshotFormatError("malformed snapshot section")
            section = unpacker.unpack()
            if section not in _SECTION_ORDER or _SECTION_ORDER[section] < stage:
                raise SnapshotFormatError(f"snapshot section {section!r} out of order")
            stage = _SECTION_ORDER[section]
            if section == "end":
                end = unpacker.unpack()
                break
            unpacker.skip()
            if section != "dedup":
                body_end = unpacker.tell()
    except SnapshotFormatError:
        raise
    except Exception as err:  # msgpack errors, a truncated stream
        raise SnapshotFormatError(f"undecodable snapshot data: {err}") from err
    # (the counts are the trailer's: checked against the records when the stream is loaded)
    if (
        unpacker.tell() != len(stream)
        or type(end) is not dict
        or type(end.get("base")) is not int
        or type(end.get("log")) is not int
    ):
        raise SnapshotFormatError("malformed snapshot trailer")
    return StreamLayout(
        header["revision"],
        header["compact_revision"],
        body_start,
        body_end,
        end["base"],
        end["log"],
    )


def _base_records(view: SnapshotView) -> Iterator[KeyValue | None]:
    compact_rev = view.compact_revision
    # A key's retained version below C is its newest version at or below C, if that is a
    # put below C (one at exactly C is in the log). While the store's background
    # compaction is pending a history may still hold older versions (and a key may be all
    # dead): picking by revision keeps the bytes those of a fully compacted store. Keys
    # are read a batch at a time from the live index (a fresh ``irange`` per batch, so
    # keys inserted meanwhile are harmless: their versions are all above the view).
    index = view.index
    last: bytes | None = None
    while True:
        if last is None:
            keys = list(islice(index.irange(), _KEYS_PER_STEP))
        else:
            keys = list(islice(index.irange(last, None, (False, False)), _KEYS_PER_STEP))
        if not keys:
            return
        last = keys[-1]
        for hist in index.values_of(keys):
            kv = hist[0]
            if kv.mod_revision >= compact_rev:
                continue
            if len(hist) > 1 and hist[1].mod_revision <= compact_rev:
                kv = hist[bisect_right(hist, compact_rev, key=_MOD) - 1]
                if kv.mod_revision == compact_rev:
                    continue
            if kv.create_revision != 0:
                yield kv
        yield None  # a yield point: a stretch of keys may hold nothing for the base


def _log_records(view: SnapshotView, start: int) -> Iterator[KeyValue | None]:
    compact_rev = view.compact_revision
    log = view.log
    for i in range(start, view.log_end):
        kv = log[i]
        if kv.create_revision == 0 and kv.mod_revision == compact_rev:
            continue  # compacted tombstone (see store.py)
        yield kv


_SECTION_ORDER = {"base": 0, "log": 1, "dedup": 2, "end": 3}


_COLUMN_TYPES = (bytes, bytes, int, int, int, int)  # key, value, create, mod, version, lease
# KeyValue is a frozen dataclass: its __init__ sets each field with object.__setattr__, which
# was most of the cost of a decoded record. A batch's KeyValues are made as that __init__
# makes them (a bare instance, then the same fields in its slots, nothing else), a column at
# a time with each slot's own setter, all in C. Only while KeyValue is exactly that: slots
# named as a record's columns, in order, and no __post_init__; else by its constructor.
_KV_FIELDS = tuple(f.name for f in dataclasses.fields(KeyValue))
_BY_SLOTS = (
    _KV_FIELDS == ("key", "value", "create_revision", "mod_revision", "version", "lease")
    and getattr(KeyValue, "__slots__", ()) == _KV_FIELDS
    and not hasattr(KeyValue, "__post_init__")
)
_SLOT_SETTERS = tuple(KeyValue.__dict__[name].__set__ for name in _KV_FIELDS) if _BY_SLOTS else ()
_new_object = object.__new__


def _build(columns: list) -> list[KeyValue]:
    """``list(map(KeyValue, *columns))``, by slots when ``_BY_SLOTS``."""
    if not _BY_SLOTS:
        return list(map(KeyValue, *columns))
    kvs = list(map(_new_object, repeat(KeyValue, len(columns[0]))))
    for set_field, column in zip(_SLOT_SETTERS, columns, strict=True):
        deque(map(set_field, kvs, column), 0)  # runs the setters in C, keeps nothing
    return kvs


def _kvs_from_columns(body: list[Any]) -> list[KeyValue]:
    """The records of one format-2 batch (its columns) as KeyValues, checked column by
    column."""
    if len(body) != 6:
        raise SnapshotFormatError("malformed batch")
    keys, values, *ints = body
    if type(keys) is not list or type(values) is not list:
        raise SnapshotFormatError("malformed batch")
    n = len(keys)
    if not n:
        if values or any(c != b"" for c in ints):
            raise SnapshotFormatError("malformed batch")
        return []
    if (
        len(values) != n
        or any(type(c) is not bytes or len(c) // n not in _TYPECODES for c in ints)
        or any(len(c) % n for c in ints)
    ):
        raise SnapshotFormatError("malformed batch")
    if set(map(type, keys)) != {bytes} or set(map(type, values)) != {bytes}:
        raise SnapshotFormatError("malformed record")
    return _build([keys, values, *(_ints(c, len(c) // n) for c in ints)])


def batch_rows(body: list[Any]) -> list[tuple]:
    """A format-2 batch (as this module writes it) as its records, each
    ``(key, value, create_revision, mod_revision, version, lease)``: the shape of a format-1
    record, which the store's hash (``kvserver.mvcc.hashkv``) is defined over."""
    keys, values, *ints = body
    n = len(keys)
    if not n:
        return []
    return list(zip(keys, values, *(_ints(c, len(c) // n) for c in ints), strict=True))


def _ints(raw: bytes, width: int) -> list[int]:
    column = array(_TYPECODES[width])
    column.frombytes(raw)
    if _BIG_ENDIAN:
        column.byteswap()
    return column.tolist()


def _kvs(body: list[Any]) -> list[KeyValue]:
    """The records of one format-1 batch as KeyValues, checked column by column (a type
    check per column in C instead of six per record in Python)."""
    if not body:
        return []
    if set(map(type, body)) != {list} or set(map(len, body)) != {6}:
        raise SnapshotFormatError("malformed record")
    columns = list(zip(*body, strict=True))
    for column, expected in zip(columns, _COLUMN_TYPES, strict=True):
        if set(map(type, column)) != {expected}:
            raise SnapshotFormatError("malformed record")
    return _build(columns)


class SnapshotLoader:
    """Incremental reader of a snapshot stream: ``feed(chunk)``... then ``finish()``."""

    def __init__(self) -> None:
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=_MAX_BUFFER_BYTES)
        self._header: dict | None = None
        self._decode_batch = _kvs_from_columns
        self._stage = -1
        self._base: list[KeyValue] = []
        self._base_ordered = True  # each key above the one before (always, as written now)
        self._log: list[KeyValue] = []
        self._dedup: list[tuple[int, list[tuple[int, Any]]]] = []
        self._end: dict | None = None
        self._fed_bytes = 0

    def feed(self, chunk: bytes) -> None:
        self._fed_bytes += len(chunk)
        try:
            self._unpacker.feed(chunk)
            for obj in self._unpacker:
                self._handle(obj)
        except SnapshotFormatError:
            raise
        except Exception as err:  # msgpack errors, buffer overflow
            raise SnapshotFormatError(f"undecodable snapshot data: {err}") from err

    def _handle(self, obj: Any) -> None:
        if self._header is None:
            if (
                type(obj) is not dict
                or obj.get("magic") != MAGIC
                or type(obj.get("version")) is not int
                or obj["version"] not in _READABLE_VERSIONS
                or type(obj.get("revision")) is not int
                or type(obj.get("compact_revision")) is not int
            ):
                raise SnapshotFormatError("not a raftkv MVCC snapshot (or unknown version)")
            self._header = obj
            if obj["version"] == 1:
                self._decode_batch = _kvs
            return
        if self._end is not None:
            raise SnapshotFormatError("data after the end of the snapshot")
        if type(obj) is not list or len(obj) != 2 or obj[0] not in _SECTION_ORDER:
            raise SnapshotFormatError("malformed snapshot section")
        section, body = obj
        stage = _SECTION_ORDER[section]
        if stage < self._stage:
            raise SnapshotFormatError(f"snapshot section {section!r} out of order")
        self._stage = stage
        if section == "end":
            if type(body) is not dict:
                raise SnapshotFormatError("malformed snapshot trailer")
            self._end = body
            return
        if type(body) is not list:
            raise SnapshotFormatError(f"malformed {section} section")
        if section == "base":
            kvs = self._decode_batch(body)
            if kvs and self._base_ordered:
                keys = list(map(_KEY, kvs))
                if self._base and not self._base[-1].key < keys[0]:
                    self._base_ordered = False
                elif not all(map(lt, keys, islice(keys, 1, None))):
                    self._base_ordered = False
            self._base.extend(kvs)
        elif section == "log":
            self._log.extend(self._decode_batch(body))
        else:
            for entry in body:
                if type(entry) is not list or len(entry) != 2 or type(entry[1]) is not list:
                    raise SnapshotFormatError("malformed dedup entry")
                try:
                    items = [(rid, from_plain(outcome)) for rid, outcome in entry[1]]
                except (CodecError, ValueError, TypeError) as err:
                    raise SnapshotFormatError(f"malformed dedup outcome: {err}") from err
                self._dedup.append((entry[0], items))

    def finish(self) -> SnapshotParts:
        """Check completeness and order and return the decoded parts."""
        if self._header is None or self._end is None:
            raise SnapshotFormatError("snapshot is truncated")
        if self._unpacker.tell() != self._fed_bytes:
            raise SnapshotFormatError("trailing bytes after the snapshot")
        base = self._base
        if not self._base_ordered:  # not as this module writes it: sort it, refuse repeats
            base.sort(key=_KEY)
            keys = list(map(_KEY, base))
            if not all(map(lt, keys, islice(keys, 1, None))):
                raise SnapshotFormatError("key repeated in the base section")
        expected = {
            "base": len(base),
            "log": len(self._log),
            "dedup_clients": len(self._dedup),
        }
        if self._end != expected:
            raise SnapshotFormatError(f"snapshot counts {self._end} != read {expected}")
        revision = self._header["revision"]
        compact_rev = self._header["compact_revision"]
        if revision < 1 or compact_rev > revision:
            raise SnapshotFormatError("snapshot revisions are inconsistent")
        # Checked with C loops over the columns: a generator per record was 0.17 s at two
        # million keys.
        if base and (max(map(_MOD, base)) >= compact_rev or not all(map(_CREATE, base))):
            raise SnapshotFormatError("base version at or above the compact revision")
        mods = list(map(_MOD, self._log))
        if mods and (
            mods[0] < compact_rev
            or mods[-1] > revision
            or not all(map(le, mods, islice(mods, 1, None)))
        ):
            raise SnapshotFormatError("log versions out of revision order")
        return SnapshotParts(revision, compact_rev, base, self._log, self._dedup)
