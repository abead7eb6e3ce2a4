"""Measure snapshot save/load throughput and how long a save or load in a worker thread
keeps the main thread from running (the GIL stall an event loop would see).

Not a test (no assertions): run ``.venv/bin/python -m tests.snap.bench_snap [--mib N ...]``
from the repository root. Files go to a temp directory on the filesystem of ``--dir``.
"""

import argparse
import os
import tempfile
import threading
import time

import raftpb
from snap import Snapshotter


def _max_stall_ms(work, busy: bool) -> tuple[float, float]:
    """Run ``work`` in a thread; return (seconds it took, worst main-thread lateness in ms).

    busy=False: the main thread sleeps 1 ms per iteration, like an idle event loop waiting on
    timers; lateness is how much later than 1 ms it woke. busy=True: it spins, like a loaded
    event loop, competing for the GIL; lateness is the longest gap between iterations.
    """
    done = threading.Event()
    result = {}

    def run():
        t0 = time.perf_counter()
        work()
        result["s"] = time.perf_counter() - t0
        done.set()

    thread = threading.Thread(target=run)
    nap_s = 0.0 if busy else 0.001
    worst = 0.0
    thread.start()
    while not done.is_set():
        t0 = time.perf_counter()
        if nap_s:
            time.sleep(nap_s)
        worst = max(worst, time.perf_counter() - t0 - nap_s)
    thread.join()
    return result["s"], worst * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--dir", default=".")
    args = parser.parse_args()
    for mib in args.mib:
        payload = os.urandom(mib << 20)
        snapshot = raftpb.Snapshot(
            data=payload,
            metadata=raftpb.SnapshotMetadata(
                conf_state=raftpb.ConfState(voters=(1, 2, 3)), index=1000, term=2
            ),
        )
        for busy in (False, True):
            with tempfile.TemporaryDirectory(dir=args.dir) as d:
                s = Snapshotter(d)
                loaded = {}
                save_s, save_stall = _max_stall_ms(
                    lambda s=s, snapshot=snapshot: s.save_snap(snapshot), busy
                )
                load_s, load_stall = _max_stall_ms(
                    lambda s=s, loaded=loaded: loaded.setdefault("x", s.load()), busy
                )
                assert loaded["x"] == snapshot
            print(
                f"{mib:5d} MiB, main thread {'busy' if busy else 'idle'}:  "
                f"save {mib / save_s:6.1f} MiB/s (worst main-thread delay {save_stall:5.1f} ms)"
                f"  load {mib / load_s:6.1f} MiB/s (worst delay {load_stall:5.1f} ms)"
            )


if __name__ == "__main__":
    main()
