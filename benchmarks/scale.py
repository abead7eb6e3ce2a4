"""raftkv vs etcd at scale: a million keys, paged scans, storms, restart and catch-up, one table.

    .venv/bin/python -m benchmarks.scale                      # 1,000,000 keys, both systems
    .venv/bin/python -m benchmarks.scale --keys 50000 --storm-seconds 5 --json /tmp/scale.json
    .venv/bin/python -m benchmarks.scale --systems raftkv --keys 2000 --storm-seconds 1
    .venv/bin/python -m benchmarks.scale --systems raftkv --phases snapshot-storm,restart

Each system (``benchmarks/systems.py``: raftkv's ``LocalCluster``, three Debian ``etcd``
processes; three members on loopback, default flags except ``--snapshot-count``) is measured
alone, one after the other, in one run, through etcd's v3 JSON gateway with one client
implementation for both: asyncio (uvloop when installed) over ``kvserver.bench.http``'s
persistent HTTP/1.1 connections, one connection per simulated client, one request in flight
on each. Every request, wait and process stop is bounded in time.

1. load: ``--keys`` keys ``scale/000000000``... with random ``--value-bytes`` values, written
   as txns of 128 puts, 16 txns in flight, to the leader → keys/s. Then VmRSS of every
   member (``/proc/PID/status``) and the disk usage of every member's data dir (like
   ``du``: allocated blocks, so preallocated WAL files count).
2. scans: the whole prefix read in pages of 1,000 and of 10,000 keys (linearizable ranges
   with ``limit``; the next page starts at the last key + ``\\x00``) → keys/s; one
   ``count_only`` range over the whole prefix, median of 5.
3. storms, ``--storm-seconds`` each, puts overwriting random loaded keys; for each, put
   latency p99/max and failed puts (HTTP error, connection lost, or no answer within 10 s),
   raft term changes (the highest ``raftTerm`` any member reports, before vs after, and
   polled every 0.5 s in between) and leader changes seen by that poll:
   a. read storm: 8 clients sending whole-prefix ranges with limit 1000 to the leader,
      1 client putting; also reads served.
   b. compaction under load: 16 clients putting; a third into the storm, a compaction to
      the current revision (``physical: false``) — how long it took to answer.
   c. writes crossing snapshots: 16 clients putting; the storm goes on past
      ``--storm-seconds`` (bounded) until every member has written a new snapshot file
      (so the SIGKILL that follows does not land in the middle of one).
      Both systems get the same ``--snapshot-count`` (default 10,000 here, not their
      100,000 default, so that snapshots happen at every size; the header says which).
4. restart-to-healthy: SIGKILL a follower, start it again (same data dir and flags): time
   until its ``GET /health`` answers 200 with ``"health": "true"``.
5. catch-up: stop a follower (SIGTERM), write ``--catchup-keys`` (20,000) new keys as single
   puts, 16 in flight, start it again: time until a serializable range on it returns
   ``header.revision`` >= the leader's. 20,000 raft entries are more than the 5,000 entries
   both keep after a snapshot, so with snapshot count 10,000 the leader has to send the
   follower a snapshot. (The new snapshot files in the follower's data dir are reported,
   whether received or its own.)

``--storm-repeats N`` runs each storm N times back to back. A storm's put max is one sample
and moves a lot from run to run on a machine this small (for both systems); with N > 1 the
table also has each storm's put max and their median, the figure to compare, while the
"put max" row stays the slowest put of all N (counts are summed, rates averaged).

``--phases`` picks which of 2-5 run (the load always does; the rows of the others show
"-"), e.g. ``--phases scan`` or ``--phases snapshot-storm,restart`` to measure one thing
again without the whole run; the phases keep the order above.

Prints progress to stderr, then the machine and versions and one table (rows =
measurements, columns = systems); ``--json`` writes everything, ``--out-md`` the table as
markdown. Not a test: numbers depend on the machine and on whatever else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.compare import _git_describe, format_markdown, format_text, machine  # noqa: E402
from benchmarks.systems import EtcdSystem, RaftkvSystem, System  # noqa: E402
from kvserver.bench.http import Connection, encode_request  # noqa: E402
from kvserver.bench.result import BenchError  # noqa: E402
from kvserver.bench.stats import Stats  # noqa: E402
from kvserver.bench.workloads import error_text, parse_endpoint  # noqa: E402

PREFIX = b"scale/"
PREFIX_END = b"scale0"  # "/" + 1: the end of the prefix range
TXN_OPS = 128  # etcd's default --max-txn-ops
LOAD_IN_FLIGHT = 16
READ_CLIENTS = 8
READ_LIMIT = 1000
STORM_PUTTERS = 16
SCAN_PAGES = (1000, 10000)
COUNT_REPEATS = 5
CATCHUP_IN_FLIGHT = 16
# what --phases can pick, in the order they run (the load always runs first)
PHASES = (
    "scan",
    "count",
    "read-storm",
    "compaction-storm",
    "snapshot-storm",
    "restart",
    "catch-up",
)

REQUEST_TIMEOUT_S = 60.0  # loads, scans, compaction: generous (1M keys on 2 cores)
PUT_TIMEOUT_S = 10.0  # a storm put unanswered this long counts as failed
STATUS_TIMEOUT_S = 2.0
POLL_INTERVAL_S = 0.5
RECOVERY_TIMEOUT_S = 900.0  # restart / catch-up of a member holding a million keys
READY_TIMEOUT_S = 120.0
PROGRESS_EVERY_S = 2.0


class ScaleError(RuntimeError):
    """A measurement could not be done (say why, and which system)."""


class MemberExited(ScaleError):
    """A member's process ended while a wait expected it to come up (waiting on is futile)."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def key(i: int) -> bytes:
    return PREFIX + b"%09d" % i


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- the client (one implementation for both systems) ------------------------------------


