"""HashKV: a checksum of the MVCC keyspace up to a revision (etcd's ``HashByRev``).

Contract
--------
``hash_kv_steps(store, revision)`` is a generator: it yields None after each bounded step
and returns a ``HashKVResponse``; ``hash_kv(store, revision)`` runs it to the end at once.
``revision`` 0 means the store's current revision. Errors, raised by the first ``next``
(before any work), as etcd's: ``revision <= compact revision`` is ``CompactedError``, above
the current revision ``FutureRevisionError`` (both OutOfRange).

What is hashed, for revision R and the store's compact revision C: every version a read at C
still sees below C (each key's retained version, in key order), then every version with
``C <= mod_revision <= R`` in the order it was applied (tombstones included, but not those at
exactly C, which compaction dropped). A version counts as ``(key, value, create_revision,
mod_revision, version, lease)``. The hash is a CRC-32 over those, so two members that applied
the same log agree at every R they both hold, whatever their current revision and however
far each has got with cutting compacted versions (what the snapshot stream writes does not
depend on it). Members whose compact revisions differ (a compaction applied on one and not
yet on the other) hash different sets: compare hashes only where ``compact_revision`` matches,
as with etcd. The value is raftkv's own: it is not comparable with a hash etcd computes
(etcd hashes its bolt rows, revision-keyed protobufs).

The response: ``header.revision`` is the store's revision when the hash started (etcd's
``currentRev``), ``compact_revision`` is C (-1 if never compacted), ``hash_revision`` is R.

Steps: the hash reads the store's snapshot stream (``MVCCStore.serialize``), a consistent
view of the store at the call, one chunk per step; each chunk costs about its size in work
(``kvserver.mvcc.snapshot``), so a step is bounded however many keys the store holds, and the
store may apply writes between steps. The stream holds the store's physical compaction off
until it is closed; closing the generator (or finishing it) closes it.
"""

from __future__ import annotations

import zlib
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from kvserver.kvpb.errors import CompactedError, FutureRevisionError, SnapshotFormatError
from kvserver.kvpb.kv import ResponseHeader
from kvserver.mvcc.snapshot import MAGIC, batch_rows
from kvserver.mvcc.store import MVCCStore

CHUNK_BYTES = 64 * 1024  # snapshot bytes decoded and hashed per step
_MOD_REVISION = 3  # a record is (key, value, create_revision, mod_revision, version, lease)


@dataclass(frozen=True, slots=True)
class HashKVResponse:
    """etcd's HashKVResponse (``hash_revision`` is etcd 3.6's field)."""

    header: ResponseHeader = field(default_factory=ResponseHeader)
    hash: int = 0  # uint32
    compact_revision: int = -1
    hash_revision: int = 0


def check_revision(store: MVCCStore, revision: int) -> int:
    """The revision to hash (``revision`` 0: the current one); etcd's refusals."""
    compact_rev, current = store.compact_revision, store.revision
    if revision > 0 and revision <= compact_rev:
        raise CompactedError(compact_revision=compact_rev)
    if revision > current:
        raise FutureRevisionError()
    return revision if revision > 0 else current


def hash_kv_steps(
    store: MVCCStore, revision: int = 0, chunk_bytes: int = CHUNK_BYTES
) -> Generator[None, None, HashKVResponse]:
    """See the module docstring."""
    rev = check_revision(store, revision)
    current, compact_rev = store.revision, store.compact_revision
    stream = store.serialize(chunk_bytes)  # the view of this same step: same revisions
    unpacker = msgpack.Unpacker(raw=False)
    packer = msgpack.Packer(use_bin_type=True)
    crc = 0
    header_seen = False
    try:
        for chunk in stream:
            unpacker.feed(chunk)
            for obj in unpacker:
                if not header_seen:
                    _check_header(obj, current, compact_rev)
                    header_seen = True
                    continue
                section, body = obj
                if section == "base":
                    crc = zlib.crc32(b"".join(map(packer.pack, batch_rows(body))), crc)
                    continue
                if section != "log":  # the deduplication table and the trailer: not hashed
                    return _response(crc, current, compact_rev, rev)
                records = batch_rows(body)
                wanted = [r for r in records if r[_MOD_REVISION] <= rev]
                crc = zlib.crc32(b"".join(map(packer.pack, wanted)), crc)
                if len(wanted) < len(records):  # the log is in revision order: past R
                    return _response(crc, current, compact_rev, rev)
            yield None
    finally:
        close = getattr(stream, "close", None)  # lets the store cut compacted versions again
        if close is not None:
            close()
    return _response(crc, current, compact_rev, rev)


def hash_kv(store: MVCCStore, revision: int = 0) -> HashKVResponse:
    """``hash_kv_steps`` run to the end (tests, offline tools)."""
    steps = hash_kv_steps(store, revision)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _check_header(obj: Any, revision: int, compact_rev: int) -> None:
    if (
        type(obj) is not dict
        or obj.get("magic") != MAGIC
        or obj.get("revision") != revision
        or obj.get("compact_revision") != compact_rev
    ):
        raise SnapshotFormatError("hashkv: the store's stream does not start as expected")


def _response(crc: int, current: int, compact_rev: int, rev: int) -> HashKVResponse:
    return HashKVResponse(ResponseHeader(revision=current), crc & 0xFFFFFFFF, compact_rev, rev)
