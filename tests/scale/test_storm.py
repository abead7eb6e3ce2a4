"""Big reads, a compaction and snapshots at once do not stall any member of a loaded cluster.

Three real members (etcd's default timing: 100 ms heartbeats, 1 s election timeout) hold
200,000 keys. Then, all at the same time for ``STORM_S`` and on until every member has written
a snapshot: readers ask for the whole key range (a page of 1000 with the count of all keys,
the count only, and every key at a historical revision), on the leader (linearizable) and on
each member (serializable); writers overwrite keys one put at a time; every member writes a
snapshot of the whole store (the cluster is brought to a few entries short of the first
member's threshold before the storm); halfway through ``STORM_S``, the history is compacted
to the current revision. A member whose event loop is held by one of these for about an
election timeout misses heartbeats: a follower gives up on its leader (pre-vote;
``raftkv_raft_leader_changes_total`` counts it even when the term stays), then campaigns (a
new term); a stalled leader is deposed. So at the end: the same term on every
member, the same leader, no leader change counted anywhere, no failed request, every put
acknowledged and applied once, a snapshot written during the storm on every member and the
compaction applied everywhere. Only counts are asserted; the timeline printed on failure
says when terms and leaders changed relative to snapshots and the compaction, with the
members' own count of event-loop stalls where they export it.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from dataclasses import dataclass, field

import aiohttp
import pytest

from kvserver.client import AsyncClient, ClientError
from kvserver.kvpb.kv import prefix_range_end
from kvserver.localcluster.launcher import LocalCluster
from kvserver.server.node import snapshot_threshold
from tests.cluster.harness import b64, status
from tests.support.scale import (
    MemberView,
    histogram_above,
    member_view,
    metric,
    metrics,
    paged_scan,
    put_txns,
    run_txns,
    snapshot_indexes,
)
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

KEYS = 200_000
PREFIX = "s/"
FILL_PREFIX = "f/"  # the single puts that bring the members close to their next snapshot
SNAPSHOT_COUNT = 1000  # raft entries between snapshots (the load, ~1570 txns, crosses one)
SNAPSHOT_DUE_WITHIN = 20  # entries left before the first member's next snapshot at the start
STORM_S = 12.0  # the storm's least length: a workload, never asserted on
# ... and it goes on until every member has written a snapshot in it, at most this long: the
# members' thresholds are staggered (up to a quarter more entries), and on a slow machine
# the storm's puts reach the last member's threshold later
STORM_MAX_S = 60.0
PUTTERS = 8
PAGE_READERS = 3  # limit 1000: one page plus the count of all keys
COUNT_READERS = 2
HISTORY_READERS = 3  # no limit, at a revision below the current one
SETTLE_S = 60.0
LEADER_CHANGES = "raftkv_raft_leader_changes_total"
LOOP_STALLS = "raftkv_loop_stall_seconds"
LOOP_LONGEST_STALL = "raftkv_loop_longest_stall_seconds"
COUNT = re.compile(rb'"count":"(\d+)"')


def key(i: int) -> str:
    return f"{PREFIX}{i:06d}"


def storm_key(n: int) -> str:
    """The key of the ``n``-th storm put: spread over the keyspace, each key at most once
    (61 is prime to KEYS)."""
    return key(n * 61 % KEYS)


@dataclass
class Storm:
    started: float = field(default_factory=time.monotonic)
    issued: int = 0
    acked: dict[str, tuple[str, int]] = field(default_factory=dict)  # key -> (value, revision)
    put_errors: list[str] = field(default_factory=list)
    read_errors: list[str] = field(default_factory=list)
    reads: dict[str, int] = field(default_factory=dict)  # reader -> reads answered
    compacted_reads: int = 0  # historical reads overtaken by the compaction (allowed)
    history_revision: int = 0
    compact_revision: int = 0
    compaction_error: str = ""
    snapshotted: set[str] = field(default_factory=set)  # members with a new snapshot file
    timeline: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def note(self, text: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:6.2f}s {text}")


async def putter(client: AsyncClient, seq: itertools.count, storm: Storm) -> None:
    for n in seq:
        if storm.done.is_set():
            return
        storm.issued += 1
        k, v = storm_key(n), f"storm-{n}"
        try:
            result = await client.put(k, v)
        except ClientError as exc:
            storm.put_errors.append(f"put {k}: {exc!r:.300}")
            storm.note(f"put error: {exc!r:.120}")
            continue
        storm.acked[k] = (v, result.header.revision)


async def reader(name: str, client: AsyncClient, kind: str, storm: Storm) -> None:
    """Whole-range reads through the client: a page of 1000 (and the count of all keys), or
    the count only; linearizable (on the leader) and serializable (on the client's member)
    in turn."""
    for i in itertools.count():
        if storm.done.is_set():
            return
        serializable = i % 2 == 1
        try:
            if kind == "page":
                r = await client.range(PREFIX, prefix=True, limit=1000, serializable=serializable)
                ok = len(r.kvs) == 1000 and r.more and r.count == KEYS
            else:
                r = await client.range(
                    PREFIX, prefix=True, count_only=True, serializable=serializable
                )
                ok = not r.kvs and r.count == KEYS
        except ClientError as exc:
            storm.read_errors.append(f"{name} ({kind}): {exc!r:.300}")
            storm.note(f"{name} read error: {exc!r:.120}")
            continue
        if not ok:
            storm.read_errors.append(f"{name} ({kind}): {len(r.kvs)} kvs, count {r.count}")
        storm.reads[name] = storm.reads.get(name, 0) + 1


async def history_reader(name: str, url: str, storm: Storm) -> None:
    """Every key at a historical revision, no limit, from one member (linearizable and
    serializable in turn). Plain HTTP, checked on the raw bytes: decoding 200,000 keys in
    the client would take the test's own process seconds of CPU per read, CPU the members
    share."""
    body = {"key": b64(PREFIX), "range_end": b64(prefix_range_end(PREFIX.encode()))}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for i in itertools.count():
            if storm.done.is_set():
                return
            revision = storm.history_revision
            request = {**body, "revision": str(revision), "serializable": i % 2 == 1}
            try:
                async with session.post(url + "/v3/kv/range", json=request) as resp:
                    code, raw = resp.status, await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                storm.read_errors.append(f"{name} (history, rev {revision}): {exc!r:.300}")
                storm.note(f"{name} read error: {exc!r:.120}")
                continue
            if code != 200 and b"compacted" in raw and revision < storm.compact_revision:
                storm.compacted_reads += 1  # asked before the compaction moved the floor
                continue
            count = COUNT.search(raw)
            kvs = raw.count(b'"key":')
            if code != 200 or count is None or int(count.group(1)) != KEYS or kvs != KEYS:
                storm.read_errors.append(
                    f"{name} (history, rev {revision}): {code}, {kvs} kvs, {raw[:200]!r}"
                )
                continue
            storm.reads[name] = storm.reads.get(name, 0) + 1


async def compactor(client: AsyncClient, storm: Storm) -> None:
    try:
        await asyncio.wait_for(storm.done.wait(), STORM_S / 2)  # halfway through the storm
        return
    except TimeoutError:
        pass
    try:
        current = await client.range(PREFIX, prefix=True, count_only=True)
        target = current.header.revision
        # New historical reads go to the compact revision (still below the current one once
        # the puts go on); one already sent below it may be answered "compacted".
        storm.compact_revision = storm.history_revision = target
        storm.note(f"compaction to {target} sent")
        await client.compact(target)
    except ClientError as exc:
        storm.compaction_error = repr(exc)
        storm.note(f"compaction failed: {exc!r:.120}")
        return
    storm.note(f"compaction to {target} answered")


async def monitor(cluster: LocalCluster, storm: Storm) -> None:
    """Notes every change of a member's term, leader or leader-change count, and every new
    snapshot file."""
    seen: dict[str, object] = {}
    while not storm.done.is_set():
        for node in cluster.nodes:
            try:
                view = await asyncio.to_thread(member_view, node.client_url, 2.0)
                changes = await asyncio.to_thread(metric, node.client_url, LEADER_CHANGES, 2.0)
                state = f"term {view.term} leader {view.leader:x} leader changes {changes}"
            except OSError as exc:
                state = f"no answer ({type(exc).__name__})"
            snaps = snapshot_indexes(node.data_dir)
            for name, value in ((node.name, state), (node.name + " snapshot", snaps[-1:])):
                if seen.get(name) != value:
                    if name in seen:
                        storm.note(f"{name}: {seen[name]} -> {value}")
                        if name.endswith(" snapshot"):
                            storm.snapshotted.add(node.name)
                    seen[name] = value
        try:
            await asyncio.wait_for(storm.done.wait(), 0.25)  # the sampling period
        except TimeoutError:
            pass


async def load(cluster: LocalCluster) -> int:
    async with AsyncClient(cluster.endpoints, timeout_s=120, attempt_timeout_s=60) as client:
        items = [(key(i), f"v{i:06d}") for i in range(KEYS)]
        return await run_txns(client, put_txns(items), concurrency=8)


async def fill(cluster: LocalCluster, puts: int) -> int:
    """``puts`` single puts (one raft entry each) outside the prefix; the last revision."""
    async with AsyncClient(cluster.endpoints, timeout_s=60) as client:
        seq = iter(range(puts))
        revisions = [0]

        async def worker() -> None:
            for n in seq:
                revisions.append((await client.put(f"{FILL_PREFIX}{n}", "x")).header.revision)

        await asyncio.gather(*(worker() for _ in range(16)))
        return max(revisions)


async def run_storm(cluster: LocalCluster, history_revision: int) -> Storm:
    storm = Storm(history_revision=history_revision)

    def patient(endpoints: list[str]) -> AsyncClient:
        """One attempt per request: a request that fails is counted, not retried."""
        return AsyncClient(endpoints, timeout_s=120, attempt_timeout_s=120, retries=0)

    writer = patient(cluster.endpoints)
    # Per member: its serializable reads (its linearizable ones go to the leader).
    members = [patient([n.client_url]) for n in cluster.nodes]
    try:
        seq = itertools.count()
        kinds = ["page"] * PAGE_READERS + ["count"] * COUNT_READERS
        kinds += ["history"] * HISTORY_READERS
        urls = [n.client_url for n in cluster.nodes]
        workers = [
            *(putter(writer, seq, storm) for _ in range(PUTTERS)),
            *(
                reader(f"reader{i}", members[i % len(members)], kind, storm)
                if kind != "history"
                else history_reader(f"reader{i}", urls[i % len(urls)], storm)
                for i, kind in enumerate(kinds)
            ),
            compactor(writer, storm),
            monitor(cluster, storm),
        ]
        tasks = [asyncio.ensure_future(w) for w in workers]
        try:
            await asyncio.sleep(STORM_S)  # the storm's least length (a workload, not a wait)
            deadline = storm.started + STORM_MAX_S
            names = {n.name for n in cluster.nodes}
            while storm.snapshotted < names and time.monotonic() < deadline:
                await asyncio.sleep(0.25)  # the monitor's sampling period
        finally:
            storm.note(f"storm over: {len(storm.acked)} puts acknowledged so far")
            storm.done.set()
            await asyncio.gather(*tasks)  # each ends after its request in flight
    finally:
        await writer.close()
        for c in members:
            await c.close()
    return storm


async def final_scan(cluster: LocalCluster) -> tuple[int, dict[bytes, tuple[bytes, int]]]:
    async with AsyncClient(cluster.endpoints, timeout_s=60) as client:
        revision, rows = await paged_scan(client, PREFIX)
    return revision, {k: (v, mod) for k, v, _, mod, _ in rows}


def views(cluster: LocalCluster) -> dict[str, MemberView]:
    return {n.name: member_view(n.client_url) for n in cluster.nodes}


def all_metrics(cluster: LocalCluster) -> dict[str, dict[str, float]]:
    return {n.name: metrics(n.client_url) for n in cluster.nodes}


def loop_stalls(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> str:
    """Per member: the event-loop stalls longer than ~250 ms during the storm, and the
    longest since it started (where the member exports them). Reported, not asserted."""
    out = []
    for name in after:
        counts = [histogram_above(m[name], LOOP_STALLS, 0.25) for m in (before, after)]
        longest = after[name].get(LOOP_LONGEST_STALL)
        if counts[0] is not None and counts[1] is not None:
            out.append(f"{name}: {counts[1] - counts[0]:g} (longest {longest or 0:.3f} s)")
    return ", ".join(out) or "not exported"


def at_revision(cluster: LocalCluster, revision: int) -> bool:
    return all(v.revision == revision for v in views(cluster).values())


def settled(cluster: LocalCluster) -> set[int] | None:
    """The members' compact revisions once they have all applied the same entries."""
    states = [status(n) or {} for n in cluster.nodes]
    if len({(s.get("applied_index"), s.get("revision")) for s in states}) != 1 or not all(states):
        return None
    return {s["compact_revision"] for s in states}


def entries_to_next_snapshot(cluster: LocalCluster) -> int:
    """Raft entries until the first member's next snapshot (one is taken once more than its
    threshold, ``SNAPSHOT_COUNT`` staggered by member ID, were applied after the last)."""
    due = []
    for node in cluster.nodes:
        snaps = snapshot_indexes(node.data_dir)
        last = snaps[-1] if snaps else 0
        view = member_view(node.client_url)
        threshold = snapshot_threshold(view.member_id, SNAPSHOT_COUNT)
        due.append(last + threshold + 1 - view.applied_index)
    return min(due)


def test_storm_keeps_leader(scale_cluster):
    cluster = scale_cluster(["--snapshot-count", str(SNAPSHOT_COUNT)])
    loaded = asyncio.run(load(cluster))
    wait_for(lambda: at_revision(cluster, loaded), SETTLE_S, "the load applied everywhere")
    # The load crosses every member's threshold; a snapshot child may still be writing.
    wait_for(
        lambda: all(snapshot_indexes(n.data_dir) for n in cluster.nodes),
        SETTLE_S,
        "a snapshot of the load on every member",
    )
    base = asyncio.run(fill(cluster, entries_to_next_snapshot(cluster) - SNAPSHOT_DUE_WITHIN))
    base = max(base, loaded)
    wait_for(lambda: at_revision(cluster, base), SETTLE_S, "the fill applied everywhere")
    before = views(cluster)
    (leader,) = {v.leader for v in before.values()}
    assert leader != 0
    metrics_before = all_metrics(cluster)
    changes_before = {name: m.get(LEADER_CHANGES) for name, m in metrics_before.items()}
    snaps_before = {n.name: snapshot_indexes(n.data_dir) for n in cluster.nodes}

    storm = asyncio.run(run_storm(cluster, loaded))

    compacted = wait_for(lambda: settled(cluster), SETTLE_S, "every member at one applied index")
    after = views(cluster)
    metrics_after = all_metrics(cluster)
    changes_after = {name: m.get(LEADER_CHANGES) for name, m in metrics_after.items()}
    snaps_after = {n.name: snapshot_indexes(n.data_dir) for n in cluster.nodes}
    story = "\n".join(
        [
            f"{storm.issued} puts issued, {len(storm.acked)} acknowledged",
            f"reads answered: {storm.reads}",
            f"historical reads overtaken by the compaction: {storm.compacted_reads}",
            f"terms/leaders before: {before}",
            f"terms/leaders after:  {after}",
            f"leader changes (metric) before {changes_before}, after {changes_after}",
            f"loop stalls > 250 ms in the storm: {loop_stalls(metrics_before, metrics_after)}",
            f"snapshot indexes before {snaps_before}, after {snaps_after}",
            f"put errors ({len(storm.put_errors)}): {storm.put_errors[:5]}",
            f"read errors ({len(storm.read_errors)}): {storm.read_errors[:5]}",
            "timeline:",
            *storm.timeline,
        ]
    )
    print(story)
    # Nothing stalled a member long enough for an election.
    terms = {name: v.term for name, v in after.items()}
    assert terms == {name: v.term for name, v in before.items()}, story
    assert {v.leader for v in after.values()} == {leader}, story
    # ... nor long enough for a follower to give up on the leader (with pre-vote, that
    # leaves the term alone when the other members still hear the leader).
    assert changes_after == changes_before, story
    assert storm.put_errors == [], story
    assert storm.read_errors == [], story
    assert storm.compaction_error == "", story
    # The storm did what it is for: puts, snapshots on every member, the compaction, reads
    # of every kind answered.
    assert len(storm.acked) == storm.issued > SNAPSHOT_DUE_WITHIN, story
    for node in cluster.nodes:
        assert snaps_after[node.name][-1] > snaps_before[node.name][-1], story
    assert storm.compact_revision > loaded, story
    assert compacted == {storm.compact_revision}, story  # on every member
    assert len(storm.reads) == PAGE_READERS + COUNT_READERS + HISTORY_READERS, story
    # Every put applied once, with the revision it was acknowledged with; nothing else.
    revision, rows = asyncio.run(final_scan(cluster))
    assert revision == base + len(storm.acked), story
    assert len(rows) == KEYS
    wrong = [
        (k, value, rev, rows.get(k.encode()))
        for k, (value, rev) in storm.acked.items()
        if rows.get(k.encode()) != (value.encode(), rev)
    ]
    assert wrong == [], wrong[:5]
