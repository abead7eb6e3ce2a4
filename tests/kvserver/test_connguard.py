"""Client-port deadlines and connection bound (kvserver.api.http.connguard).

Without the guard, connections trickling headers or holding half a body stay open for ever
(aiohttp has no header or body deadline, and no bound on connections). Here a small app runs
behind the guard with short limits, and raw sockets play the slow clients.
"""

import asyncio
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from aiohttp import web

from kvserver.api.http.common import LIMITS_KEY, ApiLimits
from kvserver.api.http.connguard import ConnectionGuard, ConnectionLimits, raise_nofile_limit
from kvserver.localcluster.launcher import free_ports
from tests.support.procs import stop_process
from tests.support.wait import wait_for

LIMITS = ConnectionLimits(
    max_connections=20, header_timeout_s=0.5, body_timeout_s=0.5, idle_timeout_s=1.0
)


async def _echo(request: web.Request) -> web.Response:
    return web.Response(body=await request.read())


async def _serve(guard: ConnectionGuard):
    app = web.Application(middlewares=[guard.middleware])
    app[LIMITS_KEY] = ApiLimits.for_max_request(1 << 20)
    app.router.add_post("/echo", _echo)
    runner = guard.runner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    (port,) = free_ports(1)
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def _closed(reader: asyncio.StreamReader, within_s: float) -> bytes:
    """Everything the server sends until it closes the connection (bounded wait)."""
    async with asyncio.timeout(within_s):
        return await reader.read()


async def test_trickled_headers_are_cut_off_and_connections_are_bounded():
    guard = ConnectionGuard(LIMITS)
    runner, port = await _serve(guard)
    try:
        conns = []
        for _ in range(50):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n")  # headers never finish
            conns.append((reader, writer))
        results = await asyncio.gather(*(_closed(r, 20) for r, _ in conns))
        assert all(r == b"" for r in results)  # closed without an answer
        assert guard.refused == 30 and guard.timed_out == 20
        assert guard.stats()["open"] == 0
        for _, w in conns:
            w.close()
    finally:
        await runner.cleanup()


async def test_half_a_body_gets_408_and_the_connection_closes():
    guard = ConnectionGuard(LIMITS)
    runner, port = await _serve(guard)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        answer = await _closed(reader, 20)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert guard.slow_bodies == 1
        writer.close()
    finally:
        await runner.cleanup()


async def test_prompt_requests_are_served_and_idle_keepalive_closes():
    guard = ConnectionGuard(LIMITS)
    runner, port = await _serve(guard)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for body in (b"one", b"two"):  # two requests on one kept-alive connection
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n" + body)
            async with asyncio.timeout(20):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200")
                assert await reader.readexactly(3) == body
        assert await _closed(reader, 20) == b""  # then idle: closed after idle_timeout_s
        assert guard.timed_out == 0 and guard.slow_bodies == 0
        writer.close()
    finally:
        await runner.cleanup()


def test_open_file_soft_limit_is_raised_to_the_hard_limit():
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        soft, hard = raise_nofile_limit()
        assert soft >= before[0]
        if hard != resource.RLIM_INFINITY:
            assert soft == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


@pytest.mark.slow
def test_a_member_cuts_off_1000_trickling_connections_and_keeps_serving(tmp_path):
    """The issue's scenario against ``raftkv serve``: 1,000 connections that send half a
    request line are all closed by the header deadline (10 s), and the member answers
    /health meanwhile and afterwards."""
    raise_nofile_limit()  # this test process holds 1,000 sockets too
    client, peer = free_ports(2)
    c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    log_path = tmp_path / "member.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvserver.cli",
                "serve",
                "--data-dir",
                str(tmp_path / "d"),
                "--listen-client-urls",
                c,
                "--advertise-client-urls",
                c,
                "--listen-peer-urls",
                p,
                "--initial-advertise-peer-urls",
                p,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    socks = []
    try:
        wait_for(lambda: _health(c) == 200, 60, "the member healthy", interval_s=0.1)
        for _ in range(1000):
            s = socket.create_connection(("127.0.0.1", client), timeout=10)
            s.sendall(b"POST /v3/kv/put HTTP/1.1\r\nHo")
            socks.append(s)
        assert _health(c) == 200  # serving while 1,000 slow clients hold connections
        deadline = time.monotonic() + 60  # 10 s deadline, generous margin under load
        for s in socks:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            assert s.recv(1024) == b"", "a trickling connection got an answer"
        assert _health(c) == 200
        assert "open-file limit" in log_path.read_text()
    finally:
        for s in socks:
            s.close()
        stop_process(proc, 20)


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0
