"""A member restarted on its data dir serves exactly the data it served before, at scale.

Three real members take 200,000 keys, then overwrites, deletes (single keys and a block) and
re-creations, with one compaction in the middle, so that the store has history above the
compact revision and tombstones below and above it. ``--snapshot-count`` is small enough
that every member writes snapshots during the load (and, after it, lease grants that change no
key bring each member to a snapshot past the compaction) and still has entries after its
newest snapshot: a restart restores a compacted store from a
snapshot and replays a WAL tail on top.

What the cluster answers is recorded (a full paged scan, the revision, reads at historical
revisions, the compact revision). Then one follower is SIGKILLed and restarted, and later all
three are: every restarted member, asked with serializable reads (its own state, nothing
fetched from the leader), must give exactly the same keys, values, create and mod revisions,
versions, revision header and historical reads, and refuse a read below the compact revision.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvserver.client import AsyncClient, CompactedError
from kvserver.kvpb.kv import prefix_range_end
from kvserver.localcluster.launcher import LocalCluster, NodeProcess
from tests.cluster.harness import status, wait_healthy
from tests.support.scale import (
    TXN_OPS,
    Row,
    delete_txns,
    member_view,
    paged_scan,
    put_txns,
    run_txns,
    snapshot_indexes,
)
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

KEYS = 200_000
PREFIX = "r/"
# Raft entries between snapshots: the writes below are ~2190 entries (txns of 128 ops), the
# compaction near entry ~1800, so snapshots come at ~500, 1000, 1500 and ~2000.
SNAPSHOT_COUNT = 500
PAGE = 5000
RESTART_TIMEOUT_S = 120.0
SETTLE_S = 60.0
BLOCK = (150_000, 151_000)  # deleted with one delete-range


def key(i: int) -> str:
    return f"{PREFIX}{i:06d}"


@dataclass
class History:
    compact_revision: int = 0  # after the overwrites
    deleted: int = 0  # after the deletes (above the compact revision)
    recreated: int = 0  # in the middle of the writes after the compaction
    compaction_index: int = 0  # a raft index at or after the compaction's entry
    # key -> value of the live keys, as the writes should leave them
    at_compact: dict[bytes, bytes] = field(default_factory=dict)
    at_deleted: dict[bytes, bytes] = field(default_factory=dict)
    at_recreated: dict[bytes, bytes] = field(default_factory=dict)
    final: dict[bytes, bytes] = field(default_factory=dict)


async def write_history(cluster: LocalCluster) -> History:
    h = History()
    model: dict[bytes, bytes] = {}

    async def put(items: list[tuple[str, str]]) -> int:
        model.update((k.encode(), v.encode()) for k, v in items)
        return await run_txns(client, put_txns(items))

    async def delete(keys: list[str]) -> int:
        for k in keys:
            model.pop(k.encode(), None)
        return await run_txns(client, delete_txns(keys))

    async with AsyncClient(cluster.endpoints, timeout_s=120, attempt_timeout_s=60) as client:
        await put([(key(i), f"a{i}") for i in range(KEYS)])
        h.compact_revision = await put([(key(i), f"b{i}") for i in range(0, KEYS, 10)])
        h.at_compact = dict(model)
        await delete([key(i) for i in range(5, KEYS, 20)])
        for i in range(*BLOCK):
            model.pop(key(i).encode(), None)
        h.deleted = (await client.delete(key(BLOCK[0]), key(BLOCK[1]))).header.revision
        h.at_deleted = dict(model)
        await client.compact(h.compact_revision)
        leader = client.leader_endpoint
        assert leader is not None
        h.compaction_index = (await asyncio.to_thread(member_view, leader)).applied_index
        await put([(key(i), f"c{i}") for i in range(3, KEYS, 7)])  # re-creates some too
        h.recreated = await put([(key(i), f"d{i}") for i in range(5, KEYS, 40)])
        h.at_recreated = dict(model)
        await delete([key(i) for i in range(0, KEYS, 13)])
        h.final = model
    return h


@dataclass
class Observed:
    """What one member (or the cluster) answers; compared field by field."""

    revision: int  # the header of a read at the current revision
    rows: list[Row]  # every key at the current revision
    rows_at_compact: list[Row]  # every key at the compact revision
    counts: dict[int, int]  # revision -> keys under the prefix then
    pages: dict[tuple[int, str], list[Row]]  # (revision, start key) -> a page of PAGE keys
    compacted: str  # the error of a read just below the compact revision


async def observe(endpoints: list[str], h: History, serializable: bool) -> Observed:
    async with AsyncClient(endpoints, timeout_s=60, attempt_timeout_s=60) as client:
        head = await client.range(PREFIX, prefix=True, count_only=True, serializable=serializable)
        revision = head.header.revision
        _, rows = await paged_scan(
            client, PREFIX, revision=revision, serializable=serializable, page=PAGE
        )
        _, at_compact = await paged_scan(
            client, PREFIX, revision=h.compact_revision, serializable=serializable, page=PAGE
        )
        revisions = [h.compact_revision, h.compact_revision + 1, h.deleted, h.recreated]
        counts, pages = {}, {}
        for rev in revisions:
            r = await client.range(
                PREFIX, prefix=True, count_only=True, revision=rev, serializable=serializable
            )
            counts[rev] = r.count
            for start in (key(0), key(BLOCK[0] - PAGE // 2)):
                r = await client.range(
                    start,
                    prefix_range_end(PREFIX.encode()),
                    limit=PAGE,
                    revision=rev,
                    serializable=serializable,
                )
                pages[(rev, start)] = [
                    (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version)
                    for kv in r.kvs
                ]
        try:
            await client.range(key(0), revision=h.compact_revision - 1, serializable=serializable)
            compacted = "no error"
        except CompactedError as exc:
            compacted = type(exc).__name__
    return Observed(revision, rows, at_compact, counts, pages, compacted)


def difference(got: Any, want: Any) -> str:
    """ "" if equal, else a short account of the first difference (pytest's own diff of
    200,000 rows would take minutes)."""
    if got == want:
        return ""
    if isinstance(got, dict) and isinstance(want, dict):
        extra, missing = got.keys() - want.keys(), want.keys() - got.keys()
        if extra or missing:
            return f"{len(extra)} extra keys (e.g. {sorted(extra)[:3]}), {len(missing)} missing"
        k = next(k for k in sorted(want) if got[k] != want[k])
        return f"at {k!r}: " + (difference(got[k], want[k]) or f"{got[k]!r} != {want[k]!r}")
    if isinstance(got, list) and isinstance(want, list):
        i = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        if i is None:
            return f"{len(got)} items, {len(want)} wanted"
        return f"item {i}: {got[i]!r} != {want[i]!r} ({len(got)} items, {len(want)} wanted)"
    return f"{got!r:.300} != {want!r:.300}"


def compare(name: str, got: Observed, want: Observed) -> None:
    for what in ("revision", "rows", "rows_at_compact", "counts", "pages"):
        wrong = difference(getattr(got, what), getattr(want, what))
        assert not wrong, f"{name}: {what}: {wrong}"
    assert got.compacted == want.compacted == "CompactedError", name


def applied_everywhere(nodes: list[NodeProcess], revision: int) -> bool:
    states = [status(n) for n in nodes]
    return all(s is not None and s["revision"] == revision for s in states)


def compact_revisions(nodes: list[NodeProcess]) -> list[int | None]:
    return [(status(n) or {}).get("compact_revision") for n in nodes]


def check_snapshots(node: NodeProcess, h: History) -> None:
    """The member's newest snapshot holds the compaction, and entries follow it."""
    snaps = snapshot_indexes(node.data_dir)
    applied = member_view(node.client_url).applied_index
    assert snaps and snaps[-1] >= h.compaction_index, (node.name, snaps, h)
    assert snaps[-1] < applied, (node.name, snaps, applied)


