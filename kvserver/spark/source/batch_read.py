"""Batch read: one pinned revision for the whole DataFrame, key-range partitions, paging.

Planning (``RaftKVReader.partitions``, in Spark's planner process) reads no key of the range
but the split points, with two calls of O(numPartitions x log N) on the server each
(``Client.key_ranks``, raftkv's ``POST /v1/ranks``):

1. pin the revision and count: ``key_ranks`` with no ranks answers the number of live keys N
   and the store's current revision, which is pinned unless the ``revision`` option gives
   one. A given revision is checked by the same call: a compacted one raises
   ``CompactedRevisionError`` naming the compact revision, a future one
   ``FutureRevisionReadError``;
2. choose the number of parts: ``min(numPartitions, N // minPartitionKeys)``, at least 1, so
   a small range is one partition (a partition costs a Python worker's start and a
   connection; below ``minPartitionKeys`` keys that costs more than it saves);
3. split: ``key_ranks`` at ranks ``ceil(N * i / parts)`` gives the first key of each part.
   With an older ``revision`` the server answers the ranks of its current revision
   (``exact`` false): the parts are then balanced as of now, not as of the pinned revision,
   and still correct — any keys cut the range into disjoint parts whose union is the range.

A server without ``/v1/ranks`` (etcd) or a user without the root role it needs under auth
gets one partition: the planner never falls back to reading keys to find split points.

Reading (``read``, one task per partition): pages of at most ``pageSize`` keys,
``range_arrow(start, end, revision=pinned, limit=pageSize)`` (the answer decoded straight
into Arrow columns, no Python object per key), the next page starting just after the last
key (``last + b"\\0"``), until the answer says no more. Every page is read at the pinned
revision, so the union of the partitions is exactly the range at that revision: no key twice
(partitions are disjoint half-open intervals), none missing, no mix of states. A page is
yielded as one Arrow record batch. A partition that is read after the pinned revision was
compacted fails with ``CompactedRevisionError``.

Cost on the server: a page at the current revision is O(log N + pageSize). Once the store
has moved past the pinned revision (writes after planning), a page at the pinned revision
walks the rest of its partition to count it, so a long read under concurrent writes slows
down; more partitions shorten that walk.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition

from kvserver.client import ClientError, CompactedError, FutureRevisionError
from kvserver.client.columnar import ranks_unsupported
from kvserver.spark.source.options import SourceOptions
from kvserver.spark.source.store import (
    CompactedRevisionError,
    FutureRevisionReadError,
    check_revision,
    compact_revision_of,
    open_client,
)

KV_COLUMNS = ("key", "value", "create_revision", "mod_revision", "version", "lease")


def kv_schema(value_string: bool) -> str:
    value = "string" if value_string else "binary"
    return (
        f"key string, value {value}, create_revision long, mod_revision long, "
        f"version long, lease long"
    )


class KeyRangePartition(InputPartition):
    """Keys in ``[start, end)`` (etcd's convention for ``end``) at ``revision``."""

    def __init__(self, index: int, start: bytes, end: bytes, revision: int) -> None:
        super().__init__(index)
        self.index = index
        self.start = start
        self.end = end
        self.revision = revision

    def __repr__(self) -> str:
        return f"KeyRangePartition({self.index}, {self.start!r}, {self.end!r}, rev={self.revision})"


def decode_key(key: bytes) -> str:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"key {key!r} is not UTF-8; the raftkv data source reads keys as strings"
        ) from None


def decode_value(key: bytes, value: bytes, as_string: bool):
    if not as_string:
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"the value of key {key!r} is not UTF-8 (valueFormat=string); read "
            f"with valueFormat=binary"
        ) from None


def _compacted(client, o: SourceOptions, revision: int, hint: str = "") -> CompactedRevisionError:
    return CompactedRevisionError(
        "raftkv batch read", revision, compact_revision_of(client, o.key, revision), hint
    )


def plan(o: SourceOptions) -> list[KeyRangePartition]:
    """The partitions of a batch read (runs in the planner; see the module docstring)."""
    with open_client(o) as client:
        try:
            head = client.key_ranks(o.key, o.range_end, ranks=[], revision=o.revision)
        except CompactedError:
            raise _compacted(client, o, o.revision) from None
        except FutureRevisionError:
            raise FutureRevisionReadError(
                f"raftkv batch read: revision {o.revision} is above the store's current revision"
            ) from None
        except ClientError as err:
            if not ranks_unsupported(err):
                raise
            return [KeyRangePartition(0, o.key, o.range_end, _pin_without_ranks(client, o))]
        revision = o.revision or head.revision
        parts = partition_count(head.count, o)
        if o.single_key or parts <= 1:
            return [KeyRangePartition(0, o.key, o.range_end, revision)]
        ranks = split_ranks(head.count, parts)
        splits = client.key_ranks(o.key, o.range_end, ranks=ranks, revision=o.revision).keys
    cuts = sorted({k for k in splits if k is not None and k > o.key})
    bounds = [o.key, *cuts, o.range_end]
    return [
        KeyRangePartition(i, bounds[i], bounds[i + 1], revision) for i in range(len(bounds) - 1)
    ]


def partition_count(keys: int, o: SourceOptions) -> int:
    """How many partitions a read of ``keys`` keys gets: at most ``numPartitions``, at least
    ``minPartitionKeys`` keys each, at least one."""
    return max(1, min(o.num_partitions, keys // max(o.min_partition_keys, 1)))


def split_ranks(keys: int, parts: int) -> list[int]:
    """0-based ranks of the first key of parts 1 .. parts-1 of ``keys`` keys."""
    return [-(-keys * i // parts) for i in range(1, parts)]


def _pin_without_ranks(client, o: SourceOptions) -> int:
    """The revision of a one-partition plan when the server cannot rank keys (etcd)."""
    if o.revision:
        check_revision(client, o, o.revision, "raftkv batch read")
        return o.revision
    return client.range(o.key, o.range_end or None, limit=1, keys_only=True).revision


def read_partition(o: SourceOptions, part: KeyRangePartition) -> Iterator:
    """Arrow record batches, one per page, of the partition's keys at its revision."""
    value_format = "string" if o.value_string else "binary"
    with open_client(o) as client:
        start = part.start
        while True:
            try:
                page = client.range_arrow(
                    start,
                    part.end or None,
                    revision=part.revision,
                    limit=0 if part.end == b"" else o.page_size,
                    value_format=value_format,
                )
            except CompactedError:
                raise _compacted(
                    client,
                    o,
                    part.revision,
                    "the store was compacted past the read's pinned revision",
                ) from None
            batch = page.batch
            if batch.num_rows:
                yield batch
            if not page.more or not batch.num_rows or part.end == b"":
                return
            last = page.last_key()
            assert last is not None
            start = last + b"\0"


class RaftKVReader(DataSourceReader):
    def __init__(self, o: SourceOptions) -> None:
        self.o = o

    def partitions(self) -> list[KeyRangePartition]:
        return plan(self.o)

    def read(self, partition: InputPartition) -> Iterator:
        assert isinstance(partition, KeyRangePartition)  # Spark hands back partitions()'s own
        return read_partition(self.o, partition)
