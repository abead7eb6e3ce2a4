"""Batch read: one pinned revision for the whole DataFrame, key-range partitions, paging.

Planning (``RaftKVReader.partitions``, in Spark's planner process):

1. pin the revision: the ``revision`` option, checked readable (a compacted one raises
   ``CompactedRevisionError`` naming the compact revision; a future one
   ``FutureRevisionReadError``), else the store's current revision, taken from the header
   of a linearizable keys-only range of limit 1;
2. split the range: ``count_only`` gives the number of keys N at the pinned revision, then a
   keys-only scan (pages of ``pageSize`` keys) keeps every ceil(N / numPartitions)-th key as a
   split point, so partitions hold about equal numbers of keys. Memory: numPartitions keys.

Reading (``read``, one task per partition): pages of at most ``pageSize`` keys,
``range(start, end, revision=pinned, limit=pageSize)``, the next page starting just after
the last key (``last + b"\\0"``), until the answer says no more. Every page is read at the
pinned revision, so the union of the partitions is exactly the range at that revision:
no key twice (partitions are disjoint half-open intervals), none missing, no mix of states.
A page is yielded as one Arrow record batch. A partition that is read after the pinned
revision was compacted fails with ``CompactedRevisionError``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition

from kvserver.client import CompactedError
from kvserver.spark.source.options import SourceOptions
from kvserver.spark.source.store import (
    CompactedRevisionError,
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


def plan(o: SourceOptions) -> list[KeyRangePartition]:
    """The partitions of a batch read (runs in the planner; see the module docstring)."""
    with open_client(o) as client:
        if o.revision:
            check_revision(client, o, o.revision, "raftkv batch read")
            revision = o.revision
        else:
            head = client.range(o.key, o.range_end or None, limit=1, keys_only=True)
            revision = head.revision
        if o.single_key or o.num_partitions == 1:
            return [KeyRangePartition(0, o.key, o.range_end, revision)]
        splits = split_points(client, o, revision)
    bounds = [o.key, *splits, o.range_end]
    return [
        KeyRangePartition(i, bounds[i], bounds[i + 1], revision) for i in range(len(bounds) - 1)
    ]


def split_points(client, o: SourceOptions, revision: int) -> list[bytes]:
    """Keys that cut the range into ``numPartitions`` parts of about equal key counts."""
    try:
        total = client.range(o.key, o.range_end, revision=revision, count_only=True).count
    except CompactedError:
        raise CompactedRevisionError(
            "raftkv batch read", revision, compact_revision_of(client, o.key, revision)
        ) from None
    parts = min(o.num_partitions, max(total, 1))
    if parts <= 1:
        return []
    step = math.ceil(total / parts)
    wanted = {step * i for i in range(1, parts)}  # ranks (0-based) of split keys
    splits: list[bytes] = []
    start, seen = o.key, 0
    page = max(o.page_size, 1000)  # keys only: small answers, bigger pages
    while True:
        res = client.range(start, o.range_end, revision=revision, limit=page, keys_only=True)
        for kv in res.kvs:
            if seen in wanted:
                splits.append(kv.key)
            seen += 1
        if not res.more or not res.kvs:
            return splits
        start = res.kvs[-1].key + b"\0"


def read_partition(o: SourceOptions, part: KeyRangePartition):
    """Arrow record batches, one per page, of the partition's keys at its revision."""
    import pyarrow as pa

    names = list(KV_COLUMNS)
    with open_client(o) as client:
        start = part.start
        while True:
            try:
                res = client.range(
                    start,
                    part.end or None,
                    revision=part.revision,
                    limit=0 if part.end == b"" else o.page_size,
                )
            except CompactedError:
                raise CompactedRevisionError(
                    "raftkv batch read",
                    part.revision,
                    compact_revision_of(client, o.key, part.revision),
                    "the store was compacted past the read's pinned revision",
                ) from None
            if res.kvs:
                kvs = res.kvs
                cols = [
                    [decode_key(kv.key) for kv in kvs],
                    [decode_value(kv.key, kv.value, o.value_string) for kv in kvs],
                    [kv.create_revision for kv in kvs],
                    [kv.mod_revision for kv in kvs],
                    [kv.version for kv in kvs],
                    [kv.lease for kv in kvs],
                ]
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(cols[0], pa.string()),
                        pa.array(cols[1], pa.string() if o.value_string else pa.binary()),
                        *(pa.array(c, pa.int64()) for c in cols[2:]),
                    ],
                    names=names,
                )
            if not res.more or not res.kvs or part.end == b"":
                return
            start = res.kvs[-1].key + b"\0"


class RaftKVReader(DataSourceReader):
    def __init__(self, o: SourceOptions) -> None:
        self.o = o

    def partitions(self) -> list[KeyRangePartition]:
        return plan(self.o)

    def read(self, partition: InputPartition) -> Iterator:
        assert isinstance(partition, KeyRangePartition)  # Spark hands back partitions()'s own
        return read_partition(self.o, partition)
