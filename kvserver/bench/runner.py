"""The load runner: client coroutines over persistent pipelined connections, in 1..N processes.

``run(opts, progress=None) -> BenchResult`` is the whole API. It resolves the endpoints
(``--target-leader``: only the leader, found through ``/v3/maintenance/status``), splits
clients, connections, the request total and the rate evenly over ``--procs`` processes
(``spawn``ed; with ``--procs 1`` everything runs in this process), and merges what they
measured exactly (``Stats.merge_all``: raw samples, not averaged percentiles).

In each process: the connections are opened first (connection setup is not measured), then
``clients`` coroutines each loop: take the next sequence number, wait for its slot when
``--rate`` is set (slot ``i`` starts at ``t0 + i / rate``), send one request on its
connection (client ``i`` uses connection ``i % conns``, connection ``j`` goes to endpoint
``j % len(endpoints)``), and record the latency or the error. A run ends after ``--total``
requests or when ``--duration`` is over (requests in flight then still finish and count).
A request unanswered after ``--timeout`` fails its whole connection (HTTP/1.1 answers in
order, so everything behind it is stuck too); the connection is reopened.

``progress`` (a shared array with one completed-request counter per process) is what the
CLI's progress bar reads.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvserver.bench.http import Connection
from kvserver.bench.result import BenchError, BenchResult, resolve_endpoints
from kvserver.bench.stats import Stats
from kvserver.bench.watch import run_watch_latency
from kvserver.bench.workloads import BenchOptions, Workload, error_text, parse_endpoint


@dataclass(frozen=True)
class Share:
    """One process's part of the run."""

    index: int
    procs: int
    clients: int
    conns: int
    total: int | None
    rate: float


def split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def shares(opts: BenchOptions) -> list[Share]:
    procs = opts.procs
    assert opts.conns is not None  # validate() defaults it to --clients
    clients, conns = split(opts.clients, procs), split(opts.conns, procs)
    totals = split(opts.total, procs) if opts.total is not None else [None] * procs
    return [
        Share(i, procs, clients[i], conns[i], totals[i], opts.rate / procs) for i in range(procs)
    ]


# --- one process -------------------------------------------------------------------------


class _Slot:
    """A connection that is reopened (once, by whoever notices first) after it fails."""

    def __init__(self, host: str, port: int, ssl=None) -> None:
        self.host, self.port, self.ssl = host, port, ssl
        self.conn: Connection | None = None
        self._opening: asyncio.Future[Connection] | None = None

    async def get(self) -> Connection:
        conn = self.conn
        if conn is not None and not conn.closed:
            return conn
        if self._opening is None:
            self._opening = asyncio.ensure_future(
                Connection.open(self.host, self.port, ssl=self.ssl)
            )
        opening = self._opening
        try:
            self.conn = conn = await asyncio.shield(opening)
        finally:
            if self._opening is opening and opening.done():
                self._opening = None
        return conn


