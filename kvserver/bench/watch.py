"""``watch-latency``: how long after a put do watchers see its event?

``--watchers`` watch streams (``POST /v3/watch``, etcd's gateway: one ``create_request`` per
HTTP request, answers are newline-delimited ``{"result": {...}}`` objects) watch one key; one
putter puts that key ``--total`` times (or for ``--duration``) at ``--rate`` puts/s (default
100/s), each value starting with the put's send time (``time.monotonic()``, 20 bytes). Every
event a watcher receives gives one sample: receive time minus send time. So the histogram
has up to ``puts x watchers`` samples; events a watcher never got (within ``--timeout`` after
the last put) are counted as the error ``event not received``, failed puts by their error.

The streams are opened, and each confirmed (``created``), before the first put. A server that
does not serve watch (raftkv before the watch issue answers HTTP 501) stops the run with a
``BenchError`` naming the endpoint and its answer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

from kvserver.bench.http import Connection
from kvserver.bench.result import BenchError, BenchResult, resolve_endpoints
from kvserver.bench.stats import Stats
from kvserver.bench.workloads import STAMP_BYTES, BenchOptions, Workload, error_text, parse_endpoint

DEFAULT_RATE = 100.0


def run_watch_latency(opts: BenchOptions, progress=None) -> BenchResult:
    endpoints = resolve_endpoints(opts)
    try:
        import uvloop

        stats = uvloop.run(_run(opts, endpoints, progress))
    except ImportError:
        stats = asyncio.run(_run(opts, endpoints, progress))
    return BenchResult(opts, {"watch": stats}, endpoints)


async def _run(opts: BenchOptions, endpoints: list[str], progress) -> Stats:  # noqa: C901 - one run; its watcher/put closures count here
    import aiohttp

    wl = Workload(opts, "", 0, 1)
    key = wl.key(0)
    stats = Stats()
    rate = opts.rate or DEFAULT_RATE
    received = [0] * opts.watchers
    puts_ok = 0
    monotonic = time.monotonic

    tls = next((c for c in map(opts.ssl_for, endpoints) if c is not None), None)
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None),
        connector=aiohttp.TCPConnector(ssl=True if tls is None else tls),
    ) as session:
        streams: list[aiohttp.ClientResponse] = []
        for w in range(opts.watchers):
            url = endpoints[w % len(endpoints)]
            resp = await session.post(
                url + "/v3/watch",
                json={"create_request": {"key": base64.b64encode(key).decode()}},
                headers={"Authorization": opts.token} if opts.token else None,
            )
            if resp.status != 200:
                body = await resp.read()
                resp.release()
                for r in streams:
                    r.close()
                raise BenchError(
                    f"{url} does not serve watch: POST /v3/watch answered "
                    f"{error_text(resp.status, body)}"
                )
            first = json.loads(await resp.content.readline() or b"{}")
            if not first.get("result", {}).get("created"):
                resp.close()
                raise BenchError(f"{url}: watch not created: {json.dumps(first)[:200]}")
            streams.append(resp)

        async def watcher(i: int, resp) -> None:
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                now = monotonic()
                msg = json.loads(line)
                if "error" in msg:
                    stats.error(f"watch stream: {json.dumps(msg['error'])[:100]}")
                    return
                for ev in msg.get("result", {}).get("events", ()):
                    value = base64.b64decode(ev.get("kv", {}).get("value", ""))
                    try:
                        sent = float(value[:STAMP_BYTES])
                    except ValueError:
                        continue  # a put of someone else
                    stats.latencies.append(now - sent)
                    received[i] += 1

        tasks = [asyncio.ensure_future(watcher(i, r)) for i, r in enumerate(streams)]

        host, port = parse_endpoint(endpoints[0])
        wl = Workload(opts, f"{host}:{port}", 0, 1)
        conn = await Connection.open(host, port, ssl=opts.ssl_for(endpoints[0]))
        pending: set[asyncio.Future] = set()
        t0 = stats.started = monotonic()
        deadline = t0 + opts.duration_s if opts.duration_s is not None else None

        async def put(seq: int) -> None:
            nonlocal puts_ok
            req = wl.stamped_put(monotonic())
            try:
                status, body = await conn.request(req.raw)
                if status == 200:
                    puts_ok += 1
                else:
                    stats.error("put: " + error_text(status, body))
            except ConnectionError as exc:
                stats.error(f"put: connection: {exc}")
            if progress is not None:
                progress[0] = seq + 1

        def more(seq: int) -> bool:
            if opts.total is not None:
                return seq < opts.total
            assert deadline is not None  # validate(): --duration when there is no --total
            return monotonic() < deadline

        seq = 0
        while more(seq):
            delay = t0 + seq / rate - monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            fut = asyncio.ensure_future(put(seq))
            pending.add(fut)
            fut.add_done_callback(pending.discard)
            seq += 1
        if pending:
            await asyncio.gather(*pending)
        # wait (bounded) until every watcher has seen every acknowledged put
        wait_until = monotonic() + opts.timeout_s
        while any(n < puts_ok for n in received) and monotonic() < wait_until:
            await asyncio.sleep(0.01)
        stats.finished = monotonic()
        conn.close()
        for t in tasks:
            t.cancel()
        for r in streams:
            r.close()
        missing = sum(max(puts_ok - n, 0) for n in received)
        if missing:
            stats.errors["event not received"] += missing
    return stats
