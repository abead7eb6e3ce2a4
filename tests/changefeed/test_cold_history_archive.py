"""``cold_events`` from a real member's ``file://`` archive equals the member's own watch
history (slow: a ``raftkv serve`` process).

The member archives with a snapshot every 40 entries and takes puts, overwrites, deletes,
txns with a compare, puts outside the range, leases revoked with their keys attached, a
prefix delete and a compaction. For batches starting at 0 (the log is archived from its
first segment) and at archived snapshots, ending a few revisions on or at the last one, the
events rebuilt from the archive are exactly what a watch of the range with ``prev_kv`` gave
(type, key, value, create and mod revision, version, lease, previous value). A batch past
what the archive holds fails with ``ColdGapError``.
"""

from __future__ import annotations

import pytest

from kvserver.client import Client, Cmp, Op, Txn
from kvserver.kvpb.kv import EventType
from kvserver.spark.source.cold_history import ArchiveView, ColdGapError, cold_events
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

PREFIX = b"h/"
RANGE_END = b"h0"
MAX_MORE_ROUNDS = 10


def write_history(kv: Client, rounds: int) -> int:
    last = 0
    for r in range(rounds):
        for i in range(6):
            kv.put(f"h/k{i}", f"{r}.{i}")
        kv.delete(f"h/k{r % 6}")
        kv.txn(
            Txn()
            .when(Cmp.version("h/k1") > 0)
            .then(Op.put(f"h/t{r}a", "a"), Op.delete(f"h/k{(r + 2) % 6}"))
            .otherwise(Op.put(f"h/t{r}b", "b"))
        )
        kv.put(f"other/{r}", "outside the range")
        if r % 3 == 1:
            lease = kv.lease_grant(600)
            kv.put(f"h/leased{r}", "l", lease=lease.id)
            kv.put(f"other/leased{r}", "l", lease=lease.id)
            kv.lease_revoke(lease.id)
        if r % 5 == 4:
            kv.delete("h/t", prefix=True)
        if r == rounds // 2:
            kv.compact(kv.put("h/compact-at", str(r)).revision)
        last = kv.put("h/end", str(r)).revision
    return last


def as_rows(events) -> list[tuple]:
    return [
        (
            ev.kv.mod_revision,
            bytes(ev.kv.key),
            ev.type is EventType.PUT or str(ev.type).endswith("PUT"),
            bytes(ev.kv.value),
            ev.kv.create_revision,
            ev.kv.version,
            ev.kv.lease,
            None if ev.prev_kv is None else (bytes(ev.prev_kv.value), ev.prev_kv.mod_revision),
        )
        for ev in events
    ]


def test_cold_events_equal_the_watch_history(make_cluster, tmp_path):
    archive = f"file://{tmp_path / 'archive'}"
    c = make_cluster(
        1,
        extra_args=[
            "--archive-url",
            archive,
            "--archive-interval",
            "100",
            "--snapshot-count",
            "40",
        ],
    )
    with Client(c.endpoints, timeout_s=30) as kv:
        history = []
        # Opened first: the compaction in the history does not cut a watch already running.
        with kv.watch(PREFIX, prefix=True, start_revision=1, prev_kv=True) as w:
            last = write_history(kv, 24)
            # A member spaces its snapshots out in time too, so a busy machine may have taken
            # fewer than three of them: more writes until three are archived.
            for more in range(MAX_MORE_ROUNDS):
                reached = kv.status().raft_index
                wait_for(lambda i=reached: ArchiveView.load(archive, ()).reaches(i), 60, "archived")
                if len(ArchiveView.load(archive, ()).snapshot_revisions()) >= 3:
                    break
                for i in range(40):
                    last = kv.put(f"h/more{i}", str(more)).revision
            while not history or history[-1].kv.mod_revision < last:
                history.append(w.get(timeout_s=30))
        index = kv.status().raft_index
    wait_for(lambda: ArchiveView.load(archive, ()).reaches(index), 60, "the archive")
    view = ArchiveView.load(archive, ())
    snaps = view.snapshot_revisions()
    assert len(snaps) >= 3, snaps
    expect = as_rows(history)

    def window(start: int, end: int) -> list[tuple]:
        return [row for row in expect if start < row[0] <= end]

    for start in [0, *snaps[:3]]:
        for end in (start + 7, last):
            got = cold_events(archive, (), view.member_id, start, end, PREFIX, RANGE_END)
            assert as_rows(got) == window(start, end), (start, end)
    with pytest.raises(ColdGapError):
        cold_events(archive, (), view.member_id, 0, last + 50, PREFIX, RANGE_END)
