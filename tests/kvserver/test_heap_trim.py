"""HeapTrimmer: trims run one at a time off the loop, requests during one fold into one
more, and on glibc a trim really hands freed heap pages back to the kernel."""

import asyncio
import threading

import pytest

from kvserver.server.heap_trim import HeapTrimmer


async def test_requests_during_a_trim_fold_into_one_more():
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def fake_trim(pad: int) -> int:
        calls.append(threading.current_thread().name)
        started.set()
        release.wait(10)
        return 1

    trimmer = HeapTrimmer(malloc_trim=fake_trim)
    trimmer.request("log-cut")
    await asyncio.to_thread(started.wait, 10)
    for _ in range(5):
        trimmer.request("compacted")
    release.set()
    await asyncio.wait_for(trimmer.wait_idle(), 10)
    assert trimmer.trims == 2
    assert trimmer.requested == {"log-cut": 1, "compacted": 5}
    assert threading.main_thread().name not in calls  # never on the loop's thread


def test_without_a_running_loop_a_request_is_only_counted():
    trimmer = HeapTrimmer(malloc_trim=lambda pad: 0)
    trimmer.request("started")
    assert trimmer.trims == 0 and trimmer.requested == {"started": 1}


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


async def test_freed_entries_go_back_to_the_kernel():
    trimmer = HeapTrimmer()
    if not trimmer.available:
        pytest.skip("the C library has no malloc_trim")
    # Entries the size of a 128-put txn, interleaved with small long-lived objects, as a
    # raft log and a store grow together; then the log is cut, keeping its newest entries
    # (which sit at the top of the heap, so the C library cannot simply shrink it).
    entries, keep = [], []
    for i in range(2000):
        entries.append(bytes(38_000) + b"%d" % i)
        keep.append(b"k%09d" % i)
    before_cut = _rss_anon_kib()
    del entries[:-100]
    held = _rss_anon_kib()
    trimmer.request("log-cut")
    await asyncio.wait_for(trimmer.wait_idle(), 30)
    after = _rss_anon_kib()
    freed_kib = 1900 * 38_000 // 1024
    assert before_cut - held < freed_kib // 2, "freed without a trim: nothing to show here"
    assert held - after > freed_kib * 3 // 4, (before_cut, held, after)
    assert trimmer.trims == 1 and len(keep) == 2000 and len(entries) == 100
