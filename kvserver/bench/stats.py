"""Latency statistics of a benchmark run: raw samples, exact merging, etcd-style summaries.

``Stats`` keeps every successful request's latency (seconds, as ``array('d')``: 8 bytes a
request, so a million requests cost 8 MB) and counts failures by error text. Keeping the raw
samples makes aggregation exact: ``Stats.merge`` concatenates, so the percentiles of merged
results are the percentiles of all requests together — never an average of per-process
percentiles. ``to_bytes``/``from_bytes`` carry a ``Stats`` between processes.

``elapsed_s`` is the wall time of the run (first request sent to last answer received); a
merge spans the earliest ``started`` to the latest ``finished`` (``time.monotonic`` is one
system-wide clock on Linux, so processes' stamps compare).

Percentiles use the nearest-rank definition: the p-th percentile of n sorted samples is the
sample at rank ``ceil(p/100 * n)`` (1-based), so it is always a measured value.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PERCENTILES = (10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9)
HISTOGRAM_BUCKETS = 10  # etcd's report: ten equal-width buckets from fastest to slowest


def percentile(sorted_samples: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted samples (``p`` in (0, 100])."""
    if not sorted_samples:
        raise ValueError("no samples")
    if not 0.0 < p <= 100.0:
        raise ValueError(f"percentile {p} outside (0, 100]")
    rank = math.ceil(p / 100.0 * len(sorted_samples))
    return sorted_samples[max(rank, 1) - 1]


@dataclass
class Stats:
    latencies: array = field(default_factory=lambda: array("d"))
    errors: Counter = field(default_factory=Counter)
    started: float | None = None  # time.monotonic() of the first request sent
    finished: float | None = None  # time.monotonic() of the last answer

    # --- recording (the runner's hot path) -----------------------------------------------

    def record(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def error(self, text: str) -> None:
        self.errors[text] += 1

    # --- combining -----------------------------------------------------------------------

    def merge(self, other: Stats) -> Stats:
        """A new ``Stats`` holding both runs' samples and errors (neither input changes)."""
        out = Stats(array("d", self.latencies), Counter(self.errors))
        out.latencies.extend(other.latencies)
        out.errors.update(other.errors)
        starts = [s for s in (self.started, other.started) if s is not None]
        ends = [e for e in (self.finished, other.finished) if e is not None]
        out.started = min(starts) if starts else None
        out.finished = max(ends) if ends else None
        return out

    @classmethod
    def merge_all(cls, parts: Iterable[Stats]) -> Stats:
        out = cls()
        for part in parts:  # in place: one copy of each sample, however many parts
            out.latencies.extend(part.latencies)
            out.errors.update(part.errors)
            if part.started is not None:
                out.started = (
                    part.started if out.started is None else min(out.started, part.started)
                )
            if part.finished is not None:
                out.finished = (
                    part.finished if out.finished is None else max(out.finished, part.finished)
                )
        return out

    def to_bytes(self) -> bytes:
        """A compact picklable form (raw samples, errors, stamps) for another process."""
        head = struct.pack(
            "<dd", *(math.nan if x is None else x for x in (self.started, self.finished))
        )
        errs = repr(sorted(self.errors.items())).encode()
        return head + struct.pack("<I", len(errs)) + errs + self.latencies.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> Stats:
        import ast

        started, finished = struct.unpack_from("<dd", data)
        (n,) = struct.unpack_from("<I", data, 16)
        errors = Counter(dict(ast.literal_eval(data[20 : 20 + n].decode())))
        lat = array("d")
        lat.frombytes(data[20 + n :])
        return cls(
            lat,
            errors,
            None if math.isnan(started) else started,
            None if math.isnan(finished) else finished,
        )

    # --- reading -------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self.latencies)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def elapsed_s(self) -> float:
        if self.started is None or self.finished is None:
            return 0.0
        return max(self.finished - self.started, 0.0)

    def summary(self) -> Summary:
        lat = sorted(self.latencies)
        n = len(lat)
        elapsed = self.elapsed_s
        if n == 0:
            return Summary(
                total_s=elapsed,
                count=0,
                errors=self.error_count,
                slowest_s=None,
                fastest_s=None,
                average_s=None,
                stddev_s=None,
                requests_per_s=0.0,
                percentiles={},
                histogram=[],
                error_counts=dict(self.errors),
            )
        mean = math.fsum(lat) / n
        var = math.fsum((x - mean) ** 2 for x in lat) / n
        return Summary(
            total_s=elapsed,
            count=n,
            errors=self.error_count,
            slowest_s=lat[-1],
            fastest_s=lat[0],
            average_s=mean,
            stddev_s=math.sqrt(var),
            requests_per_s=n / elapsed if elapsed > 0 else 0.0,
            percentiles={p: percentile(lat, p) for p in PERCENTILES},
            histogram=histogram(lat),
            error_counts=dict(self.errors),
        )


def histogram(
    sorted_samples: Sequence[float], buckets: int = HISTOGRAM_BUCKETS
) -> list[tuple[float, int]]:
    """etcd's response-time histogram: ``buckets`` equal-width bins from the fastest to the
    slowest sample, as ``(upper bound, count)``; the fastest sample gets a bin of its own at
    the start, as in etcd's report. Counts add up to the number of samples."""
    if not sorted_samples:
        return []
    lo, hi = sorted_samples[0], sorted_samples[-1]
    width = (hi - lo) / buckets
    bounds = [lo] + [lo + width * (i + 1) for i in range(buckets)]
    bounds[-1] = hi  # exact, whatever the float rounding did
    counts = [0] * len(bounds)
    b = 0
    for x in sorted_samples:
        while b < len(bounds) - 1 and x > bounds[b]:
            b += 1
        counts[b] += 1
    return list(zip(bounds, counts, strict=True))


@dataclass(frozen=True)
class Summary:
    total_s: float
    count: int
    errors: int
    slowest_s: float | None
    fastest_s: float | None
    average_s: float | None
    stddev_s: float | None
    requests_per_s: float
    percentiles: dict[float, float]
    histogram: list[tuple[float, int]]
    error_counts: dict[str, int]

    def to_json(self) -> dict:
        return {
            "total_s": self.total_s,
            "count": self.count,
            "errors": self.errors,
            "slowest_s": self.slowest_s,
            "fastest_s": self.fastest_s,
            "average_s": self.average_s,
            "stddev_s": self.stddev_s,
            "requests_per_s": self.requests_per_s,
            "percentiles_s": {_pct_label(p): v for p, v in self.percentiles.items()},
            "histogram": [{"le_s": b, "count": c} for b, c in self.histogram],
            "error_counts": self.error_counts,
        }


def _pct_label(p: float) -> str:
    return f"{p:g}"
