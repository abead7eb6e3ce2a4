"""Writing one task's rows as bounded, marked, optionally fenced transactions.

A task's rows are sorted by key (so the chunking depends only on the set of rows, not on the
order Spark delivered them in) and cut into chunks of at most ``maxTxnOps - 1`` puts and
``maxTxnBytes`` bytes (key + value + 16 per put, the figure the server compares with its
1.5 MiB request limit). Chunk ``i`` of the task is one transaction::

    if   version(marker_i) == 0  [and create_revision(fenceKey) == fenceToken]
    then put every row of the chunk, put marker_i
    else get marker_i

``marker_i`` is ``<markerPrefix><scope>/<partition>/<i>``. The compare makes the chunk
apply at most once per scope: a retried task attempt (or a replayed streaming batch) that
computes the same chunk finds its marker and skips it. When the ``else`` branch ran and the
marker is absent, the fence failed: ``FencedOutError``, and nothing of that chunk was
applied. Every txn also carries the client's request id, so an HTTP retry is applied once.

Rows: ``key`` (string or binary, required), ``value`` (binary or string, required; null is
refused), ``lease`` (long, optional, 0 = none). A key under ``markerPrefix`` is refused, and
so is the same key twice in one task (which row would win is not defined).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kvserver.client import Client, Cmp, Op, Txn
from kvserver.spark.fencing import Fence, FencedOutError
from kvserver.spark.source.options import SourceOptions
from kvserver.spark.txn_reads import range_kvs

PUT_OVERHEAD_BYTES = 16
MARKER_VALUE = b"1"


@dataclass(frozen=True, slots=True)
class Row:
    key: bytes
    value: bytes
    lease: int


@dataclass(frozen=True, slots=True)
class ChunkResult:
    applied: int  # chunks this attempt applied
    skipped: int  # chunks found already applied (marker present)
    rows: int  # rows in the task
    txns: int  # transactions sent


def _as_bytes(v, what: str) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("utf-8")
    raise TypeError(f"column {what}: want string or binary, got {type(v).__name__}")


def rows_from_arrow(batches: Iterable, marker_prefix: bytes) -> list[Row]:
    """The rows of Arrow record batches with columns key, value[, lease]."""
    out: list[Row] = []
    for batch in batches:
        names = batch.schema.names
        keys = batch.column(names.index("key")).to_pylist()
        values = batch.column(names.index("value")).to_pylist()
        leases = (
            batch.column(names.index("lease")).to_pylist() if "lease" in names else [0] * len(keys)
        )
        for k, v, lease in zip(keys, values, leases, strict=True):
            if k is None:
                raise ValueError("column key: a null key cannot be written")
            if v is None:
                raise ValueError(
                    f"column value: null value for key {k!r} (delete is not a "
                    f"write of the raftkv data source)"
                )
            kb = _as_bytes(k, "key")
            if not kb:
                raise ValueError("column key: an empty key cannot be written")
            if kb.startswith(marker_prefix):
                raise ValueError(
                    f"key {kb!r} is under markerPrefix {marker_prefix!r}, which "
                    f"the data source keeps for its own markers"
                )
            out.append(Row(kb, _as_bytes(v, "value"), int(lease or 0)))
    return out


def chunk(rows: list[Row], o: SourceOptions) -> Iterator[list[Row]]:
    """Sorted, duplicate-checked chunks within the txn limits (one op kept for the marker)."""
    rows = sorted(rows, key=lambda r: r.key)
    for a, b in zip(rows, rows[1:], strict=False):
        if a.key == b.key:
            raise ValueError(
                f"key {a.key!r} appears twice in one write task; write one row per key"
            )
    max_puts = o.max_txn_ops - 1
    budget = o.max_txn_bytes - 1024  # the marker put and the compares
    current: list[Row] = []
    size = 0
    for r in rows:
        need = len(r.key) + len(r.value) + PUT_OVERHEAD_BYTES
        if need > budget:
            raise ValueError(
                f"the row for key {r.key!r} ({need} bytes) is over maxTxnBytes ({o.max_txn_bytes})"
            )
        if current and (len(current) >= max_puts or size + need > budget):
            yield current
            current, size = [], 0
        current.append(r)
        size += need
    if current:
        yield current


def marker_key(o: SourceOptions, scope: str, partition: int, index: int) -> bytes:
    return o.marker_prefix + f"{scope}/{partition:06d}/{index:08d}".encode()


def chunk_txn(o: SourceOptions, part: list[Row], marker: bytes, fence: Fence | None) -> Txn:
    compares = [Cmp.version(marker) == 0]
    if fence is not None:
        compares.append(fence.compare())
    return (
        Txn()
        .when(*compares)
        .then(*(Op.put(r.key, r.value, lease=r.lease) for r in part), Op.put(marker, MARKER_VALUE))
        .otherwise(Op.get(marker, keys_only=True))
    )


def write_chunks(
    client: Client,
    o: SourceOptions,
    rows: list[Row],
    scope: str,
    partition: int,
    fence: Fence | None,
    fail_after_txns: int = -1,
    in_flight: int = 1,
) -> ChunkResult:
    """Write ``rows`` as marked chunk txns (see the module docstring).

    ``in_flight`` > 1 keeps that many chunk txns outstanding at once (the member batches
    concurrent proposals into one raft round and one WAL write); chunks are independent
    (disjoint keys, a marker each), so their order does not matter. A fence refusal still
    raises ``FencedOutError``; the chunks in flight with it may have applied, as the chunks
    before it have.

    ``fail_after_txns`` >= 0 raises after that many txns (tests inject a task failure
    midway this way)."""
    parts = list(chunk(rows, o))

    def send(i: int) -> bool:
        """True: applied now; False: its marker was there (applied before)."""
        marker = marker_key(o, scope, partition, i)
        res = client.txn(chunk_txn(o, parts[i], marker, fence))
        if res.succeeded:
            return True
        if res.responses and range_kvs(res, 0):
            return False
        assert fence is not None  # only the fence can fail when the marker is absent
        raise FencedOutError(
            fence.key, fence.token, f"chunk {i} of partition {partition} ({len(parts[i])} rows)"
        )

    count = len(parts) if fail_after_txns < 0 else min(len(parts), fail_after_txns)
    if in_flight <= 1 or count <= 1:
        outcomes = [send(i) for i in range(count)]
    else:
        with ThreadPoolExecutor(max_workers=in_flight) as pool:
            outcomes = list(pool.map(send, range(count)))
    if count < len(parts):
        raise RuntimeError(f"injected failure after {count} txns (test option)")
    applied = sum(outcomes)
    return ChunkResult(applied, len(outcomes) - applied, len(rows), len(outcomes))
