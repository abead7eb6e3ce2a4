"""The load generator's HTTP/1.1 connection: pipelined requests, answers matched in order."""

import asyncio

from aiohttp import web

from kvserver.bench.http import Connection, encode_request
from kvserver.localcluster.launcher import free_ports


async def serve(app):
    runner = web.AppRunner(app)
    await runner.setup()
    (port,) = free_ports(1)
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def test_pipelined_answers_come_back_in_order_with_both_framings():
    async def echo(request):
        n = int(request.match_info["n"])
        await asyncio.sleep((n % 3) * 0.001)
        return web.json_response({"n": n, "body": (await request.read()).decode()})

    async def chunked(request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b"ab", b"", b"cde" * 1000):
            if part:
                await resp.write(part)
        await resp.write_eof()
        return resp

    async def missing(request):
        return web.json_response({"error": "nope"}, status=404)

    app = web.Application()
    app.add_routes(
        [
            web.post("/echo/{n}", echo),
            web.get("/chunked", chunked),
            web.get("/missing", missing),
        ]
    )
    runner, port = await serve(app)
    try:
        conn = await Connection.open("127.0.0.1", port)
        host = f"127.0.0.1:{port}"
        futs = []
        for n in range(50):  # all written before any answer is read
            if n % 10 == 5:
                futs.append(conn.request(encode_request("GET", "/chunked", host)))
            elif n % 10 == 7:
                futs.append(conn.request(encode_request("GET", "/missing", host)))
            else:
                futs.append(
                    conn.request(encode_request("POST", f"/echo/{n}", host, f"body{n}".encode()))
                )
        assert conn.in_flight > 1  # really pipelined
        answers = await asyncio.gather(*futs)
        for n, (status, body) in enumerate(answers):
            if n % 10 == 5:
                assert (status, body) == (200, b"ab" + b"cde" * 1000)
            elif n % 10 == 7:
                assert status == 404
            else:
                assert status == 200 and body == (b'{"n": %d, "body": "body%d"}' % (n, n))
        conn.close()
    finally:
        await runner.cleanup()


async def test_a_lost_connection_fails_every_request_in_flight():
    hold = asyncio.Event()

    async def slow(request):
        await hold.wait()
        return web.Response(text="late")

    app = web.Application()
    app.add_routes([web.get("/slow", slow)])
    runner, port = await serve(app)
    try:
        conn = await Connection.open("127.0.0.1", port)
        futs = [conn.request(encode_request("GET", "/slow", "h")) for _ in range(3)]
        await asyncio.sleep(0.05)
        conn.abort("request timed out after 1 s")
        results = await asyncio.gather(*futs, return_exceptions=True)
        assert all(isinstance(r, ConnectionError) and "timed out" in str(r) for r in results)
        assert conn.closed
        late = conn.request(encode_request("GET", "/slow", "h"))
        assert isinstance(late.exception(), ConnectionError)
        hold.set()
    finally:
        await runner.cleanup()