async def snapshot_past(cluster: LocalCluster, index: int) -> None:
    """Raft entries that change no key (lease grants) until every member has a snapshot at
    or after ``index``, then one more, so that entries follow each member's newest snapshot.
    Members snapshot at thresholds of their own, so how many entries that takes varies."""

    def done() -> bool:
        return all((snapshot_indexes(n.data_dir) or [0])[-1] >= index for n in cluster.nodes)

    async with AsyncClient(cluster.endpoints) as kv:
        for _ in range(2 * SNAPSHOT_COUNT):
            if done():
                break
            await kv.lease_grant(3600)
        assert done(), {n.name: snapshot_indexes(n.data_dir) for n in cluster.nodes}
        await kv.lease_grant(3600)
    last = max(member_view(n.client_url).applied_index for n in cluster.nodes)
    wait_for(
        lambda: all(member_view(n.client_url).applied_index >= last for n in cluster.nodes),
        SETTLE_S,
        "every member to apply the lease grants",
    )


def restart(cluster: LocalCluster, nodes: list[NodeProcess]) -> None:
    for node in nodes:
        cluster.kill(node, signal.SIGKILL)
    for node in nodes:
        cluster.start_node(node)
    wait_healthy(cluster, timeout_s=RESTART_TIMEOUT_S)


def test_restart_after_large_load_serves_same_data(scale_cluster):
    cluster = scale_cluster(["--snapshot-count", str(SNAPSHOT_COUNT)])
    h = asyncio.run(write_history(cluster))
    want = asyncio.run(observe(cluster.endpoints, h, serializable=False))
    # The data is what the writes made it (so the comparisons below compare something).
    assert h.compact_revision < h.deleted < h.recreated < want.revision
    assert not difference({k: v for k, v, *_ in want.rows}, h.final)
    assert not difference({k: v for k, v, *_ in want.rows_at_compact}, h.at_compact)
    assert want.counts == {
        h.compact_revision: len(h.at_compact),
        h.compact_revision + 1: len(h.at_compact) - TXN_OPS,  # the first delete txn
        h.deleted: len(h.at_deleted),
        h.recreated: len(h.at_recreated),
    }
    assert len(h.at_compact) == KEYS > len(h.at_deleted)
    assert len(h.at_deleted) < len(h.at_recreated) and len(h.final) < len(h.at_recreated)
    wait_for(
        lambda: applied_everywhere(cluster.nodes, want.revision),
        SETTLE_S,
        "every member to apply every write",
    )
    assert compact_revisions(cluster.nodes) == [h.compact_revision] * 3
    asyncio.run(snapshot_past(cluster, h.compaction_index))
    for node in cluster.nodes:
        check_snapshots(node, h)

    leader = wait_healthy(cluster)
    follower = next(n for n in cluster.nodes if n is not leader)
    restart(cluster, [follower])
    got = asyncio.run(observe([follower.client_url], h, serializable=True))
    compare(f"restarted {follower.name}", got, want)
    assert compact_revisions([follower]) == [h.compact_revision]

    restart(cluster, cluster.nodes)
    for node in cluster.nodes:
        got = asyncio.run(observe([node.client_url], h, serializable=True))
        compare(f"{node.name} after restarting all", got, want)
    assert compact_revisions(cluster.nodes) == [h.compact_revision] * 3
