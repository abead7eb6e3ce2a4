"""Planning a batch read reads split points, not keys (no Spark session needed).

The planner runs against the real HTTP API over an in-memory store whose service counts
every key it hands out (range answers and ranks). Planning N keys into P parts must fetch at
most P - 1 split keys plus the two one-key barrier reads, however large N is; the parts are
balanced (sizes differ by at most one key), disjoint and cover the range; a small range is
one partition; the revision is one for every part.
"""

from __future__ import annotations

import pytest

from kvserver.client import Client, NotFoundError, Op, Txn
from kvserver.mvcc import MVCCStore
from kvserver.spark.source.batch_read import plan, split_ranks
from kvserver.spark.source.options import parse
from kvserver.spark.source.store import CompactedRevisionError, FutureRevisionReadError
from tests.client.servers import Served

N = 20_000


class Counting:
    """Counts the keys the store hands out through range answers and ranks."""

    def __init__(self, served: Served, monkeypatch) -> None:
        self.keys = 0
        kv = served.kv
        real_range, real_ranks = kv.range, MVCCStore.key_ranks

        async def range_(req):
            resp = await real_range(req)
            self.keys += len(resp.kvs)
            return resp

        def ranks(store, key, range_end, wanted):
            count, keys = real_ranks(store, key, range_end, wanted)
            self.keys += sum(k is not None for k in keys)
            return count, keys

        monkeypatch.setattr(kv, "range", range_)
        monkeypatch.setattr(MVCCStore, "key_ranks", ranks)


@pytest.fixture(scope="module")
def served():
    s = Served().start()
    try:
        with Client([s.url]) as c:
            for i in range(0, N, 120):
                c.txn(Txn().then(*(Op.put(f"p/{j:06d}", b"v") for j in range(i, min(i + 120, N)))))
            c.put("q/1", "outside")
        yield s
    finally:
        s.close()


def options(served: Served, **extra: str):
    return parse({"endpoints": served.url, "prefix": "p/", **extra})


def sizes(served: Served, parts) -> list[int]:
    with Client([served.url]) as c:
        return [c.range(p.start, p.end, revision=p.revision, count_only=True).count for p in parts]


def test_planning_fetches_only_the_split_keys(served, monkeypatch) -> None:
    counting = Counting(served, monkeypatch)
    parts = plan(options(served, numPartitions="8", minPartitionKeys="1000"))
    assert len(parts) == 8
    assert counting.keys <= 7 + 2  # split keys + two one-key barrier reads, never N
    assert len({p.revision for p in parts}) == 1
    got = sizes(served, parts)
    assert sum(got) == N and max(got) - min(got) <= 1
    assert parts[0].start == b"p/" and parts[-1].end == b"p0"
    assert all(a.end == b.start for a, b in zip(parts, parts[1:], strict=False))


def test_a_small_range_is_one_partition(served, monkeypatch) -> None:
    counting = Counting(served, monkeypatch)
    parts = plan(options(served, numPartitions="8"))  # N < the default minPartitionKeys
    assert [(p.start, p.end) for p in parts] == [(b"p/", b"p0")]
    assert counting.keys <= 1
    four = plan(options(served, numPartitions="8", minPartitionKeys=str(N // 4)))
    assert len(four) == 4


def test_an_older_revision_is_pinned_and_split_by_todays_ranks(served) -> None:
    with Client([served.url]) as c:
        old = c.range("p/", prefix=True, limit=1).revision
        c.put("p/000000-new", "later")
        try:
            parts = plan(
                options(served, numPartitions="4", minPartitionKeys="1", revision=str(old))
            )
            assert {p.revision for p in parts} == {old}
            assert sum(sizes(served, parts)) == N  # the range at the pinned revision
        finally:
            c.delete("p/000000-new")


def test_future_and_compacted_revisions_fail_when_planning(served) -> None:
    with Client([served.url]) as c:
        now = c.range("p/", prefix=True, limit=1).revision
        with pytest.raises(FutureRevisionReadError, match="above the store's current"):
            plan(options(served, revision=str(now + 100)))
        c.put("q/2", "x")
        c.compact(now)
        with pytest.raises(CompactedRevisionError, match=f"compact revision {now}"):
            plan(options(served, revision=str(now - 1)))


def test_a_server_without_ranks_gets_one_partition_and_no_scan(served, monkeypatch) -> None:
    def refuse(self, *args, **kwargs):
        raise NotFoundError("HTTP 404: 404 page not found", http_status=404)

    monkeypatch.setattr(Client, "key_ranks", refuse)
    counting = Counting(served, monkeypatch)
    parts = plan(options(served, numPartitions="8", minPartitionKeys="1"))
    assert len(parts) == 1 and counting.keys <= 1


def test_split_ranks_are_the_ceilings_of_equal_shares() -> None:
    assert split_ranks(10, 4) == [3, 5, 8]
    assert split_ranks(8, 4) == [2, 4, 6]
    assert split_ranks(3, 1) == []
