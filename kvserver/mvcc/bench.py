"""Micro-benchmark of the MVCC store's apply path (not a test; prints numbers).

    .venv/bin/python -m kvserver.mvcc.bench [--puts N] [--keys K] [--value-bytes B]

Measures, single-threaded: ``apply(PutRequest)`` with dedup ids, ``apply_entry`` (msgpack
decode + apply, what the node driver runs per committed entry), single-key ``range`` reads,
a page of 1,000 and a ``count_only`` over every key, a paged scan, a compaction of the whole
history (in one go, and as the apply plus batches of ``compact_step`` with the longest
batch), and snapshot serialize/restore throughput. ``--puts 1000000 --keys 1000000`` gives
the figures at a million keys.
"""

from __future__ import annotations

import argparse
import gc
import time

from kvserver.kvpb.kv import PutRequest, RangeRequest, prefix_range_end
from kvserver.mvcc.codec import encode_entry
from kvserver.mvcc.store import MVCCStore


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>10,.0f}/s  ({seconds * 1e6 / n:.2f} us each)"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--puts", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--value-bytes", type=int, default=256)
    args = ap.parse_args(argv)
    n, nkeys = args.puts, args.keys
    value = b"v" * args.value_bytes
    keys = [b"/bench/key/%08d" % i for i in range(nkeys)]
    requests = [PutRequest(keys[i % nkeys], value) for i in range(n)]
    entries = [encode_entry(r, client_id=1 + i % 64, request_id=i) for i, r in enumerate(requests)]

    gc.collect()
    store = MVCCStore()
    t0 = time.perf_counter()
    for i, r in enumerate(requests):
        store.apply(r, 1 + i % 64, i)
    t1 = time.perf_counter()
    print(f"apply(PutRequest)          {_rate(n, t1 - t0)}")

    store2 = MVCCStore()
    t0 = time.perf_counter()
    for e in entries:
        store2.apply_entry(e)
    t1 = time.perf_counter()
    print(f"apply_entry(bytes)         {_rate(n, t1 - t0)}")

    t0 = time.perf_counter()
    for i in range(n):
        store.range(keys[i % nkeys])
    t1 = time.perf_counter()
    print(f"range(single key)          {_rate(n, t1 - t0)}")
    _whole_range(store, b"/bench/key/")

    hist = store.history_size
    background = MVCCStore.restore(store.serialize(), compact_in_background=True)
    t0 = time.perf_counter()
    store.compact(store.revision)
    t1 = time.perf_counter()
    print(f"compact({hist:,} versions)  {(t1 - t0) * 1e3:.1f} ms")
    # The same compaction as RaftKV runs it: the apply (logical part), then the old versions
    # in batches of 1,000 keys, each batch one event-loop turn.
    t0 = time.perf_counter()
    background.compact(background.revision)
    t1 = time.perf_counter()
    steps, worst, busy = 0, 0.0, 0.0
    while True:
        t2 = time.perf_counter()
        more = background.compact_step(1000)
        dt = time.perf_counter() - t2
        steps, worst, busy = steps + 1, max(worst, dt), busy + dt
        if not more:
            break
    print(
        f"  background: apply {(t1 - t0) * 1e3:.3f} ms, then {steps:,} compact_step(1000): "
        f"longest {worst * 1e3:.2f} ms, total {busy * 1e3:.0f} ms"
    )

    t0 = time.perf_counter()
    chunks = list(store2.serialize())
    t1 = time.perf_counter()
    size = sum(len(c) for c in chunks)
    print(
        f"serialize {store2.history_size:,} versions: {size / 1e6:.1f} MB in {len(chunks)} "
        f"chunks, {(t1 - t0) * 1e3:.0f} ms"
    )
    # The longest step is set by CPython's cyclic GC walking the whole heap (a node should
    # gc.freeze() long-lived state); shown with the GC as is and with the heap frozen.
    print(f"  longest chunk step: {_max_step_ms(store2):.1f} ms", end="")
    gc.freeze()
    print(f", after gc.freeze(): {_max_step_ms(store2):.1f} ms")
    gc.unfreeze()
    t0 = time.perf_counter()
    MVCCStore.restore(chunks)
    t1 = time.perf_counter()
    print(f"restore: {(t1 - t0) * 1e3:.0f} ms")


def _whole_range(store: MVCCStore, prefix: bytes) -> None:
    """A page and a count over every key, and a scan in pages of 10,000 (median of 5)."""
    end = prefix_range_end(prefix)
    for name, req in (
        ("range(all keys, limit 1000)", RangeRequest(prefix, end, limit=1000)),
        ("range(all keys, count_only)", RangeRequest(prefix, end, count_only=True)),
    ):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            store.apply(req)
            times.append(time.perf_counter() - t0)
        print(f"{name:27s}{sorted(times)[2] * 1e3:10.3f} ms")
    t0 = time.perf_counter()
    start, seen = prefix, 0
    while True:
        resp = store.range(start, end, limit=10_000)
        seen += len(resp.kvs)
        if not resp.more:
            break
        start = resp.kvs[-1].key + b"\0"
    print(f"scan in pages of 10,000     {_rate(seen, time.perf_counter() - t0)}")


def _max_step_ms(store: MVCCStore) -> float:
    """Longest time spent producing one chunk (how long an event loop would be blocked)."""
    worst = 0.0
    it = store.serialize()
    while True:
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        worst = max(worst, time.perf_counter() - t0)
    return worst * 1e3


if __name__ == "__main__":
    main()
