"""``raftkv bench`` against a real (in-process, three-member) raftkv cluster: counts, never
timings."""

from aiohttp import web

from kvserver.bench.result import BenchError, find_leader
from kvserver.bench.runner import run
from kvserver.bench.workloads import BenchOptions
from tests.support.bench_cli import put_200_through_the_cli


def test_put_total_200_through_the_cli(capsys, inproc_cluster):
    doc = put_200_through_the_cli(capsys, inproc_cluster)
    assert set(doc["percentiles_s"]) == {"10", "25", "50", "75", "90", "95", "99", "99.9"}


def test_every_workload_and_dialect_counts_its_requests(inproc_cluster):
    eps = inproc_cluster.endpoints
    leader = find_leader(eps)
    cases = [
        dict(op="range", dialect="v3", consistency="l"),
        dict(op="range", dialect="v3", consistency="s"),
        dict(op="range", dialect="rest"),  # missing keys: 404 is an answer
        dict(op="put", dialect="rest", sequential_keys=True),
        dict(op="txn-put", txn_ops=3, key_space_size=10),
        dict(op="mixed", read_ratio=0.5, key_space_size=10),
    ]
    for case in cases:
        opts = BenchOptions(**{"endpoints": eps, "clients": 4, "total": 60, **case}).validate()
        r = run(opts)
        assert (r.stats.count, r.stats.error_count) == (60, 0), (case, r.stats.errors)
    before = inproc_cluster.revision()
    r = run(
        BenchOptions(
            op="txn-put",
            endpoints=[leader],
            clients=2,
            total=10,
            txn_ops=3,
            key_space_size=10,
            target_leader=True,
        ).validate()
    )
    assert r.endpoints_used == [leader]
    assert inproc_cluster.revision() == before + 10  # one revision per txn


def test_rate_limits_the_number_of_requests_in_a_duration(inproc_cluster):
    r = run(
        BenchOptions(
            op="put", endpoints=inproc_cluster.endpoints, clients=4, duration_s=1.0, rate=50
        ).validate()
    )
    # slots are at t0 + i/50 for i < 50: never more (fewer only if the machine is so slow
    # that the clients fall behind the schedule, so no lower bound beyond "some")
    assert 0 < r.stats.count + r.stats.error_count <= 50
    assert r.stats.error_count == 0


def test_watch_latency_sees_every_put_on_every_watcher(inproc_cluster):
    r = run(
        BenchOptions(
            op="watch-latency", endpoints=inproc_cluster.endpoints, watchers=3, total=20, rate=200
        ).validate()
    )
    assert r.stats.error_count == 0, r.stats.errors
    assert r.stats.count == 20 * 3


def test_watch_latency_names_a_server_without_watch(tmp_path):
    """raftkv before the watch issue answered 501: the run stops with that answer."""
    import asyncio
    import threading

    from kvserver.localcluster.launcher import free_ports

    async def unimplemented(request):
        return web.json_response(
            {
                "error": "watch is not implemented",
                "code": 12,
                "message": "watch is not implemented",
            },
            status=501,
        )

    (port,) = free_ports(1)
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.add_routes([web.post("/v3/watch", unimplemented)])
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        opts = BenchOptions(
            op="watch-latency", endpoints=[f"http://127.0.0.1:{port}"], total=5
        ).validate()
        try:
            run(opts)
            raise AssertionError("expected BenchError")
        except BenchError as exc:
            assert "does not serve watch" in str(exc)
            assert "HTTP 501: watch is not implemented" in str(exc)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        loop.close()