async def run_share(  # noqa: C901 - the load loop; its client/watchdog closures count here
    opts: BenchOptions,
    share: Share,
    endpoints: list[str],
    progress=None,
    ready: Callable[[], None] | None = None,
) -> dict[str, Stats]:
    slots = []
    workloads = []
    for j in range(share.conns):
        url = endpoints[(share.index + j * share.procs) % len(endpoints)]
        host, port = parse_endpoint(url)
        slots.append(_Slot(host, port, opts.ssl_for(url)))
        workloads.append(Workload(opts, f"{host}:{port}", share.index, share.procs))
    try:
        await asyncio.gather(*(s.get() for s in slots))
    except OSError as exc:
        raise BenchError(f"cannot connect: {exc}") from None
    if ready is not None:
        ready()  # (multi-process start line: blocks until every process has connected)

    by_kind: dict[str, Stats] = {}
    state = {"issued": 0, "done": 0}
    total, rate = share.total, share.rate
    monotonic = time.monotonic
    t0 = monotonic()
    deadline = t0 + opts.duration_s if opts.duration_s is not None else None
    last = [t0]

    def stats_for(kind: str) -> Stats:
        st = by_kind.get(kind)
        if st is None:
            st = by_kind[kind] = Stats(started=t0)
        return st

    async def client(ci: int) -> None:
        slot = slots[ci % len(slots)]
        wl = workloads[ci % len(slots)]
        while True:
            seq = state["issued"]
            if total is not None:
                if seq >= total:
                    return
            else:
                assert deadline is not None  # validate(): --duration when there is no --total
                if monotonic() >= deadline:
                    return
            if rate:
                due = t0 + seq / rate
                if deadline is not None and due >= deadline:
                    return  # this request's slot is after the end of the run
                state["issued"] = seq + 1
                delay = due - monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            else:
                state["issued"] = seq + 1
            req = wl.next(seq)
            st = stats_for(req.kind)
            try:
                conn = await slot.get()
                started = monotonic()
                status, body = await conn.request(req.raw)
                now = monotonic()
                if status in req.ok:
                    st.latencies.append(now - started)
                else:
                    st.error(error_text(status, body))
                last[0] = now
            except (ConnectionError, OSError) as exc:
                st.error(f"connection: {exc}")
                last[0] = monotonic()
            state["done"] += 1
            if progress is not None:
                progress[share.index] = state["done"]

    async def watchdog() -> None:
        while True:
            await asyncio.sleep(min(0.5, opts.timeout_s / 2))
            now = monotonic()
            for s in slots:
                if s.conn is not None and s.conn.oldest_age(now) > opts.timeout_s:
                    s.conn.abort(f"request timed out after {opts.timeout_s:g} s")

    dog = asyncio.ensure_future(watchdog())
    try:
        await asyncio.gather(*(client(i) for i in range(share.clients)))
    finally:
        dog.cancel()
        for s in slots:
            if s.conn is not None:
                s.conn.close()
    for st in by_kind.values():
        st.finished = last[0]
    return by_kind


def _run_loop(coro):
    try:
        import uvloop  # the load generator must not be the bottleneck

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def _proc_main(
    opts: BenchOptions, share: Share, endpoints: list[str], progress, barrier, out
) -> None:
    try:

        def ready() -> None:
            barrier.wait(timeout=60)

        by_kind = _run_loop(run_share(opts, share, endpoints, progress, ready))
        out.put(("ok", {k: s.to_bytes() for k, s in by_kind.items()}))
    except BaseException as exc:  # report, never hang the parent
        barrier.abort()
        out.put(("error", str(exc) or type(exc).__name__))


# --- the whole run -----------------------------------------------------------------------


def run(opts: BenchOptions, progress=None) -> BenchResult:
    """Run ``opts`` (already validated) and return what was measured."""
    if opts.op == "watch-latency":
        return run_watch_latency(opts, progress)
    endpoints = resolve_endpoints(opts)
    parts = shares(opts)
    if opts.procs == 1:
        by_kind = _run_loop(run_share(opts, parts[0], endpoints, progress))
        return BenchResult(opts, by_kind, endpoints)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(opts.procs)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_proc_main, args=(opts, s, endpoints, progress, barrier, out), daemon=True
        )
        for s in parts
    ]
    for p in procs:
        p.start()
    results: list[dict[str, bytes]] = []
    errors: list[str] = []
    try:
        while len(results) + len(errors) < len(procs):
            # read before join (a child blocks until its result is taken), but notice a
            # child that died without one (killed, out of memory) instead of waiting forever
            try:
                kind, payload = out.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise BenchError(
                        f"load-generator process {dead[0].pid} died (exit code {dead[0].exitcode})"
                    ) from None
                continue
            (results if kind == "ok" else errors).append(payload)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if errors:
        raise BenchError(errors[0])
    parts_by_kind: dict[str, list[Stats]] = {}
    for part in results:
        for kind, data in part.items():
            parts_by_kind.setdefault(kind, []).append(Stats.from_bytes(data))
    return BenchResult(opts, {k: Stats.merge_all(v) for k, v in parts_by_kind.items()}, endpoints)


def new_progress(procs: int):
    """A per-process completed-request counter array the runner updates."""
    return mp.get_context("spawn").RawArray("q", procs)
