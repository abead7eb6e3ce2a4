"""WAL benchmark: durable append throughput and replay speed (prints numbers; not a test).

    .venv/bin/python benchmarks/wal_bench.py                  # everything, 1 GB replay
    .venv/bin/python benchmarks/wal_bench.py --replay-mb 200  # quicker
    .venv/bin/python benchmarks/wal_bench.py --dir /mnt/disk  # measure another disk

What it measures, on the disk holding ``--dir`` (a fresh temp dir inside it):

1. raw fdatasync rate: pwrite one framed 256-byte entry's worth of bytes (288) at the end of
   a preallocated file, then fdatasync, in a loop: what a WAL append costs the disk;
2. one writer, sync policy ``always``: ``WAL.save(None, [entry])`` in a loop, each save
   durable before the next (target: >= 80% of the raw rate). 1 and 2 run interleaved in
   short slices, because fsync latency on a shared machine drifts by 10x within a minute;
   then the same through the group-commit writer (``submit(...).result()``);
3. 64 concurrent writers, policy ``always``: asyncio tasks each awaiting
   ``GroupCommitWriter.append`` of one entry (the node driver's path; target: >= 50,000
   durable entries/s), and threads using ``WAL.append`` + ``WAL.sync_upto`` (the sync
   leader path); fsyncs per entry shows the batching;
4. replay: a WAL of ``--replay-mb`` MB of 256-byte entries (64 MB segments), then
   ``open`` + ``read_all`` with every CRC checked (target: >= 100 MB/s), page cache warm
   (``--cold`` drops the cache first; needs root).

Numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import wal  # noqa: E402
from raftpb import Entry, HardState  # noqa: E402

FRAME_BYTES = 288  # one 256-byte entry, framed


def fs_of(path: str) -> str:
    best, fstype = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and path.startswith(parts[1]) and len(parts[1]) > len(best):
                best, fstype = parts[1], parts[2]
    return f"{fstype} on {best or '?'}"


class RawSync:
    """pwrite + fdatasync of FRAME_BYTES at the end of a preallocated file, in a loop."""

    def __init__(self, dir_path: str) -> None:
        self.path = os.path.join(dir_path, "raw.dat")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.posix_fallocate(self.fd, 0, wal.DEFAULT_SEGMENT_SIZE_BYTES)  # like a segment
        os.fsync(self.fd)
        self.buf = os.urandom(FRAME_BYTES)
        self.off = 0

    def run(self, seconds: float) -> tuple[int, float]:
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            if self.off + FRAME_BYTES > wal.DEFAULT_SEGMENT_SIZE_BYTES:
                self.off = 0  # stay inside the preallocated space
            os.pwrite(self.fd, self.buf, self.off)
            os.fdatasync(self.fd)
            self.off += FRAME_BYTES
            n += 1
        return n, time.perf_counter() - t0

    def close(self) -> None:
        os.close(self.fd)
        os.unlink(self.path)


class OneWriter:
    """WAL.save(None, [entry]) in a loop: each save durable before the next."""

    def __init__(self, dir_path: str, data: bytes) -> None:
        self.w = new_wal(dir_path, "one-save")
        self.w.save(HardState(term=1, vote=1), [])
        self.data = data
        self.index = 0
        self.entries = 0
        self.syncs_before = self.w.sync_count

    def run(self, seconds: float) -> tuple[int, float]:
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            self.index += 1
            self.w.save(None, [Entry(term=1, index=self.index, data=self.data)])
            n += 1
        self.entries += n
        return n, time.perf_counter() - t0

    def close(self) -> float:
        syncs = self.w.sync_count - self.syncs_before
        self.w.close()
        return syncs / max(self.entries, 1)


def interleaved(a, b, seconds: float, rounds: int = 6) -> tuple[float, float]:
    """Alternate short runs of a and b: fsync latency drifts on a shared machine, and this
    way both see the same disk. Returns their rates."""
    totals = [[0, 0.0], [0, 0.0]]
    for _ in range(rounds):
        for k, bench in enumerate((a, b)):
            n, dt = bench.run(seconds / rounds)
            totals[k][0] += n
            totals[k][1] += dt
    return totals[0][0] / totals[0][1], totals[1][0] / totals[1][1]


def new_wal(dir_path: str, name: str, **kw) -> wal.WAL:
    return wal.create(os.path.join(dir_path, name), b"bench", **kw)


def one_writer_group(dir_path: str, seconds: float, data: bytes) -> tuple[float, float]:
    w = new_wal(dir_path, "one-group")
    writer = wal.GroupCommitWriter(w)
    writer.submit(HardState(term=1, vote=1)).result()
    base = w.sync_count
    i = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        i += 1
        writer.submit(None, [Entry(term=1, index=i, data=data)]).result()
    dt = time.perf_counter() - t0
    syncs = w.sync_count - base
    writer.close()
    w.close()
    return i / dt, syncs / i


def many_writers_asyncio(
    dir_path: str, seconds: float, data: bytes, writers: int, use_uvloop: bool = False
) -> tuple[float, float, float]:
    w = new_wal(dir_path, "many-uvloop" if use_uvloop else "many-asyncio")
    writer = wal.GroupCommitWriter(w)
    writer.submit(HardState(term=1, vote=1)).result()
    base_syncs, base_batches = w.sync_count, writer.batches
    counter = [0]

    async def client(deadline: float) -> int:
        done = 0
        while time.perf_counter() < deadline:
            counter[0] += 1  # the loop is single-threaded: indexes follow submission order
            await writer.append(None, [Entry(term=1, index=counter[0], data=data)])
            done += 1
        return done

    async def main() -> tuple[int, float]:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(client(t0 + seconds) for _ in range(writers)))
        return sum(done), time.perf_counter() - t0

    if use_uvloop:
        import uvloop

        n, dt = uvloop.run(main())
    else:
        n, dt = asyncio.run(main())
    syncs = w.sync_count - base_syncs
    batches = writer.batches - base_batches
    writer.close()
    w.close()
    return n / dt, syncs / n, n / max(batches, 1)


def many_writers_threads(
    dir_path: str, seconds: float, data: bytes, writers: int
) -> tuple[float, float]:
    w = new_wal(dir_path, "many-threads")
    w.save(HardState(term=1, vote=1), [])
    base = w.sync_count
    order = threading.Lock()
    counter = [0]
    totals = []
    start = threading.Barrier(writers + 1)

    def client(deadline_box: list) -> None:
        start.wait()
        deadline = deadline_box[0]
        done = 0
        while time.perf_counter() < deadline:
            with order:  # indexes must reach the file in order; the fsync happens outside
                counter[0] += 1
                seq, need, _ = w.append(
                    [(None, None, [Entry(term=1, index=counter[0], data=data)], None)]
                )
            w.sync_upto(seq)
            done += 1
        totals.append(done)

    box = [0.0]
    threads = [threading.Thread(target=client, args=(box,)) for _ in range(writers)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    box[0] = t0 + seconds
    start.wait()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    n = sum(totals)
    syncs = w.sync_count - base
    w.close()
    return n / dt, syncs / n


def build_replay_wal(dir_path: str, megabytes: int, data: bytes) -> tuple[str, int, int]:
    path = os.path.join(dir_path, "replay")
    w = wal.create(path, b"bench", sync_policy="never")
    w.save(HardState(term=1, vote=1), [])
    target = megabytes * 1024 * 1024
    per_save = 2000
    index = 0
    while index * FRAME_BYTES < target:
        w.save(None, [Entry(term=1, index=index + k + 1, data=data) for k in range(per_save)])
        index += per_save
    w.save(HardState(term=1, vote=1, commit=index), [])
    w.close()
    names = sorted(n for n in os.listdir(path) if n.endswith(".wal"))
    size = sum(os.path.getsize(os.path.join(path, n)) for n in names[:-1])
    with open(os.path.join(path, names[-1]), "rb") as f:  # the tail is preallocated:
        tail = f.read().rstrip(b"\0")  # count its data, not its zeros
    size += len(tail) + (-len(tail) % 8)
    return path, index, size


def replay(path: str, cold: bool) -> tuple[float, float, int]:
    os.sync()
    if cold:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    t0, c0 = time.perf_counter(), time.process_time()
    w = wal.open(path, prepare_ahead=False)
    _, _, ents = w.read_all()
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    n = len(ents)
    del ents
    w.close()
    return dt, dc, n


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def append_benchmarks(root: str, args, data: bytes) -> None:
    mb = len(data) / 1e6
    raw_bench, one = RawSync(root), OneWriter(root, data)
    raw, rate = interleaved(raw_bench, one, 2 * args.seconds)
    spe = one.close()
    raw_bench.close()
    print(
        f"raw fdatasync (pwrite {FRAME_BYTES} B + fdatasync):  {raw:9,.0f} /s"
        f"   ({1e6 / raw:.0f} us each; interleaved with the next line)"
    )
    print(
        f"1 writer, WAL.save, always:              {rate:9,.0f} entries/s "
        f"{rate * mb:6.2f} MB/s  fsyncs/entry {spe:.2f}  = {rate / raw:4.0%} of raw"
        f"  [target >= 80%: {verdict(rate >= 0.8 * raw)}]"
    )
    rate, spe = one_writer_group(root, args.seconds, data)
    print(
        f"1 writer, GroupCommitWriter, always:     {rate:9,.0f} entries/s "
        f"{rate * mb:6.2f} MB/s  fsyncs/entry {spe:.2f}  (not interleaved)"
    )

    rate, spe, per_batch = many_writers_asyncio(root, args.seconds, data, args.writers)
    print(
        f"{args.writers} asyncio writers, GroupCommitWriter: {rate:9,.0f} entries/s "
        f"{rate * mb:6.2f} MB/s  fsyncs/entry {spe:.3f}  ({per_batch:.0f} per batch)"
        f"  [target >= 50,000/s: {verdict(rate >= 50_000)}]"
    )
    try:
        rate, spe, per_batch = many_writers_asyncio(
            root, args.seconds, data, args.writers, use_uvloop=True
        )
        print(
            f"  same on uvloop:                    {rate:9,.0f} entries/s "
            f"{rate * mb:6.2f} MB/s  fsyncs/entry {spe:.3f}  ({per_batch:.0f} per batch)"
        )
    except ImportError:
        pass
    rate, spe = many_writers_threads(root, args.seconds, data, args.writers)
    print(
        f"{args.writers} threads, append + sync_upto:     {rate:9,.0f} entries/s "
        f"{rate * mb:6.2f} MB/s  fsyncs/entry {spe:.3f}"
    )


def replay_benchmark(root: str, args, data: bytes) -> None:
    t0 = time.perf_counter()
    path, n, size = build_replay_wal(root, args.replay_mb, data)
    print(
        f"replay WAL: {size / 1e6:,.0f} MB of data, {n:,} entries, "
        f"{len(os.listdir(path))} files (built in {time.perf_counter() - t0:.0f} s)"
    )
    dt, dc, got = replay(path, args.cold)
    assert got == n, (got, n)
    print(
        f"replay (open + read_all, {'cold' if args.cold else 'warm'} cache):  "
        f"{size / 1e6 / dt:9,.0f} MB/s  {n / dt:,.0f} entries/s  {dt:.2f} s"
        f"  [target >= 100 MB/s: {verdict(size / 1e6 / dt >= 100)}]"
    )
    print(
        f"  its CPU time: {dc:.2f} s = {size / 1e6 / dc:,.0f} MB/s of CPU (what the wall "
        f"time would be on an otherwise idle core)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dir",
        default=None,
        help="where to create the test files (the disk "
        "measured); default: a temp dir under $TMPDIR",
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="duration of each append run")
    ap.add_argument("--writers", type=int, default=64)
    ap.add_argument("--entry-bytes", type=int, default=256)
    ap.add_argument("--replay-mb", type=int, default=1024, help="size of the replay WAL")
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--skip-appends", action="store_true", help="only the replay part")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before replay")
    args = ap.parse_args(argv)

    from wal.crc import IMPLEMENTATION

    root = tempfile.mkdtemp(prefix="raftkv-wal-bench-", dir=args.dir)
    data = os.urandom(args.entry_bytes)
    try:
        print(
            f"dir: {root} ({fs_of(os.path.realpath(root))}), {os.cpu_count()} cpus, "
            f"python {sys.version.split()[0]}, entries of {args.entry_bytes} bytes, "
            f"CRC-32C by {IMPLEMENTATION}"
        )
        if not args.skip_appends:
            append_benchmarks(root, args, data)
        if not args.skip_replay:
            replay_benchmark(root, args, data)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