class Gateway:
    """One client of one member: a persistent HTTP/1.1 connection, one request at a time.
    A request unanswered within its timeout closes the connection (answers come in order,
    so nothing later on it could be trusted); the next request opens a new one."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.host, self.port = parse_endpoint(url)
        self.hostport = f"{self.host}:{self.port}"
        self.conn: Connection | None = None

    async def request(
        self, method: str, path: str, body: bytes = b"", timeout_s: float = REQUEST_TIMEOUT_S
    ) -> tuple[int, bytes]:
        if self.conn is None or self.conn.closed:
            self.conn = None
            self.conn = await asyncio.wait_for(Connection.open(self.host, self.port), timeout_s)
        conn = self.conn
        fut = conn.request(encode_request(method, path, self.hostport, body))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            conn.abort(f"no answer within {timeout_s:g} s")
            raise

    async def post(self, path: str, doc: dict, timeout_s: float = REQUEST_TIMEOUT_S) -> dict:
        status, body = await self.request("POST", path, json.dumps(doc).encode(), timeout_s)
        if status != 200:
            raise ScaleError(f"{self.url}{path}: {error_text(status, body)}")
        return json.loads(body)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def put_body(k: bytes, value_bytes: int) -> bytes:
    return json.dumps({"key": b64(k), "value": b64(os.urandom(value_bytes))}).encode()


def prefix_range(start: bytes = PREFIX, **extra: Any) -> dict:
    return {"key": b64(start), "range_end": b64(PREFIX_END), **extra}


async def status(url: str, timeout_s: float = STATUS_TIMEOUT_S) -> dict:
    gw = Gateway(url)
    try:
        return await gw.post("/v3/maintenance/status", {}, timeout_s)
    finally:
        gw.close()


async def find_leader(urls: Sequence[str], timeout_s: float = READY_TIMEOUT_S) -> str:
    """The URL of the member that says it leads (bounded poll)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        answers = await asyncio.gather(*(status(u) for u in urls), return_exceptions=True)
        for url, st in zip(urls, answers, strict=True):
            if isinstance(st, dict):
                me = str(st.get("header", {}).get("member_id", ""))
                if me and str(st.get("leader", "0")) == me:
                    return url
                last = f"{url}: leader {st.get('leader')}"
            else:
                last = f"{url}: {st!r}"
        await asyncio.sleep(0.1)
    raise ScaleError(f"no leader within {timeout_s:g} s ({last})")


async def bounded_poll(
    check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, interval_s: float = 0.05
) -> float:
    """Seconds until ``check()`` is true; ScaleError after ``timeout_s``."""
    t0 = time.monotonic()
    last: object = "never true"
    while time.monotonic() - t0 < timeout_s:
        try:
            if await check():
                return time.monotonic() - t0
            last = "not yet"
        except MemberExited:
            raise
        except (OSError, ValueError, ScaleError) as exc:
            last = exc
        await asyncio.sleep(interval_s)
    raise ScaleError(f"{what}: not within {timeout_s:g} s (last: {last!r:.200})")


# --- the machine side: memory, disk, snapshots -------------------------------------------


def vm_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise ScaleError(f"no VmRSS for pid {pid}")


def rss_parts_mib(pid: int) -> dict[str, float]:
    """VmRSS split as the kernel accounts it: anonymous memory (the heap), file-backed pages
    (mapped files: a snapshot kept mapped, etcd's bbolt file) and shared memory."""
    parts = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("RssAnon", "RssFile", "RssShmem"):
                parts[key] = int(line.split()[1]) / 1024
    return parts


