"""``chunks.write_chunks`` with several txns in flight: each chunk applied once, retries skip.

Against the real HTTP API over an in-memory store (no Spark session): a task's rows written
with 4 chunk txns outstanding land once each with one marker per chunk; the same task run
again (a retried attempt) skips every chunk; an attempt that fails after 3 txns leaves exactly
3 chunks, and its retry applies the others and skips those 3.
"""

from __future__ import annotations

import pytest

from kvserver.client import Client
from kvserver.spark.source import chunks
from kvserver.spark.source.options import parse
from tests.client.servers import Served


@pytest.fixture
def served():
    s = Served().start()
    try:
        yield s
    finally:
        s.close()


def rows(n: int) -> list[chunks.Row]:
    return [chunks.Row(b"w/%05d" % i, b"v%d" % i, 0) for i in range(n)]


def test_chunks_in_flight_apply_once_and_a_retry_skips_them(served) -> None:
    o = parse({"endpoints": served.url, "maxTxnOps": "11"}, need_range=False)
    with Client([served.url]) as c:
        first = chunks.write_chunks(c, o, rows(1000), "batch/job", 0, None, in_flight=4)
        assert (first.applied, first.skipped, first.txns) == (100, 0, 100)
        again = chunks.write_chunks(c, o, rows(1000), "batch/job", 0, None, in_flight=4)
        assert (again.applied, again.skipped) == (0, 100)
        got = c.range("w/", prefix=True)
        assert {kv.key: kv.value for kv in got.kvs} == {r.key: r.value for r in rows(1000)}
        assert all(kv.version == 1 for kv in got.kvs)  # once each
        markers = c.range(o.marker_prefix + b"batch/job/", prefix=True, count_only=True)
        assert markers.count == 100


def test_a_failed_attempt_leaves_its_chunks_and_the_retry_applies_the_rest(served) -> None:
    o = parse({"endpoints": served.url, "maxTxnOps": "11"}, need_range=False)
    with Client([served.url]) as c:
        with pytest.raises(RuntimeError, match="injected failure after 3 txns"):
            chunks.write_chunks(c, o, rows(100), "batch/j2", 1, None, 3, in_flight=4)
        assert c.range("w/", prefix=True, count_only=True).count == 30
        retry = chunks.write_chunks(c, o, rows(100), "batch/j2", 1, None, in_flight=4)
        assert (retry.applied, retry.skipped) == (7, 3)
        assert c.range("w/", prefix=True, count_only=True).count == 100
