"""kvserver.bench.stats: exact merging, nearest-rank percentiles, etcd's histogram."""

import math
from array import array

from hypothesis import given
from hypothesis import strategies as st

from kvserver.bench.stats import PERCENTILES, Stats, histogram, percentile

latency = st.floats(min_value=1e-6, max_value=10.0, allow_nan=False)
parts_st = st.lists(st.lists(latency, max_size=50), min_size=1, max_size=6)


def stats_of(samples, started=0.0, finished=1.0, errors=()):
    s = Stats(array("d", samples), started=started, finished=finished)
    for e in errors:
        s.error(e)
    return s


@given(parts_st)
def test_merged_percentiles_equal_percentiles_of_the_concatenation(parts):
    merged = Stats.merge_all(stats_of(p) for p in parts)
    pairwise = stats_of([])
    for p in parts:
        pairwise = pairwise.merge(stats_of(p))
    together = sorted(x for p in parts for x in p)
    for m in (merged, pairwise):
        assert m.count == len(together)
        if together:
            s = m.summary()
            for p in PERCENTILES:
                assert s.percentiles[p] == percentile(together, p)
            assert s.fastest_s == together[0] and s.slowest_s == together[-1]


@given(parts_st)
def test_merge_through_bytes_is_exact(parts):
    """What --procs does: each process ships Stats.to_bytes, the parent merges."""
    shipped = [
        Stats.from_bytes(
            stats_of(p, started=i, finished=i + 2.5, errors=["HTTP 503"] * i).to_bytes()
        )
        for i, p in enumerate(parts)
    ]
    merged = Stats.merge_all(shipped)
    assert sorted(merged.latencies) == sorted(x for p in parts for x in p)
    assert merged.errors["HTTP 503"] == sum(range(len(parts)))
    assert merged.started == 0 and merged.finished == len(parts) - 1 + 2.5


@given(st.lists(latency, min_size=1, max_size=200))
def test_histogram_counts_every_sample_once_in_ascending_buckets(samples):
    lat = sorted(samples)
    h = histogram(lat)
    assert sum(c for _, c in h) == len(lat)
    bounds = [b for b, _ in h]
    assert bounds == sorted(bounds) and bounds[0] == lat[0] and bounds[-1] == lat[-1]
    # every sample sits in the first bucket whose bound is >= it
    i = 0
    for b, c in h:
        for x in lat[i : i + c]:
            assert x <= b
        i += c


def test_nearest_rank_percentiles():
    lat = [float(x) for x in range(1, 101)]  # 1..100
    assert percentile(lat, 50) == 50.0
    assert percentile(lat, 99) == 99.0
    assert percentile(lat, 99.9) == 100.0
    assert percentile(lat, 10) == 10.0
    assert percentile([7.0], 99.9) == 7.0


def test_summary_numbers():
    s = stats_of(
        [0.001, 0.002, 0.003, 0.004], started=10.0, finished=12.0, errors=["HTTP 500", "HTTP 500"]
    ).summary()
    assert s.count == 4 and s.errors == 2
    assert s.requests_per_s == 2.0  # 4 successes in 2 s
    assert math.isclose(s.average_s, 0.0025)
    assert math.isclose(s.stddev_s, math.sqrt(1.25e-6))
    assert s.error_counts == {"HTTP 500": 2}


def test_empty_run_has_a_summary_without_latencies():
    s = Stats(errors=__import__("collections").Counter({"connection refused": 3})).summary()
    assert s.count == 0 and s.errors == 3 and s.percentiles == {} and s.histogram == []
