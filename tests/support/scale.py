"""Helpers for tests that put a large keyspace into real member processes.

Loading in transactions of ``TXN_OPS`` operations run by several workers at once
(``run_txns``), each member's raft view through ``/v3/maintenance/status`` (``member_view``),
its Prometheus counters (``metric``), the snapshot files it has written (``snapshot_indexes``)
and a full paged scan of a key range at one revision (``paged_scan``). Every call is bounded by
the client's deadline; nothing here sleeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvserver.client import AsyncClient, Op, Txn, TxnResult
from kvserver.kvpb.kv import prefix_range_end

T = TypeVar("T")

TXN_OPS = 128  # etcd's default --max-txn-ops
_SNAP_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.snap$")


def batches(items: Sequence[T], size: int = TXN_OPS) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def put_txns(items: Sequence[tuple[str, str]]) -> Iterator[Txn]:
    """One unconditional txn per ``TXN_OPS`` (key, value) pairs."""
    for chunk in batches(items):
        yield Txn().then(*[Op.put(k, v) for k, v in chunk])


def delete_txns(keys: Sequence[str]) -> Iterator[Txn]:
    """One unconditional txn per ``TXN_OPS`` single-key deletes."""
    for chunk in batches(keys):
        yield Txn().then(*[Op.delete(k) for k in chunk])


async def run_txns(client: AsyncClient, txns: Iterable[Txn], concurrency: int = 8) -> int:
    """Run every txn of ``txns`` with ``concurrency`` workers; the highest revision any
    answer reported. A failed txn raises (the caller's test fails)."""
    pending = iter(txns)
    highest = 0

    async def worker() -> None:
        nonlocal highest
        for txn in pending:  # one shared iterator: each txn is taken by exactly one worker
            result: TxnResult = await client.txn(txn)
            highest = max(highest, result.header.revision)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return highest


@dataclass(frozen=True)
class MemberView:
    """One member's answer to ``/v3/maintenance/status``."""

    member_id: int
    term: int
    leader: int  # 0: none known
    revision: int
    applied_index: int


def member_view(url: str, timeout_s: float = 5.0) -> MemberView:
    """``url``'s ``/v3/maintenance/status`` (plain HTTP: no client retries or failover)."""
    req = urllib.request.Request(
        url + "/v3/maintenance/status",
        data=b"{}",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        doc = json.loads(resp.read())
    header = doc.get("header", {})
    return MemberView(
        int(header.get("member_id", 0)),
        int(doc.get("raftTerm", 0)),
        int(doc.get("leader", 0)),
        int(header.get("revision", 0)),
        int(doc.get("raftAppliedIndex", 0)),
    )


def metrics(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """Every sample of ``url``'s ``/metrics``: ``name`` or ``name{labels}`` -> value."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def metric(url: str, name: str, timeout_s: float = 5.0) -> float | None:
    """The value of the sample ``name`` (with its labels, if any) in ``url``'s ``/metrics``;
    None if absent."""
    return metrics(url, timeout_s).get(name)


def histogram_above(samples: dict[str, float], name: str, bound: float) -> float | None:
    """How many observations of the histogram ``name`` were above its bucket bound nearest
    to ``bound``; None if it is not exported."""
    prefix = f'{name}_bucket{{le="'
    buckets = {
        float(k[len(prefix) : -2]): v
        for k, v in samples.items()
        if k.startswith(prefix) and not k.endswith('+Inf"}')
    }
    total = samples.get(prefix + '+Inf"}')
    if total is None or not buckets:
        return None
    nearest = min(buckets, key=lambda le: abs(le - bound))
    return total - buckets[nearest]


def snapshot_indexes(data_dir: str) -> list[int]:
    """The raft indexes of the snapshot files in ``<data_dir>/member/snap``, ascending."""
    try:
        names = os.listdir(os.path.join(data_dir, "member", "snap"))
    except FileNotFoundError:
        return []
    return sorted(int(m.group(2), 16) for m in map(_SNAP_NAME.match, names) if m)


# (key, value, create_revision, mod_revision, version) of one live key
Row = tuple[bytes, bytes, int, int, int]


async def paged_scan(
    client: AsyncClient,
    prefix: str,
    *,
    revision: int = 0,
    serializable: bool = False,
    page: int = 1000,
) -> tuple[int, list[Row]]:
    """Every key under ``prefix`` at ``revision`` (0: the revision the first page answers
    at), read ``page`` keys at a time; (that revision, the rows in key order). Each page
    after the first asks for the same revision, so the scan is one consistent view."""
    end = prefix_range_end(prefix.encode())
    start = prefix.encode()
    rows: list[Row] = []
    while True:
        result = await client.range(
            start, end, limit=page, revision=revision, serializable=serializable
        )
        if revision == 0:
            revision = result.header.revision
        rows.extend(
            (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version) for kv in result.kvs
        )
        if not result.more:
            return revision, rows
        start = result.kvs[-1].key + b"\0"