def du_mib(path: str) -> float:
    """Allocated size of a directory tree (what ``du`` counts), MiB."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total / 2**20


def snap_files(data_dir: str) -> set[str]:
    """Snapshot files of a member (both keep them in ``<data-dir>/member/snap/*.snap``)."""
    try:
        return {
            n for n in os.listdir(os.path.join(data_dir, "member", "snap")) if n.endswith(".snap")
        }
    except OSError:
        return set()


def member_rss(system: System) -> list[float]:
    out = []
    for i in range(len(system.urls)):
        p = system.member_proc(i)
        out.append(vm_rss_mib(p.pid) if p is not None and p.poll() is None else 0.0)
    return out


# --- 1. load -----------------------------------------------------------------------------


async def load(leader: str, first: int, count: int, value_bytes: int, what: str) -> dict:
    """Keys ``first``..``first+count-1`` as txns of TXN_OPS puts, LOAD_IN_FLIGHT in flight."""
    batches = [(i, min(TXN_OPS, first + count - i)) for i in range(first, first + count, TXN_OPS)]
    done = {"keys": 0, "retries": 0}
    t0 = time.monotonic()

    async def worker() -> None:
        gw = Gateway(leader)
        try:
            while batches:
                start, n = batches.pop()
                ops = [
                    {"request_put": {"key": b64(key(j)), "value": b64(os.urandom(value_bytes))}}
                    for j in range(start, start + n)
                ]
                body = json.dumps({"success": ops}).encode()
                for attempt in range(5):
                    try:
                        st, answer = await gw.request("POST", "/v3/kv/txn", body)
                        if st == 200:
                            break
                        err = error_text(st, answer)
                    except OSError as exc:
                        err = repr(exc)
                    done["retries"] += 1
                    await asyncio.sleep(0.2 * (attempt + 1))
                else:
                    raise ScaleError(f"load txn at key {start} failed 5 times: {err}")
                done["keys"] += n
        finally:
            gw.close()

    async def progress() -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            dt = time.monotonic() - t0
            log(
                f"  {what}: {done['keys']:,}/{count:,} keys, {done['keys'] / dt:,.0f} keys/s, "
                f"{dt:.0f} s"
            )

    batches.reverse()  # pop() from the end: keys go in ascending order
    ticker = asyncio.ensure_future(progress())
    try:
        await asyncio.gather(*(worker() for _ in range(LOAD_IN_FLIGHT)))
    finally:
        ticker.cancel()
    elapsed = time.monotonic() - t0
    return {
        "keys": done["keys"],
        "seconds": elapsed,
        "keys_per_s": done["keys"] / elapsed,
        "retried_txns": done["retries"],
    }


# --- 2. scans ----------------------------------------------------------------------------


async def paged_scan(url: str, page: int) -> dict:
    gw = Gateway(url)
    start, keys, pages = PREFIX, 0, 0
    t0 = last_report = time.monotonic()
    try:
        while True:
            got = await gw.post("/v3/kv/range", prefix_range(start, limit=page))
            kvs = got.get("kvs", [])
            pages += 1
            keys += len(kvs)
            if not kvs or not got.get("more"):
                break
            start = base64.b64decode(kvs[-1]["key"]) + b"\x00"
            if time.monotonic() - last_report > PROGRESS_EVERY_S:
                last_report = time.monotonic()
                log(f"  scan page {page}: {keys:,} keys, {keys / (last_report - t0):,.0f} keys/s")
    finally:
        gw.close()
    elapsed = time.monotonic() - t0
    return {
        "page": page,
        "keys": keys,
        "pages": pages,
        "seconds": elapsed,
        "keys_per_s": keys / elapsed,
    }


async def count_only(url: str) -> dict:
    gw = Gateway(url)
    times, counts = [], []
    try:
        for _ in range(COUNT_REPEATS):
            t0 = time.monotonic()
            got = await gw.post("/v3/kv/range", prefix_range(count_only=True))
            times.append(time.monotonic() - t0)
            counts.append(int(got.get("count", 0)))
    finally:
        gw.close()
    return {"median_s": statistics.median(times), "seconds": times, "count": counts[-1]}


# --- 3. storms ---------------------------------------------------------------------------


class RaftWatch:
    """Polls every member's status every POLL_INTERVAL_S: the highest raft term and the
    leader as the members see it (changes counted), and status requests that failed."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.gws = [Gateway(u) for u in urls]
        self.max_term = 0
        self.leaders: list[str] = []  # each leader in the order first seen after another
        self.failed_polls = 0

    async def poll_once(self) -> None:
        answers = await asyncio.gather(
            *(g.post("/v3/maintenance/status", {}, STATUS_TIMEOUT_S) for g in self.gws),
            return_exceptions=True,
        )
        seen: Counter[str] = Counter()
        for st in answers:
            if not isinstance(st, dict):
                self.failed_polls += 1
                continue
            self.max_term = max(self.max_term, int(st.get("raftTerm", 0)))
            leader = str(st.get("leader", "0"))
            if leader != "0":
                seen[leader] += 1
        if seen:
            leader = seen.most_common(1)[0][0]
            if not self.leaders or self.leaders[-1] != leader:
                self.leaders.append(leader)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            await self.poll_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    stop.wait(), max(0.0, POLL_INTERVAL_S - (time.monotonic() - t0))
                )
        await self.poll_once()

    def close(self) -> None:
        for g in self.gws:
            g.close()


async def putter(url: str, keys: int, value_bytes: int, stats: Stats, stop: asyncio.Event) -> None:
    gw = Gateway(url)
    rng = random.Random()
    try:
        while not stop.is_set():
            body = put_body(key(rng.randrange(keys)), value_bytes)
            t0 = time.monotonic()
            try:
                st, answer = await gw.request("POST", "/v3/kv/put", body, PUT_TIMEOUT_S)
                if st == 200:
                    stats.record(time.monotonic() - t0)
                else:
                    stats.error(error_text(st, answer))
            except TimeoutError:
                stats.error(f"no answer within {PUT_TIMEOUT_S:g} s")
            except OSError as exc:
                stats.error(f"connection: {exc}")
                await asyncio.sleep(0.05)  # a member down: do not spin
    finally:
        gw.close()


async def reader(url: str, counts: Counter, stop: asyncio.Event) -> None:
    gw = Gateway(url)
    body = json.dumps(prefix_range(limit=READ_LIMIT)).encode()
    try:
        while not stop.is_set():
            try:
                st, _ = await gw.request("POST", "/v3/kv/range", body, REQUEST_TIMEOUT_S)
                counts["served" if st == 200 else f"HTTP {st}"] += 1
            except OSError as exc:
                counts[f"connection: {type(exc).__name__}"] += 1
                await asyncio.sleep(0.05)
    finally:
        gw.close()


async def storm(
    system: System,
    leader: str,
    args: argparse.Namespace,
    *,
    putters: int,
    readers: int = 0,
    action: Callable[[], Awaitable[dict]] | None = None,
    until: Callable[[], bool] | None = None,
    what: str,
) -> dict:
    """``putters`` put clients (and ``readers`` range clients) on the leader for
    ``--storm-seconds``; ``action`` runs a third of the way in; with ``until``, the storm
    goes on (at most 3x + 30 s) until ``until()`` is true."""
    stats = Stats()
    reads: Counter[str] = Counter()
    stop = asyncio.Event()
    watch = RaftWatch(system.urls)
    await watch.poll_once()
    term_before, leaders_before = watch.max_term, list(watch.leaders)
    stats.started = time.monotonic()
    tasks = [
        asyncio.ensure_future(putter(leader, args.keys, args.value_bytes, stats, stop))
        for _ in range(putters)
    ]
    tasks += [asyncio.ensure_future(reader(leader, reads, stop)) for _ in range(readers)]
    watcher = asyncio.ensure_future(watch.run(stop))
    action_result: dict = {}
    t0 = time.monotonic()
    try:
        if action is not None:
            await asyncio.sleep(args.storm_seconds / 3)
            action_result = await action()
        limit = args.storm_seconds * 3 + 30
        last_log = t0
        while True:
            now = time.monotonic()
            if now - t0 >= args.storm_seconds and (until is None or until()) or now - t0 >= limit:
                break
            if now - last_log >= 5:
                last_log = now
                log(f"  {what}: {now - t0:.0f} s, {stats.count:,} puts, {stats.error_count} failed")
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        done, pending = await asyncio.wait([*tasks, watcher], timeout=REQUEST_TIMEOUT_S + 5)
        for t in pending:
            t.cancel()
        watch.close()
    stats.finished = time.monotonic()
    for t in done:
        if t.exception() is not None:
            raise ScaleError(f"{what}: a client failed: {t.exception()!r}")
    s = stats.summary()
    out = {
        "seconds": stats.elapsed_s,
        "putters": putters,
        "puts": s.count,
        "puts_per_s": s.requests_per_s,
        "put_errors": s.errors,
        "put_error_kinds": s.error_counts,
        "put_p99_ms": s.percentiles.get(99.0, 0.0) * 1e3,
        "put_max_ms": (s.slowest_s or 0.0) * 1e3,
        "term_changes": watch.max_term - term_before,
        "leader_changes": max(0, len(watch.leaders) - max(1, len(leaders_before))),
        "status_polls_failed": watch.failed_polls,
        **action_result,
    }
    if readers:
        out["readers"] = readers
        out["reads_served"] = reads.pop("served", 0)
        out["reads_per_s"] = out["reads_served"] / out["seconds"]
        out["read_errors"] = dict(reads)
    return out


_SUMMED = ("puts", "put_errors", "term_changes", "leader_changes", "status_polls_failed")


def combine_storms(runs: list[dict]) -> dict:
    """One storm's results from ``runs`` of it: the first run's fields, with the counts
    summed (new snapshot files member by member), the rates and p99 averaged, the slowest
    put of all, and each run's slowest put with their median (the figure that compares two
    systems; one max is one sample)."""
    out = dict(runs[0])
    if len(runs) == 1:
        return out
    for k in _SUMMED:
        out[k] = sum(r[k] for r in runs)
    out["seconds"] = sum(r["seconds"] for r in runs)
    for k in ("puts_per_s", "put_p99_ms", "reads_per_s"):
        if k in out:
            out[k] = statistics.fmean(r[k] for r in runs)
    out["put_max_ms_runs"] = [r["put_max_ms"] for r in runs]
    out["put_max_ms_median"] = statistics.median(out["put_max_ms_runs"])
    out["put_max_ms"] = max(out["put_max_ms_runs"])
    out["runs"] = len(runs)
    if "new_snapshot_files" in out:  # per member, over all the runs
        out["new_snapshot_files"] = [
            sum(files) for files in zip(*(r["new_snapshot_files"] for r in runs), strict=True)
        ]
    return out


async def repeated_storm(
    system: System,
    args: argparse.Namespace,
    banner: str,
    one: Callable[[str], Awaitable[dict]],
) -> dict:
    """``one(leader)``, a storm on the leader of the moment, ``--storm-repeats`` times,
    combined (``combine_storms``)."""
    runs = []
    for _ in range(args.storm_repeats):
        leader = await find_leader(system.urls)
        log(f"  {banner}")
        runs.append(await one(leader))
    return combine_storms(runs)


def compaction_action(leader: str) -> Callable[[], Awaitable[dict]]:
    async def compact() -> dict:
        gw = Gateway(leader)
        try:
            rev = int((await gw.post("/v3/maintenance/status", {}))["header"]["revision"])
            t0 = time.monotonic()
            await gw.post(
                "/v3/kv/compaction", {"revision": rev, "physical": False}, REQUEST_TIMEOUT_S * 5
            )
            dt = time.monotonic() - t0
        finally:
            gw.close()
        log(f"  compaction to revision {rev:,} answered in {dt:.3f} s")
        return {"compaction_s": dt, "compacted_revision": rev}

    return compact


# --- 4. restart, 5. catch-up -------------------------------------------------------------


async def a_follower(system: System) -> int:
    leader = await find_leader(system.urls)
    return next(i for i, u in enumerate(system.urls) if u != leader)


async def wait_healthy(system: System, index: int) -> float:
    gw = Gateway(system.urls[index])

    async def healthy() -> bool:
        p = system.member_proc(index)
        if p is None or p.poll() is not None:
            raise MemberExited(f"{system.name} member {index} exited while starting")
        st, body = await gw.request("GET", "/health", b"", 2.0)
        return st == 200 and str(json.loads(body).get("health")) == "true"

    try:
        return await bounded_poll(healthy, RECOVERY_TIMEOUT_S, f"{system.urls[index]} healthy")
    finally:
        gw.close()


async def restart_to_healthy(system: System) -> dict:
    index = await a_follower(system)
    system.stop_member(index, signal.SIGKILL)
    t0 = time.monotonic()
    system.start_member(index)
    await wait_healthy(system, index)
    dt = time.monotonic() - t0
    log(f"  member {index} SIGKILLed and restarted: healthy after {dt:.2f} s")
    # every member healthy again before what follows
    for i in range(len(system.urls)):
        await wait_healthy(system, i)
    return {"member": index, "seconds": dt, "all_healthy_s": time.monotonic() - t0}


async def single_puts(leader: str, first: int, count: int, value_bytes: int) -> dict:
    todo = list(range(first + count - 1, first - 1, -1))
    stats = Stats(started=time.monotonic())

    async def worker() -> None:
        gw = Gateway(leader)
        try:
            while todo:
                i = todo.pop()
                for _attempt in range(5):
                    t0 = time.monotonic()
                    try:
                        st, answer = await gw.request(
                            "POST", "/v3/kv/put", put_body(key(i), value_bytes)
                        )
                    except OSError as exc:
                        stats.error(repr(exc))
                        await asyncio.sleep(0.2)
                        continue
                    if st == 200:
                        stats.record(time.monotonic() - t0)
                        break
                    stats.error(error_text(st, answer))
                else:
                    raise ScaleError(f"put of key {i} failed 5 times: {stats.errors}")
        finally:
            gw.close()

    await asyncio.gather(*(worker() for _ in range(CATCHUP_IN_FLIGHT)))
    stats.finished = time.monotonic()
    s = stats.summary()
    return {"puts": s.count, "puts_per_s": s.requests_per_s, "put_errors": s.errors}


async def catch_up(system: System, args: argparse.Namespace) -> dict:
    index = await a_follower(system)
    url = system.urls[index]
    snaps_before = snap_files(system.data_dirs()[index])
    system.stop_member(index, signal.SIGTERM)
    leader = await find_leader([u for i, u in enumerate(system.urls) if i != index])
    log(f"  member {index} stopped; writing {args.catchup_keys:,} new keys (single puts)")
    written = await single_puts(leader, args.keys, args.catchup_keys, args.value_bytes)
    target = int((await status(leader, REQUEST_TIMEOUT_S))["header"]["revision"])
    gw = Gateway(url)

    async def caught_up() -> bool:
        p = system.member_proc(index)
        if p is None or p.poll() is not None:
            raise MemberExited(f"{system.name} member {index} exited while catching up")
        got = await gw.post("/v3/kv/range", {"key": b64(key(0)), "serializable": True}, 2.0)
        return int(got["header"]["revision"]) >= target

    t0 = time.monotonic()
    system.start_member(index)
    try:
        await bounded_poll(caught_up, RECOVERY_TIMEOUT_S, f"{url} at revision {target}")
    finally:
        gw.close()
    dt = time.monotonic() - t0
    new_snaps = len(snap_files(system.data_dirs()[index]) - snaps_before)
    log(f"  member {index} restarted: at revision {target:,} after {dt:.2f} s")
    return {
        "member": index,
        "seconds": dt,
        "target_revision": target,
        "new_keys": written,
        "follower_new_snapshot_files": new_snaps,
    }


# --- one system --------------------------------------------------------------------------


def make_system(name: str, root: str, snapshot_count: int) -> System:
    flags = ["--snapshot-count", str(snapshot_count)]
    if name == "raftkv":
        return RaftkvSystem(root, extra_args=flags)
    return EtcdSystem(root, extra_args=flags)


async def measure_running(system: System, args: argparse.Namespace) -> dict:
    res: dict = {}
    leader = await find_leader(system.urls)
    log(f"{system.name}: leader {leader}; loading {args.keys:,} keys")
    res["load"] = await load(leader, 0, args.keys, args.value_bytes, f"{system.name} load")
    res["load"]["rss_mib"] = member_rss(system)
    res["load"]["data_dir_mib"] = [du_mib(d) for d in system.data_dirs()]
    log(
        f"  loaded at {res['load']['keys_per_s']:,.0f} keys/s; RSS MiB "
        + "/".join(f"{x:.0f}" for x in res["load"]["rss_mib"])
    )
    phases = args.phase_set
    if "scan" in phases:
        res["scan"] = {}
        for page in SCAN_PAGES:
            r = res["scan"][str(page)] = await paged_scan(leader, page)
            log(f"  scan, pages of {page}: {r['keys']:,} keys at {r['keys_per_s']:,.0f} keys/s")
    if "count" in phases:
        res["count_only"] = await count_only(leader)
        log(f"  count_only: {res['count_only']['median_s'] * 1e3:.1f} ms (median)")

    if "read-storm" in phases:
        res["read_storm"] = await repeated_storm(
            system,
            args,
            f"read storm ({READ_CLIENTS} readers, 1 putter)",
            lambda leader: storm(
                system, leader, args, putters=1, readers=READ_CLIENTS, what="read storm"
            ),
        )
    if "compaction-storm" in phases:
        res["compaction_storm"] = await repeated_storm(
            system,
            args,
            f"compaction storm ({STORM_PUTTERS} putters)",
            lambda leader: storm(
                system,
                leader,
                args,
                putters=STORM_PUTTERS,
                action=compaction_action(leader),
                what="compaction storm",
            ),
        )
    if "snapshot-storm" in phases:

        async def snapshot_storm(leader: str) -> dict:
            before = [snap_files(d) for d in system.data_dirs()]

            def new_snapshots() -> list[int]:
                dirs = system.data_dirs()
                return [len(snap_files(d) - b) for d, b in zip(dirs, before, strict=True)]

            run = await storm(
                system,
                leader,
                args,
                putters=STORM_PUTTERS,
                until=lambda: min(new_snapshots()) > 0,
                what="snapshot storm",
            )
            run["new_snapshot_files"] = new_snapshots()  # per member
            return run

        res["snapshot_storm"] = await repeated_storm(
            system,
            args,
            f"snapshot storm ({STORM_PUTTERS} putters, until every member wrote a snapshot)",
            snapshot_storm,
        )

    if "restart" in phases:
        log("  restart-to-healthy")
        res["restart"] = await restart_to_healthy(system)
    if "catch-up" in phases:
        log("  catch-up")
        res["catch_up"] = await catch_up(system, args)
    res["rss_end_mib"] = member_rss(system)
    res["rss_end_parts_mib"] = [
        rss_parts_mib(p.pid) if p is not None and p.poll() is None else {}
        for p in (system.member_proc(i) for i in range(len(system.urls)))
    ]
    log(
        "  RSS at the end, anonymous/file MiB: "
        + ", ".join(
            f"{d.get('RssAnon', 0):.0f}/{d.get('RssFile', 0):.0f}" for d in res["rss_end_parts_mib"]
        )
    )
    return res


def measure(name: str, args: argparse.Namespace, root: str) -> dict:
    system = make_system(name, root, args.snapshot_count)
    try:
        system.start()
        system.wait_ready(READY_TIMEOUT_S)
        cpu0, t0 = time.process_time(), time.monotonic()
        res = run_loop(measure_running(system, args))
        # is the one client process a bottleneck? (its CPU over the whole measurement)
        res["client_cpu_share"] = (time.process_time() - cpu0) / (time.monotonic() - t0)
        res["wall_s"] = time.monotonic() - t0
        return res
    finally:
        system.stop()


def run_loop(coro: Awaitable[dict]) -> dict:
    try:
        import uvloop  # the client must not be the bottleneck
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


# --- the table ---------------------------------------------------------------------------


def _f(fmt: str) -> Callable[[Any], str]:
    return lambda x: "-" if x is None else format(x, fmt)


def _list(fmt: str) -> Callable[[Any], str]:
    return lambda xs: "-" if not xs else "/".join(format(x, fmt) for x in xs)


def _get(r: dict, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(r, dict):
            return None
        r = r.get(part)  # type: ignore[assignment]
    return r


Spec = tuple[str, str, Callable[[Any], str]]  # (label, path in one system's results, format)


def _storm_rows(
    label: str, k: str, clients: str, first: list[Spec], repeats: int = 1
) -> list[Spec]:
    each: list[Spec] = [
        (f"{label}: put max of each storm, ms", f"{k}.put_max_ms_runs", _list(",.1f")),
        (f"{label}: median of those, ms", f"{k}.put_max_ms_median", _f(",.1f")),
    ]
    return [
        *first,
        (f"{label}: puts/s ({clients})", f"{k}.puts_per_s", _f(",.0f")),
        (f"{label}: put p99, ms", f"{k}.put_p99_ms", _f(",.1f")),
        (f"{label}: put max, ms", f"{k}.put_max_ms", _f(",.1f")),
        *(each if repeats > 1 else []),
        (f"{label}: put errors", f"{k}.put_errors", _f("d")),
        (f"{label}: raft term changes", f"{k}.term_changes", _f("d")),
        (f"{label}: leader changes seen", f"{k}.leader_changes", _f("d")),
        (f"{label}: status polls failed", f"{k}.status_polls_failed", _f("d")),
    ]


def row_specs(args: argparse.Namespace) -> list[Spec]:
    """Every row of the table."""
    many = f"{STORM_PUTTERS} clients"
    return [
        (
            f"load {args.keys:,} keys (txn of {TXN_OPS}, {LOAD_IN_FLIGHT} in flight), keys/s",
            "load.keys_per_s",
            _f(",.0f"),
        ),
        ("load time, s", "load.seconds", _f(".1f")),
        ("RSS per member after load, MiB", "load.rss_mib", _list(".0f")),
        ("data dir per member after load, MiB", "load.data_dir_mib", _list(".0f")),
        ("scan, pages of 1,000, keys/s", "scan.1000.keys_per_s", _f(",.0f")),
        ("scan, pages of 10,000, keys/s", "scan.10000.keys_per_s", _f(",.0f")),
        (
            "count_only of the prefix, ms (median of 5)",
            "count_only.median_s",
            lambda x: _f(",.1f")(x and x * 1e3),
        ),
        *_storm_rows(
            "read storm",
            "read_storm",
            "1 client",
            [
                (
                    f"read storm: reads/s ({READ_CLIENTS} clients, limit {READ_LIMIT})",
                    "read_storm.reads_per_s",
                    _f(",.1f"),
                )
            ],
            args.storm_repeats,
        ),
        *_storm_rows(
            "compaction storm",
            "compaction_storm",
            many,
            [
                (
                    "compaction storm: compaction answered in, s",
                    "compaction_storm.compaction_s",
                    _f(".3f"),
                )
            ],
            args.storm_repeats,
        ),
        *_storm_rows(
            "snapshot storm",
            "snapshot_storm",
            many,
            [
                (
                    "snapshot storm: seconds (runs until every member snapshotted)",
                    "snapshot_storm.seconds",
                    _f(".1f"),
                ),
                (
                    "snapshot storm: new snapshot files per member",
                    "snapshot_storm.new_snapshot_files",
                    _list("d"),
                ),
            ],
            args.storm_repeats,
        ),
        ("restart (SIGKILL follower) to /health 200, s", "restart.seconds", _f(".2f")),
        (f"catch-up after {args.catchup_keys:,} puts, s", "catch_up.seconds", _f(".2f")),
        (
            "catch-up: new snapshot files on the follower",
            "catch_up.follower_new_snapshot_files",
            _f("d"),
        ),
        ("RSS per member at the end, MiB", "rss_end_mib", _list(".0f")),
        ("whole measurement, s", "wall_s", _f(".0f")),
        (
            "client process CPU, % of one core (average)",
            "client_cpu_share",
            lambda x: _f(".0f")(x and x * 100),
        ),
    ]


def table(results: dict, systems: list[str], args: argparse.Namespace) -> list[list[str]]:
    rows = [["measurement", *systems]]
    for label, path, fmt in row_specs(args):
        rows.append([label, *(fmt(_get(results.get(s, {}), path)) for s in systems)])
    return rows


# --- main --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=256)
    ap.add_argument("--systems", default="raftkv,etcd")
    ap.add_argument("--storm-seconds", type=float, default=15.0)
    ap.add_argument(
        "--snapshot-count",
        type=int,
        default=10_000,
        help="--snapshot-count given to both systems (their default: 100,000)",
    )
    ap.add_argument("--catchup-keys", type=int, default=20_000)
    ap.add_argument(
        "--storm-repeats",
        type=int,
        default=1,
        help="run each storm this many times (the table adds each one's put max and the median)",
    )
    ap.add_argument("--json", metavar="PATH", help="write options, machine and results here")
    ap.add_argument("--out-md", metavar="PATH", help="write the table as markdown here")
    ap.add_argument("--keep", metavar="DIR", help="keep data dirs and logs in DIR")
    ap.add_argument(
        "--phases",
        default=",".join(PHASES),
        help="which measurements follow the load, comma-separated (default: all): "
        + ", ".join(PHASES),
    )
    args = ap.parse_args(argv)
    names = [s for s in args.systems.split(",") if s]
    unknown = set(names) - {"raftkv", "etcd"}
    if unknown or not names:
        ap.error(f"--systems: raftkv and/or etcd, not {sorted(unknown)}")
    if (
        args.keys < 1
        or args.value_bytes < 1
        or args.storm_seconds <= 0
        or args.catchup_keys < 1
        or args.storm_repeats < 1
    ):
        ap.error(
            "--keys, --value-bytes, --catchup-keys, --storm-seconds and --storm-repeats "
            "must be positive"
        )
    args.system_list = names
    args.phase_set = {p for p in args.phases.split(",") if p}
    if args.phase_set - set(PHASES):
        ap.error(
            f"--phases: some of {', '.join(PHASES)}, not {sorted(args.phase_set - set(PHASES))}"
        )
    return args


def header(mach: dict, args: argparse.Namespace) -> list[str]:
    return [
        f"machine: {mach.get('nproc')} cores ({mach.get('cpu')}), {mach.get('memory_gib')} GiB, "
        f"kernel {mach.get('kernel')}, fdatasync {mach.get('fdatasync_ms', 0):.2f} ms",
        f"versions: raftkv {mach.get('raftkv_commit')} (Python {mach.get('python')}), "
        f"{mach.get('etcd')}",
        f"{args.keys:,} keys of {args.value_bytes} B; storms {args.storm_seconds:g} s"
        + (f", each run {args.storm_repeats} times" if args.storm_repeats > 1 else "")
        + f"; --snapshot-count {args.snapshot_count:,} for both systems (their default: "
        f"100,000); catch-up {args.catchup_keys:,} puts",
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "etcd" in args.system_list and shutil.which("etcd") is None:
        print(
            "scale: etcd not found on PATH (Debian: apt-get install etcd-server); "
            "measure raftkv alone with --systems raftkv",
            file=sys.stderr,
        )
        return 2
    mach = machine()
    mach["raftkv_commit"] = _git_describe()
    for line in header(mach, args):
        log(line)
    results: dict = {}
    failures: dict[str, str] = {}
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_before = os.getloadavg()[0]
    for name in args.system_list:
        root = args.keep or tempfile.mkdtemp(prefix=f"scale-{name}-")
        try:
            results[name] = measure(name, args, root)
        except Exception as exc:  # say what failed, then measure the next system
            failures[name] = f"{type(exc).__name__}: {exc}"
            expected = isinstance(exc, ScaleError | BenchError | OSError)
            log(f"{name}: FAILED: {failures[name]}" if expected else traceback.format_exc())
            log(f"{name}: data dirs and logs kept in {root}")
        else:
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    rows = table(results, args.system_list, args)
    print("\n".join(header(mach, args)))
    print(format_text(rows))
    for name, why in failures.items():
        print(f"{name} FAILED: {why}")
    if args.json:
        doc = {
            "started": started,
            "load_average_before": load_before,
            "argv": sys.argv[1:] if argv is None else argv,
            "options": {k: v for k, v in vars(args).items()},
            "machine": mach,
            "results": results,
            "failures": failures,
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write("\n".join(header(mach, args)) + "\n\n" + format_markdown(rows) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
