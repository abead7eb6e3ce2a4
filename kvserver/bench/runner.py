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

How a request travels is the ``Transport``'s business, the loop above is the same for both:
``HttpTransport`` (pipelined HTTP/1.1; a request unanswered after ``--timeout`` fails its
whole connection, which is reopened) and, with ``--protocol grpc``, ``GrpcTransport``
(``kvserver.bench.grpc_client``: one gRPC channel per connection, calls multiplexed on it,
``--timeout`` as each call's deadline) or, with ``--protocol grpc-lean``,
``LeanGrpcTransport`` (``kvserver.bench.h2_client``: the same calls, framed by hand).

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
from typing import Protocol

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


class Transport(Protocol):
    """How one process's requests travel (``HttpTransport`` here, ``GrpcTransport`` in
    ``kvserver.bench.grpc_client``); the client loop in ``run_share`` is the same for both."""

    async def connect(self) -> None:
        """Open every connection (not measured); ``BenchError`` when one cannot be opened."""

    async def send(self, ci: int, seq: int) -> tuple[str, float | None, str | None]:
        """Client ``ci``'s request number ``seq``: its kind, and its latency in seconds when
        it succeeded, else the error's text (the error distribution's key)."""
        ...

    def expire(self, now: float) -> None:
        """The watchdog's step: fail what has waited longer than ``--timeout``."""

    async def close(self) -> None: ...


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


class HttpTransport:
    """``--conns`` pipelining HTTP/1.1 connections; client ``i`` uses connection
    ``i % conns``. A request unanswered after ``--timeout`` fails its whole connection
    (answers come in order, so everything behind it is stuck too); it is reopened."""

    def __init__(self, opts: BenchOptions, share: Share, endpoints: list[str]) -> None:
        self.timeout_s = opts.timeout_s
        self.slots: list[_Slot] = []
        self.workloads: list[Workload] = []
        for j in range(share.conns):
            url = endpoints[(share.index + j * share.procs) % len(endpoints)]
            host, port = parse_endpoint(url)
            self.slots.append(_Slot(host, port, opts.ssl_for(url)))
            self.workloads.append(Workload(opts, f"{host}:{port}", share.index, share.procs))

    async def connect(self) -> None:
        try:
            await asyncio.gather(*(s.get() for s in self.slots))
        except OSError as exc:
            raise BenchError(f"cannot connect: {exc}") from None

    async def send(self, ci: int, seq: int) -> tuple[str, float | None, str | None]:
        j = ci % len(self.slots)
        req = self.workloads[j].next(seq)
        try:
            conn = await self.slots[j].get()
            started = time.monotonic()
            status, body = await conn.request(req.raw)
            if status in req.ok:
                return req.kind, time.monotonic() - started, None
            return req.kind, None, error_text(status, body)
        except (ConnectionError, OSError) as exc:
            return req.kind, None, f"connection: {exc}"

    def expire(self, now: float) -> None:
        for s in self.slots:
            if s.conn is not None and s.conn.oldest_age(now) > self.timeout_s:
                s.conn.abort(f"request timed out after {self.timeout_s:g} s")

    async def close(self) -> None:
        for s in self.slots:
            if s.conn is not None:
                s.conn.close()


def transport_for(opts: BenchOptions, share: Share, endpoints: list[str]) -> Transport:
    if opts.protocol == "grpc":
        # (imported here: an HTTP run never loads gRPC)
        from kvserver.bench.grpc_client import GrpcTransport

        return GrpcTransport(opts, share.index, share.procs, share.conns, endpoints)
    if opts.protocol == "grpc-lean":
        from kvserver.bench.h2_client import LeanGrpcTransport

        return LeanGrpcTransport(opts, share.index, share.procs, share.conns, endpoints)
    return HttpTransport(opts, share, endpoints)


async def run_share(
    opts: BenchOptions,
    share: Share,
    endpoints: list[str],
    progress=None,
    ready: Callable[[], None] | None = None,
) -> dict[str, Stats]:
    transport = transport_for(opts, share, endpoints)
    try:
        await transport.connect()
        if ready is not None:
            ready()  # (multi-process start line: blocks until every process has connected)
        return await _drive(opts, share, transport, progress)
    finally:
        await transport.close()


async def _drive(
    opts: BenchOptions, share: Share, transport: Transport, progress
) -> dict[str, Stats]:
    """The load loop: ``share.clients`` coroutines, each sending one request at a time."""
    by_kind: dict[str, Stats] = {}
    state = {"issued": 0, "done": 0}
    total, rate = share.total, share.rate
    monotonic = time.monotonic
    send = transport.send
    t0 = monotonic()
    deadline = t0 + opts.duration_s if opts.duration_s is not None else None
    last = [t0]

    def stats_for(kind: str) -> Stats:
        st = by_kind.get(kind)
        if st is None:
            st = by_kind[kind] = Stats(started=t0)
        return st

    async def client(ci: int) -> None:
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
            kind, latency, error = await send(ci, seq)
            last[0] = monotonic()
            st = stats_for(kind)
            if latency is not None:
                st.latencies.append(latency)
            else:
                st.error(error or "no answer")
            state["done"] += 1
            if progress is not None:
                progress[share.index] = state["done"]

    async def watchdog() -> None:
        while True:
            await asyncio.sleep(min(0.5, opts.timeout_s / 2))
            transport.expire(monotonic())

    dog = asyncio.ensure_future(watchdog())
    try:
        await asyncio.gather(*(client(i) for i in range(share.clients)))
    finally:
        dog.cancel()
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
