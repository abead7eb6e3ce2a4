"""Throughput of the client HTTP API over ``LocalKV`` (no raft): a measurement, not a test.

    .venv/bin/python -m tests.api.bench_api [--clients 64] [--seconds 5] [--path put|range]
                                            [--trivial] [--profile FILE]

Starts the server in a child process (uvloop when installed, access log off, as the node
runs it), drives it from this process with an aiohttp client at ``--clients`` concurrent
requests (256-byte values, 1000 keys), and prints requests/s and the server's CPU time per
request (from /proc: robust to other load on the machine, unlike requests/s).
``--trivial`` serves a fixed JSON body from a bare aiohttp handler instead: the ceiling any
Python HTTP server reaches with this load generator on this machine. ``--profile FILE``
runs the server under cProfile and prints the top functions by own time when it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time

from tests.support.procs import stop_process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(port: int, trivial: bool, profile: str | None) -> None:
    from aiohttp import web

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if trivial:
        body = b'{"header":{"revision":"2"}}'

        async def handler(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=body, content_type="application/json")

        app = web.Application()
        app.router.add_post("/v3/kv/put", handler)
        app.router.add_post("/v3/kv/range", handler)
    else:
        from kvserver.api.http import build_client_app
        from kvserver.server.metrics import Metrics
        from tests.api.fakes import LocalKV

        app = build_client_app(LocalKV(), Metrics())

    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)
    finally:
        if profiler is not None:
            import pstats

            profiler.disable()
            profiler.dump_stats(profile)  # type: ignore[arg-type]
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)  # type: ignore[arg-type]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(
    port: int, clients: int, seconds: float, path: str, server_pid: int
) -> tuple[int, float, float]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v3/kv/{path}"
    value = base64.b64encode(b"v" * 256).decode()
    bodies = [
        json.dumps(
            {
                "key": base64.b64encode(f"key{i:04d}".encode()).decode(),
                **({"value": value} if path == "put" else {}),
            }
        )
        for i in range(1000)
    ]
    done = 0
    errors = 0
    stop_at = 0.0

    async def worker(session: aiohttp.ClientSession, n: int) -> None:
        nonlocal done, errors
        i = n
        while time.monotonic() < stop_at:
            async with session.post(url, data=bodies[i % 1000]) as r:
                await r.read()
                if r.status == 200:
                    done += 1
                else:
                    errors += 1
            i += clients

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(200):  # wait for the server
            try:
                async with session.post(url, data=bodies[0]) as r:
                    await r.read()
                    break
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
        stop_at = time.monotonic() + 0.5  # warm up
        await asyncio.gather(*(worker(session, n) for n in range(clients)))
        done = 0
        cpu_before = _cpu_seconds(server_pid)
        start = time.monotonic()
        stop_at = start + seconds
        await asyncio.gather(*(worker(session, n) for n in range(clients)))
        elapsed = time.monotonic() - start
        cpu = _cpu_seconds(server_pid) - cpu_before
    if errors:
        print(f"errors: {errors}", file=sys.stderr)
    return done, elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--path", choices=("put", "range"), default="put")
    parser.add_argument("--trivial", action="store_true")
    parser.add_argument("--profile")
    parser.add_argument("--serve-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_port:
        serve(args.serve_port, args.trivial, args.profile)
        return
    port = _free_port()
    cmd = [sys.executable, "-m", "tests.api.bench_api", "--serve-port", str(port)]
    if args.trivial:
        cmd.append("--trivial")
    if args.profile:
        cmd += ["--profile", args.profile]
    server = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        done, elapsed, cpu = asyncio.run(
            load(port, args.clients, args.seconds, args.path, server.pid)
        )
        client_cpu = _cpu_seconds(os.getpid())
    finally:
        stop_process(server, 30)
    kind = "trivial aiohttp handler" if args.trivial else "raftkv API over LocalKV"
    print(
        f"{kind}: POST /v3/kv/{args.path}, {args.clients} clients: "
        f"{done / elapsed:,.0f} requests/s ({done} in {elapsed:.1f} s); "
        f"server CPU {cpu / max(done, 1) * 1e6:.0f} us/request "
        f"(load generator: {client_cpu:.1f} s CPU in total)"
    )


if __name__ == "__main__":
    main()
